"""The gateway as a health observer (kind GATEWAY) of the regions it forwards to.

What a gateway's own requests saw is a vantage point the region's agent and the
control plane's probe lack (a network path that broke between users and a region,
say). Every ``interval_s`` the gateway folds the attempts of the last interval into
one verdict per region and sends it with ``ReportHealth``, trying the listed
control-plane endpoints in turn (the kernel's ``HealthReportClient``, which the region
agent uses too). A region that got no traffic gets no report: the gateway has no
opinion, and a stale report ages out of the quorum on its own.

Besides the verdict, each report carries the interval's ``error_rate`` (failed
attempts) and ``auth_error_rate``: the share of attempts the region answered 401 or
403. vLLM's own metrics group statuses as 2xx/4xx/5xx, so the gateway, which sees each
status, is the source of that signal (a trigger of the degradation ladder: a client
retry storm against a failing auth layer shows there first).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.kernel.model import Health
from controlplane.kernel.rpc.health_report import HealthReportClient, health_to_pb
from controlplane.kernel.security import SecurityConfig

log = logging.getLogger("tectonic.gateway.report")
UNHEALTHY_AT = 0.5  # share of failed attempts
DEGRADED_AT = 0.05
AUTH_STATUSES = frozenset({401, 403})


def classify(ok: int, failed: int, *, min_attempts: int = 3) -> Health | None:
    """The verdict on one interval's attempts; None when there is too little to judge
    (but a handful of attempts that all failed is judged: that is the outage case)."""
    total = ok + failed
    if total == 0 or (total < min_attempts and ok > 0):
        return None
    rate = failed / total
    if rate >= UNHEALTHY_AT:
        return Health.UNHEALTHY
    return Health.DEGRADED if rate >= DEGRADED_AT else Health.HEALTHY


class HealthReporter:
    def __init__(
        self,
        control_planes: Sequence[str],
        observer: str,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 0.5,
        warn_every_s: float = 30.0,
        security: SecurityConfig | None = None,
    ) -> None:
        self.observer = observer
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        # TLS and the gateway's token (role reporter) when the topology has security:.
        self._client = HealthReportClient(
            control_planes,
            security,
            log=log,
            timeout_s=timeout_s,
            warn_every_s=warn_every_s,
            what="gateway's report",
        )
        self._counts: dict[str, list[int]] = {}  # region -> [ok, failed, auth errors]
        self.sent = 0

    def record(self, region: str, ok: bool, status: int = 0) -> None:
        """One attempt into ``region``: answered (any status below 500; ``status``, 0 if
        unknown) or failed."""
        counts = self._counts.get(region)
        if counts is None:
            counts = self._counts[region] = [0, 0, 0]
        counts[0 if ok else 1] += 1
        if status in AUTH_STATUSES:
            counts[2] += 1

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.report_once()

    async def report_once(self) -> int:
        counts, self._counts = self._counts, {}
        sent = 0
        for region, (ok, failed, auth) in sorted(counts.items()):
            health = classify(ok, failed)
            if health is None:
                continue
            total = ok + failed
            report = pb.HealthReport(
                region=region,
                observer=self.observer,
                kind=pb.GATEWAY,
                health=health_to_pb(health),
                signals={
                    "attempts": float(total),
                    "failed": float(failed),
                    "error_rate": failed / total,
                    "auth_error_rate": auth / total,
                },
                detail=f"{failed}/{total} attempts failed in the last {self.interval_s:g} s",
            )
            if await self._client.send(report) is not None:
                sent += 1
        self.sent += sent
        return sent

    async def close(self) -> None:
        await self._client.close()
