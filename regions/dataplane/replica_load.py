"""What each replica bears, read from its ``/metrics`` for the replica balancers.

Every ``interval_s`` this reads ``vllm:num_requests_running`` and
``vllm:num_requests_waiting`` of every replica of every region (the simulator writes
the same gauges) and hands them to that region's ``ReplicaBalancer.observe``, which
learns the replica's slots from them and counts the requests other gateways hold
there, and its latency and prefix-cache counters to a ``CostEstimator`` whose figures
(mean hold, what a hit saves) tell the balancer when a full prefix owner is worth
waiting for. The decision stays in the balancer (pure); this is only the I/O. A replica that
does not answer in ``timeout_s`` is ``unreported``: its balancer goes on with its own
in-flight counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

import aiohttp

from controlplane.kernel.vllm.metrics import RUNNING, WAITING, parse_gauges
from regions.dataplane.replica_costs import COST_METRICS, CostEstimator
from regions.dataplane.replicas import ReplicaBalancer

log = logging.getLogger("tectonic.gateway")
_READ = frozenset({RUNNING, WAITING}) | COST_METRICS
DEFAULT_POLL_S = 1.0


class ReplicaLoadPoller:
    """Polls the replicas of ``balancers`` (a dict the caller may replace entries of:
    each round reads it anew, so a rebuilt balancer is polled from its next round)."""

    def __init__(
        self,
        balancers: Mapping[str, ReplicaBalancer],
        *,
        interval_s: float = DEFAULT_POLL_S,
        timeout_s: float = 1.0,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        self._balancers = balancers
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._estimators: dict[str, CostEstimator] = {}  # per replica URL

    async def run(self) -> None:
        """Poll until cancelled."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                await self.poll(http)
                await asyncio.sleep(self.interval_s)

    async def poll(self, http: aiohttp.ClientSession) -> None:
        """One round: every replica at once, each answer to its balancer."""
        targets = [(b, r) for b in list(self._balancers.values()) for r in b.replicas]
        asked = [b.inflight[r] for b, r in targets]
        reports = await asyncio.gather(*(_metrics(http, r) for _, r in targets))
        for (balancer, replica), ours, found in zip(targets, asked, reports, strict=True):
            if found is None:
                balancer.unreported(replica)
                continue
            running, waiting = int(found[RUNNING]), int(found.get(WAITING, 0.0))
            balancer.observe(replica, running, waiting, ours_asked=ours)
            estimator = self._estimators.setdefault(replica, CostEstimator())
            balancer.set_costs(replica, estimator.update(found))


async def _metrics(http: aiohttp.ClientSession, replica: str) -> dict[str, float] | None:
    """``replica``'s gauges and cost counters, or None when it does not say how
    many it runs."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with http.get(replica.rstrip("/") + "/metrics") as r:
            if r.status != 200:
                return None
            found = parse_gauges(await r.text(), _READ)
            return found if RUNNING in found else None
    log.debug("replica %s: /metrics unreadable", replica)
    return None
