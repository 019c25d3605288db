"""Admission control in a data plane: the asyncio side of the kernel's limiter
(``regions/dataplane/admission_limit.py``), one per region, each with a limit per
replica and one queue for the region.

Per region rather than per replica, so that a request that finds its replica full
takes another replica of the region with room (the router's order: prefix affinity is
worth a prefill, not a wait), and a waiter takes the first slot that frees on any of
them instead of queueing behind one slow replica.

The gateway's forwarder asks ``enter`` before each attempt (the request waits here at
most the queue's wait, or is refused), reports the attempt's first token
(``first_token``: the time from the grant, which the limit is steered by) and ends it
(``leave``). Only
streamed answers have a first token before their end: a non-streamed one holds its
slot but teaches the limit nothing. Continuations of a cut stream
(``regions/gateway/resume.py``) go round admission: they finish a request admitted
already.

The first-token target defaults to the region's ``slo.ttft_p99_s`` less the queue's
wait (a request may have waited that long here before its replica starts; at least
half the SLO), so that waiting plus the replica's first token fits the SLO.

Each replica's limit is bounded by ``max_inflight`` when the operator sets it, else by
the region's measured capacity (``capacity_bounds.py`` calls ``set_max_inflight`` as
``capacity/<region>`` changes), else not at all. The endpoint picker uses the same
gates (``regions/picker/pick.py``). Off (the default), both take ``AdmissionOff``,
which lets every request through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from controlplane.kernel.config import Topology
from regions.dataplane.admission_bound import BoundAt
from regions.dataplane.admission_limit import (
    AdmissionLimiter,
    Events,
    Grant,
    LimitConfig,
    Priority,
    Refusal,
    Waiting,
    priority_of,
)
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.off import Off
from regions.dataplane.replicas import ReplicaBalancer

__all__ = [
    "ADMISSION_OFF",
    "AdmissionGates",
    "AdmissionOff",
    "AdmissionOptions",
    "Gates",
    "Grant",
    "Refusal",
    "RegionGate",
]


@dataclass(frozen=True)
class AdmissionOptions:
    enabled: bool = False
    # None: the serving region's slo.ttft_p99_s less max_queue_wait_s (at least half)
    first_token_target_s: float | None = None
    max_queue_wait_s: float = 1.0
    standing_wait_s: float | None = None  # None: a tenth of max_queue_wait_s
    max_queue: int = 128  # waiters per region
    interactive_share: float = 0.9  # of each replica's limit; batch gets the rest
    # per replica; None: from the measured capacity (capacity_bounds.py), else unbounded
    max_inflight: int | None = None
    bound_at: BoundAt = BoundAt.ULTIMATE  # the measured rate the bound is the in-flight of
    initial_inflight: int | None = None  # None: max_inflight, else 16
    priority_header: str = "x-priority"
    batch_values: tuple[str, ...] = ("batch", "low")

    def target_for(self, slo_ttft_s: float) -> float:
        if self.first_token_target_s is not None:
            return self.first_token_target_s
        return max(slo_ttft_s - self.max_queue_wait_s, slo_ttft_s / 2)

    def limit_config(self, slo_ttft_s: float) -> LimitConfig:
        """The limiter's settings for a region with this first-token SLO."""
        return LimitConfig(
            target_s=self.target_for(slo_ttft_s),
            max_limit=self.max_inflight,
            initial_limit=self.initial_inflight,
            interactive_share=self.interactive_share,
            max_queue=self.max_queue,
            max_wait_s=self.max_queue_wait_s,
            standing_wait_s=self.standing_wait_s,
        )


class RegionGate:
    """One region's limiter, with a future per waiter and a timer for the next timeout."""

    def __init__(
        self,
        region: str,
        limiter: AdmissionLimiter,
        metrics: DataPlaneMetrics,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.region = region
        self.limiter = limiter
        self._metrics = metrics
        self._monotonic = monotonic
        self._waiters: dict[int, asyncio.Future[Grant | Refusal]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._replicas: tuple[str, ...] = ()

    def sync(self, replicas: tuple[str, ...]) -> None:
        """Follow the region's replicas (its balancer's, replaced when its pool changes)."""
        if replicas is self._replicas or replicas == self._replicas:
            self._replicas = replicas
            return
        old = set(self._replicas)
        self._replicas = replicas
        self._settle(self.limiter.set_replicas(replicas, self._monotonic()))
        for name in old - set(replicas):
            self._metrics.admission_replica_gone(self.region, name)
        for name, limit in self.limiter.limits().items():
            self._metrics.admission_limit(self.region, name, limit)

    async def enter(
        self, priority: Priority, candidates: Iterator[str], avoid: frozenset[str]
    ) -> Grant | Refusal:
        """A slot on a replica (the first of ``candidates`` with room, else the first to
        free), after waiting at most the queue's wait; or the refusal."""
        decision, events = self.limiter.acquire(priority, candidates, self._monotonic(), avoid)
        fut = self._future(decision) if isinstance(decision, Waiting) else None
        self._settle(events)
        if isinstance(decision, Grant):
            self._metrics.admitted(self.region, priority)
            return decision
        if isinstance(decision, Refusal):
            self._metrics.admission_refused(self.region, priority, decision.reason)
            return decision
        assert fut is not None
        return await self._wait(decision, fut)

    def _future(self, waiter: Waiting) -> asyncio.Future[Grant | Refusal]:
        """Where a waiter hears what became of it (before any event could tell it)."""
        self._metrics.admission_queued(self.region, waiter.priority)
        fut: asyncio.Future[Grant | Refusal] = asyncio.get_running_loop().create_future()
        self._waiters[waiter.ticket] = fut
        return fut

    async def _wait(self, waiter: Waiting, fut: asyncio.Future[Grant | Refusal]) -> Grant | Refusal:
        self._arm()
        try:
            return await fut
        except asyncio.CancelledError:  # the client left while it waited
            self._waiters.pop(waiter.ticket, None)
            self._settle(self.limiter.withdraw(waiter.ticket, self._monotonic()))
            raise

    def set_max_limit(self, limit: int | None) -> None:
        """A new bound on each replica's limit (the measured capacity changed)."""
        if limit == self.limiter.config.max_limit:
            return
        self._settle(self.limiter.set_max_limit(limit, self._monotonic()))
        for name, value in self.limiter.limits().items():
            self._metrics.admission_limit(self.region, name, value)

    def first_token(self, grant: Grant) -> None:
        now = self._monotonic()
        self._settle(self.limiter.observe(grant, now - grant.granted_at, now))
        limit = self.limiter.limits().get(grant.replica)
        if limit is not None:
            self._metrics.admission_limit(self.region, grant.replica, limit)

    def leave(self, grant: Grant) -> None:
        self._settle(self.limiter.release(grant, self._monotonic()))

    def move(self, grant: Grant, replica: str) -> Grant | None:
        """``grant``'s request runs on ``replica`` now (``AdmissionLimiter.move``)."""
        moved, events = self.limiter.move(grant, replica, self._monotonic())
        self._settle(events)
        return moved

    def _settle(self, events: Events) -> None:
        """Tell the waiters the limiter granted or refused what became of them."""
        for grant in events.granted:
            fut = self._waiters.pop(grant.ticket, None)
            if fut is None or fut.done():  # withdrawn meanwhile: hand the slot back
                self._settle(self.limiter.release(grant, self._monotonic()))
                continue
            self._metrics.admitted(self.region, grant.priority)
            fut.set_result(grant)
        for refusal in events.refused:
            self._metrics.admission_refused(self.region, refusal.priority, refusal.reason)
            fut = self._waiters.pop(refusal.ticket, None)
            if fut is not None and not fut.done():
                fut.set_result(refusal)
        if events:
            self._arm()

    def _arm(self) -> None:
        """A timer at the next waiter's timeout (the limiter refuses it then)."""
        now = self._monotonic()
        deadline = self.limiter.next_deadline(now)
        if deadline is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        if self._timer is not None and self._timer_at <= deadline:
            return  # fires first; it arms the next
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = deadline
        self._timer = loop.call_later(max(0.0, deadline - now) + 1e-3, self._expire)

    def _expire(self) -> None:
        self._timer = None
        self._settle(self.limiter.expire(self._monotonic()))
        self._arm()


def candidates(
    balancer: ReplicaBalancer, key: int, first: str, tried: set[str], now: float
) -> Iterator[str]:
    """The balancer's choice, then the region's other untried replicas in its order
    (asked lazily: the first choice usually has room)."""
    yield first
    seen = {*tried, first}
    while (replica := balancer.choose(key, now=now, exclude=seen)) is not None:
        yield replica
        seen.add(replica)


class AdmissionGates:
    """A gate per region of the topology, each steered by its region's SLO."""

    def __init__(
        self,
        options: AdmissionOptions,
        topology: Topology,
        metrics: DataPlaneMetrics,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self._batch = frozenset(v.lower() for v in options.batch_values)
        self._header = options.priority_header.lower()
        self._gates = {
            r.name: RegionGate(
                r.name,
                AdmissionLimiter(options.limit_config(r.slo.ttft_p99_s)),
                metrics,
                monotonic,
            )
            for r in topology.regions
        }
        metrics.admission_started(list(self._gates))

    def gate(self, region: str) -> RegionGate | None:
        return self._gates.get(region)

    def priority(self, headers: Mapping[str, str]) -> Priority:
        return priority_of(headers.get(self._header), self._batch)

    async def enter(
        self,
        region: str,
        headers: Mapping[str, str],
        balancer: ReplicaBalancer,
        key: int,
        first: str,
        tried: set[str],
        now: float,
    ) -> Grant | Refusal | None:
        """A slot for the request on ``first`` or another replica of ``region``; None
        when admission does not cover the region (not in the topology)."""
        gate = self._gates.get(region)
        if gate is None:
            return None
        gate.sync(balancer.replicas)
        order = candidates(balancer, key, first, tried, now)
        return await gate.enter(self.priority(headers), order, frozenset(tried))

    def set_max_inflight(self, region: str, limit: int | None) -> None:
        """Bound ``region``'s replica limits (from its measured capacity; None: no
        bound), unless ``max_inflight`` is set: the operator's figure wins."""
        gate = self._gates.get(region)
        if gate is not None and self.options.max_inflight is None:
            gate.set_max_limit(limit)

    def first_token(self, region: str, grant: Grant) -> None:
        gate = self._gates.get(region)
        if gate is not None:
            gate.first_token(grant)

    def leave(self, region: str, grant: Grant) -> None:
        gate = self._gates.get(region)
        if gate is not None:
            gate.leave(grant)

    def move(self, region: str, grant: Grant, replica: str) -> Grant | None:
        """Move ``grant`` to ``replica`` of its region; None: it cannot (not one of the
        region's replicas, or released already), nothing changed."""
        gate = self._gates.get(region)
        return None if gate is None else gate.move(grant, replica)


class AdmissionOff(Off):
    """Admission control off (``AdmissionOptions.enabled`` false, the default): every
    request is let through at once, as ``AdmissionGates`` lets through those of a region
    it does not cover; no limit, no queue, no 429."""

    def __init__(self, why: str = "not enabled") -> None:
        super().__init__("admission control", why)

    def gate(self, region: str) -> RegionGate | None:
        return None

    async def enter(
        self,
        region: str,
        headers: Mapping[str, str],
        balancer: ReplicaBalancer,
        key: int,
        first: str,
        tried: set[str],
        now: float,
    ) -> Grant | Refusal | None:
        return None

    def set_max_inflight(self, region: str, limit: int | None) -> None:
        return None

    def first_token(self, region: str, grant: Grant) -> None:
        return None

    def leave(self, region: str, grant: Grant) -> None:
        return None

    def move(self, region: str, grant: Grant, replica: str) -> Grant | None:
        return None


# What the forwarder and the picker take: the gates, or admission control off.
Gates = AdmissionGates | AdmissionOff
ADMISSION_OFF = AdmissionOff()  # their default (a data plane's core says why it is off)
