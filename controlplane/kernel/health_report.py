"""Reporting health to the control plane, shared by the region agent and the gateway.

:class:`HealthReportClient` holds one channel per listed control-plane endpoint (TLS
and this process's bearer token as :func:`controlplane.kernel.tls.aio_channel` gives
them), sends each ``ReportHealth`` to the endpoint that took the last one and, when
that one fails or refuses, tries the others in turn. When none takes a report it logs
one warning, at most every ``warn_every_s`` seconds, on the caller's logger: an
unreachable control plane is the normal state of a partition, not an error to shout
about on every tick. The answer of the endpoint that took a report comes back to the
caller: to an agent it brings its region's DEGRADED thresholds
(:func:`thresholds_from_pb`).

The map between :class:`~controlplane.kernel.model.Health` and the protobuf enum lives
here too, so that the control plane's API and its reporters read the wire alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import grpc
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from controlplane.kernel.config import DegradedWhen
from controlplane.kernel.model import Health
from controlplane.kernel.security import SecurityConfig
from controlplane.kernel.tls import ChannelOptions, aio_channel

HEALTH_TO_PB: Mapping[Health, pb.Health] = {
    Health.HEALTHY: pb.HEALTHY,
    Health.DEGRADED: pb.HEALTH_DEGRADED,
    Health.UNHEALTHY: pb.UNHEALTHY,
    Health.UNKNOWN: pb.UNKNOWN,
}
HEALTH_FROM_PB: Mapping[int, Health] = {v: k for k, v in HEALTH_TO_PB.items()}

# Retry a dead endpoint within a second or two, not after grpc's 20 s+ default backoff:
# a control plane that comes back should hear from its reporters at once.
CHANNEL_OPTIONS: ChannelOptions = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def health_to_pb(h: Health) -> pb.Health:
    """The protobuf enum value of ``h``."""
    return HEALTH_TO_PB[h]


def health_from_pb(v: int) -> Health | None:
    """The health a protobuf enum value stands for; None for one it does not know."""
    return HEALTH_FROM_PB.get(v)


def thresholds_to_pb(when: DegradedWhen) -> pb.RegionThresholds:
    """The wire form of a region's thresholds; an unset one stays unset."""
    return pb.RegionThresholds(
        queue_over=when.queue_over,
        ttft_p99_over_s=when.ttft_p99_over_s,
        error_rate_over=when.error_rate_over,
    )


def thresholds_from_pb(msg: pb.RegionThresholds) -> DegradedWhen:
    """A region's thresholds as a control plane sent them. Raises ValueError (a
    pydantic ValidationError) for one out of its bounds."""
    return DegradedWhen(
        queue_over=msg.queue_over if msg.HasField("queue_over") else None,
        ttft_p99_over_s=msg.ttft_p99_over_s if msg.HasField("ttft_p99_over_s") else None,
        error_rate_over=msg.error_rate_over if msg.HasField("error_rate_over") else None,
    )


class HealthReportClient:
    """Sends ``ReportHealth`` to the first of ``endpoints`` that takes it.

    ``what`` names the report in the warning ("no control plane took the <what>");
    ``log`` is the caller's logger, so that the lines keep their component's name.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        security: SecurityConfig | None,
        *,
        log: logging.Logger,
        timeout_s: float = 0.5,
        warn_every_s: float = 30.0,
        what: str = "report",
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoints = tuple(endpoints)
        self.timeout_s = timeout_s
        self.target: str | None = None  # the endpoint that took the last report
        self._log = log
        self._what = what
        self._now = now
        self._warn_every_s = warn_every_s
        self._last_warn = -float("inf")
        self._channels = [
            aio_channel(ep, security, options=CHANNEL_OPTIONS) for ep in self.endpoints
        ]
        self._stubs = [
            pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
            for ch in self._channels
        ]
        self._next = 0  # endpoint to try first
        self._reachable = True  # whether the last report was taken

    async def send(self, report: pb.HealthReport) -> pb.ReportHealthResponse | None:
        """The answer of the endpoint that accepted ``report``; None when none did.
        Never raises for a failed RPC."""
        failures: list[str] = []
        for i in range(len(self._stubs)):
            idx = (self._next + i) % len(self._stubs)
            ep = self.endpoints[idx]
            try:
                resp: pb.ReportHealthResponse = await self._stubs[idx].ReportHealth(
                    report, timeout=self.timeout_s
                )
            except grpc.aio.AioRpcError as e:
                failures.append(f"{ep}: {e.code().name} {e.details() or ''}".strip())
                continue
            if not resp.accepted:
                failures.append(f"{ep}: report not accepted")
                continue
            # Say so when the reports move, or come through again, not on every one.
            if not self._reachable or self.target not in (None, ep):
                self._log.info("reporting to control plane %s", ep)
            self._next, self._reachable, self.target = idx, True, ep
            return resp
        self._reachable = False
        self._warn(failures)
        return None

    def _warn(self, failures: Sequence[str]) -> None:
        now = self._now()
        if now - self._last_warn >= self._warn_every_s:
            self._last_warn = now
            self._log.warning(
                "no control plane took the %s (%s)",
                self._what,
                "; ".join(failures) or "no endpoints",
            )

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()
