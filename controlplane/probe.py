"""The control plane's own vantage point: a grpc.health.v1 check of each region agent."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.kernel.clock import Clock
from controlplane.kernel.config import Topology
from controlplane.kernel.model import Health, HealthReport, ObserverKind
from controlplane.kernel.rpc.tls import aio_channel
from controlplane.reports import PROBE_OBSERVER

log = logging.getLogger("tectonic.probe")
AGENT_SERVICE = "tectonic.v1.RegionAgent"
# Checks in flight at once. All 512 at once stalled the event loop (and the tick beside
# it) for 40-60 ms a sweep, 128 for under 10 ms, in about the same sweep time (issue 35).
# A blackholed agent holds a slot for its whole timeout: 512 of them take 4 waves of
# 0.8 x the interval, still inside report_stale_s (5 s by default), so the probe's
# votes stay fresh even in a blackout of every region.
PROBE_CONCURRENCY = 128


class AgentProber:
    def __init__(
        self, topology: Topology, clock: Clock, *, concurrency: int = PROBE_CONCURRENCY
    ) -> None:
        self.topology, self.clock, self.concurrency = topology, clock, concurrency
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

    async def sweep(self, report: Callable[[HealthReport], None]) -> None:
        """One check of every agent, at most ``concurrency`` at once, each region's
        report handed to ``report`` as its check ends (``controlplane/probe_job.py``
        stores them in batches through the leader's fence). A changed verdict is logged."""
        todo = iter(self.topology.names)
        async with asyncio.TaskGroup() as tg:
            for i in range(min(self.concurrency, len(self.topology.names))):
                tg.create_task(self._check_each(todo, report), name=f"agent-check-{i}")

    async def _check_each(
        self, todo: Iterator[str], report: Callable[[HealthReport], None]
    ) -> None:
        """One of the sweep's workers: the next unchecked region until none is left."""
        for name in todo:
            health, detail = await self.check(name)
            report(self._report(name, health, detail))

    def _report(self, name: str, health: Health, detail: str) -> HealthReport:
        if self._last.get(name) is not health:
            log.info("probe %s: %s (%s)", name, health.value, detail)
            self._last[name] = health
        return HealthReport(
            region=name,
            observer=PROBE_OBSERVER,
            kind=ObserverKind.PROBE,
            health=health,
            received_at=self.clock.now(),  # when this check ended, not when the sweep did
            detail=detail,
        )

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels.values()))
