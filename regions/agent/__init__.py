"""The region agent: probes its replicas, reports health, pre-warms, runs the warm pool.

It builds on the kernel (controlplane/kernel) and the warm pool (regions/pool), never on
the gateway or the control plane's service (import-linter contracts)."""
