"""Reporting health to the control plane, shared by the region agent and the gateway.

:class:`HealthReportClient` holds one channel per listed control-plane endpoint (TLS
and this process's bearer token as :func:`controlplane.kernel.rpc.tls.aio_channel` gives
them), sends each ``ReportHealth`` to the endpoint that took the last one and, when
that one fails or refuses, tries the others in turn. When none takes a report it logs
one warning, at most every ``warn_every_s`` seconds, on the caller's logger: an
unreachable control plane is the normal state of a partition, not an error to shout
about on every tick. Before any report has been taken, for ``startup_grace_s`` after
the client is made, it is no failure at all: agents and gateways usually start before
the control plane, so that wait is one INFO line (each miss at DEBUG). Still failing
after the grace, or failing once a report was taken, is the warning. The answer of the
endpoint that took a report comes back to the caller: to an agent it brings its
region's DEGRADED thresholds (:func:`thresholds_from_pb`).

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
from controlplane.kernel.rpc.tls import ChannelOptions, aio_channel
from controlplane.kernel.security import SecurityConfig

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
# How long a reporter that has never had a report taken waits for a control plane
# before calling it a failure: a lab or a rollout starts its control planes within it.
STARTUP_GRACE_S = 30.0


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
        startup_grace_s: float = STARTUP_GRACE_S,
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
        self._grace_until = now() + startup_grace_s
        self._taken_once = False  # whether any endpoint ever took a report
        self._said_waiting = False  # the one INFO line of the start-up wait
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
            self._taken_once = True
            return resp
        self._reachable = False
        self._warn(failures)
        return None

    def _warn(self, failures: Sequence[str]) -> None:
        now = self._now()
        why = "; ".join(failures) or "no endpoints"
        if not self._taken_once and now < self._grace_until:
            # Starting before the control plane is the usual order, not a failure.
            if not self._said_waiting:
                self._said_waiting = True
                self._log.info(
                    "waiting for a control plane to take the %s (%s)",
                    self._what,
                    ", ".join(self.endpoints) or "no endpoints",
                )
            self._log.debug("still waiting for a control plane (%s)", why)
            return
        if now - self._last_warn >= self._warn_every_s:
            self._last_warn = now
            self._log.warning("no control plane took the %s (%s)", self._what, why)

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()
