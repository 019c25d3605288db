"""What each replica bears, read from its ``/metrics`` for the replica balancers.

Every ``interval_s`` this reads ``vllm:num_requests_running`` and
``vllm:num_requests_waiting`` of every replica of every region (the simulator writes
the same gauges) and hands them to that region's ``ReplicaBalancer.observe``, which
learns the replica's slots from them and counts the requests other gateways hold
there. The decision stays in the balancer (pure); this is only the I/O. A replica that
does not answer in ``timeout_s`` is ``unreported``: its balancer goes on with its own
in-flight counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

import aiohttp

from controlplane.kernel.vllm_metrics import RUNNING, WAITING, parse_gauges
from regions.gateway.replicas import ReplicaBalancer

log = logging.getLogger("tectonic.gateway")
_GAUGES = frozenset({RUNNING, WAITING})
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
        reports = await asyncio.gather(*(_gauges(http, r) for _, r in targets))
        for (balancer, replica), ours, gauges in zip(targets, asked, reports, strict=True):
            if gauges is None:
                balancer.unreported(replica)
            else:
                balancer.observe(replica, *gauges, ours_asked=ours)


async def _gauges(http: aiohttp.ClientSession, replica: str) -> tuple[int, int] | None:
    """``(running, waiting)`` of ``replica``, or None when it does not say."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with http.get(replica.rstrip("/") + "/metrics") as r:
            if r.status != 200:
                return None
            found = parse_gauges(await r.text(), _GAUGES)
            if RUNNING not in found:
                return None
            return int(found[RUNNING]), int(found.get(WAITING, 0.0))
    log.debug("replica %s: /metrics unreadable", replica)
    return None
