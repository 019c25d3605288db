"""gRPC for every process: channels and credentials (``tls``), the auth interceptor
(``auth``), reflection, the decode guard, and the health-report client agents and
gateways share (``health_report``)."""
