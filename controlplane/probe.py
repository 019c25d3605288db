"""The control plane's own vantage point: a grpc.health.v1 check of each region agent."""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.kernel.clock import Clock
from controlplane.kernel.config import Topology
from controlplane.kernel.model import Health, HealthReport, ObserverKind
from controlplane.kernel.rpc.tls import aio_channel
from controlplane.reports import PROBE_OBSERVER

log = logging.getLogger("tectonic.probe")
AGENT_SERVICE = "tectonic.v1.RegionAgent"


class AgentProber:
    def __init__(self, topology: Topology, clock: Clock) -> None:
        self.topology, self.clock = topology, clock
        # Health checks need no token, but a TLS agent takes only TLS (with our cert).
        self._channels = {r.name: aio_channel(r.agent, topology.security) for r in topology.regions}
        self._last: dict[str, Health] = {}

    async def check(self, region: str) -> tuple[Health, str]:
        stub = health_pb2_grpc.HealthStub(self._channels[region])
        timeout = max(0.2, self.topology.timing.probe_interval_s * 0.8)
        try:
            resp = await stub.Check(
                health_pb2.HealthCheckRequest(service=AGENT_SERVICE), timeout=timeout
            )
        except grpc.aio.AioRpcError as e:
            return Health.UNHEALTHY, f"agent unreachable: {e.code().name}"
        if resp.status == health_pb2.HealthCheckResponse.SERVING:
            return Health.HEALTHY, "agent SERVING"
        return (
            Health.UNHEALTHY,
            f"agent {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)}",
        )

    async def probe_once(self) -> list[HealthReport]:
        """One check of every agent at once: a report per region (the loop stores them
        through the leader's fence). A changed verdict is logged."""
        names = list(self.topology.names)
        results = await asyncio.gather(*(self.check(n) for n in names))
        now = self.clock.now()
        reports = []
        for name, (health, detail) in zip(names, results, strict=True):
            if self._last.get(name) is not health:
                log.info("probe %s: %s (%s)", name, health.value, detail)
                self._last[name] = health
            reports.append(
                HealthReport(
                    region=name,
                    observer=PROBE_OBSERVER,
                    kind=ObserverKind.PROBE,
                    health=health,
                    received_at=now,
                    detail=detail,
                )
            )
        return reports

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels.values()))
