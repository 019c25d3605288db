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

Sized to what it can poll (issue 35: at 512 regions it asked 1,536 replicas at once
behind aiohttp's 100-connection pool, and the requests that waited for a connection
ran out their timeout there, ~600 answered a round): at most ``concurrency`` replicas
are asked at once (the connection pool is that size too), and a replica's
``timeout_s`` starts when it is asked, not while it waits for its turn. Rounds never
overlap, and the period stretches past ``interval_s`` two ways: the rest after a
round is never less than a quarter of ``interval_s`` (a round that overruns it is
not followed back to back), and a round whose event-loop CPU (``time.thread_time``,
which counts the requests served meanwhile too) exceeds ``cpu_share`` of the period
is followed by the rest that brings it down to that share (a period of at most
``MAX_STRETCH`` intervals). So its idle cost is at most ``cpu_share`` of a core
(10 %) up to ~5,000 replicas: each replica read costs ~0.2 ms of CPU, so at 512
regions of 3 replicas a round of ~0.3 s makes the period ~3 s (docs/scaling.md, "The
data plane at 512 pools").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

import aiohttp

from controlplane.kernel.vllm.metrics import RUNNING, WAITING, parse_gauges
from regions.dataplane.replica_costs import COST_METRICS, CostEstimator
from regions.dataplane.replicas import ReplicaBalancer

log = logging.getLogger("tectonic.gateway")
_READ = frozenset({RUNNING, WAITING}) | COST_METRICS
DEFAULT_POLL_S = 1.0
DEFAULT_CONCURRENCY = 100  # aiohttp's default connection pool: replicas asked at once
MIN_REST = 0.25  # of interval_s: the least rest between rounds (a round that overran)
DEFAULT_CPU_SHARE = 0.1  # of one core: the most the rounds take of the event loop
# The CPU stretch's bound, in intervals: a loop busy with requests counts as the round's
# CPU too, and a busy gateway must not read its replicas' load ever more rarely.
MAX_STRETCH = 10


class ReplicaLoadPoller:
    """Polls the replicas of ``balancers`` (a dict the caller may replace entries of:
    each round reads it anew, so a rebuilt balancer is polled from its next round)."""

    def __init__(
        self,
        balancers: Mapping[str, ReplicaBalancer],
        *,
        interval_s: float = DEFAULT_POLL_S,
        timeout_s: float = 1.0,
        concurrency: int = DEFAULT_CONCURRENCY,
        cpu_share: float = DEFAULT_CPU_SHARE,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu_share must be in (0, 1], not {cpu_share}")
        self.cpu_share = cpu_share
        self._balancers = balancers
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.round_s = 0.0  # how long the last round took
        self.round_cpu_s = 0.0  # the event loop's CPU meanwhile
        self._estimators: dict[str, CostEstimator] = {}  # per replica URL
        self._overran = False  # the last period was longer than interval_s (logged once)

    def rest_s(self, round_s: float, cpu_s: float = 0.0) -> float:
        """How long to wait after a round that took ``round_s`` and ``cpu_s`` of the
        event loop's CPU: the rest of ``interval_s``; never less than ``MIN_REST`` of
        it (a poller whose rounds overrun polls as often as it can, not back to back);
        and long enough that the round's CPU is at most ``cpu_share`` of its period
        (a period of at most ``MAX_STRETCH`` intervals)."""
        cpu_period = min(cpu_s / self.cpu_share, self.interval_s * MAX_STRETCH)
        return max(self.interval_s - round_s, self.interval_s * MIN_REST, cpu_period - round_s)

    async def run(self) -> None:
        """Poll until cancelled, one round at a time."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            while True:
                started, cpu = time.monotonic(), time.thread_time()
                await self.poll(http)
                self.round_s = time.monotonic() - started
                self.round_cpu_s = time.thread_time() - cpu
                self._say_if_overran()
                await asyncio.sleep(self.rest_s(self.round_s, self.round_cpu_s))

    def _say_if_overran(self) -> None:
        period = self.round_s + self.rest_s(self.round_s, self.round_cpu_s)
        overran = period > self.interval_s * 1.001  # not a float's rounding
        if overran and not self._overran:
            log.warning(
                "replica load: a round took %.2f s (%.2f s of CPU), more than its %.2f s "
                "interval allows (%d replicas, %d at once, at most %.0f%% of a core): "
                "each replica is read every %.2f s",
                self.round_s,
                self.round_cpu_s,
                self.interval_s,
                sum(len(b.replicas) for b in list(self._balancers.values())),
                self.concurrency,
                self.cpu_share * 100,
                period,
            )
        elif self._overran and not overran:
            log.info("replica load: rounds fit their %.2f s interval again", self.interval_s)
        self._overran = overran

    async def poll(self, http: aiohttp.ClientSession) -> None:
        """One round: every replica, ``concurrency`` at a time (workers over one list:
        a replica's timeout runs only once it is asked), each answer to its balancer."""
        targets = [(b, r) for b in list(self._balancers.values()) for r in b.replicas]
        asked = [0] * len(targets)  # ours in flight there when it was asked
        reports: list[dict[str, float] | None] = [None] * len(targets)
        turns = iter(enumerate(targets))

        async def worker() -> None:
            for i, (balancer, replica) in turns:
                asked[i] = balancer.inflight[replica]
                reports[i] = await _metrics(http, replica)

        await asyncio.gather(*(worker() for _ in range(min(self.concurrency, len(targets)))))
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
