"""Replica choice inside a region: prefix affinity bounded by what each replica bears.

vLLM's prefix cache lives in each replica, so requests that share a prompt prefix
should land on the same replica (a hit saves the whole prefill). A consistent-hash
ring keyed by a hash of the prompt's first characters gives that, and adding or
removing a replica moves only about 1/n of the keys. A request goes to the first
replica in ring order from its key (its owner, then a stable second choice...) that
has room for it, so a prefix keeps its replica unless that replica is full.

What "room" means is the replica's own capacity: a vLLM engine runs at most
``max_num_seqs`` requests at once (fewer when its KV cache is short) and queues the
rest. A request queued behind full slots waits until one of them finishes its whole
decode, tens to hundreds of milliseconds, while a prefix hit saves only the prefill of
the shared part (a few to tens of milliseconds): so the owner takes a request while
it has a free slot, and it spills to the next replica in ring order that has one. Only
when every replica is full does the request queue, where the queue is shortest for
the slots behind it. A replica's load is our requests in flight on it plus, as of its
last report, those it holds that this process did not send (other gateways').

A replica's slots are given (``slots``, e.g. vLLM's ``max_num_seqs``) or learned from
the ``vllm:num_requests_running`` / ``_waiting`` it reports (``observe``, fed by
``replica_load.py``): running N with a queue in two reports in a row is its limit, N
(one report could catch a request between arrival and the next engine step); running
more than its slots without a queue raises them. A replica not seen at its limit yet
bears what the fewest of its region's others was seen to bear (one deployment).

A full owner is worth waiting for when its prefix is still in the owner's cache (what
we sent there since, ``replica_cache.py``) and its next free slot comes within half
the prefill that saves: the wait is the rest of the mean hold of its oldest request
(our own requests' start times, ``acquire(now=...)``; the mean hold and the saving are
the replica's own figures, ``replica_costs.py``), and the other half is left for the
spread of holds around their mean (a cold request holds its slot a saving longer than
a warm one). The request then waits in the owner's engine queue instead of spilling
cold: its first token comes no later than a spilled one's would, and the prefix stays
on its replica. Only then may a request queue while another replica has a free slot;
without those figures (or for a wait behind requests we did not send) it spills.

A replica of unknown slots (before anything is learned) is bounded as before: it takes
a request while its in-flight count is below ``ceil(c x (total + 1) / n)`` (Mirrokni,
Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads"), which spreads one
hot prefix without knowing what a replica bears, and so may queue on one that bears
less: ten of sixteen requests on a replica that runs eight.

Everything here is pure and synchronous (no I/O, no clock): the proxy tells the
balancer when a request starts and ends, ``replica_load.py`` what each replica
reports, and passes ``now`` for passive ejection.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence

from regions.dataplane.replica_cache import SentKeys
from regions.dataplane.replica_costs import Costs
from regions.dataplane.ring import (
    DEFAULT_VNODES,
    HashRing,
)

DEFAULT_LOAD_FACTOR = 1.25

log = logging.getLogger("tectonic.gateway")


class ReplicaBalancer:
    """Capacity-bounded choice over one region's replicas, with in-flight counts, the
    slots each replica bears, and passive ejection of replicas that just failed to
    connect. ``slots``: the requests each replica runs at once, for all of them (an
    int) or per replica; None or a missing replica: unknown until ``observe`` learns it."""

    def __init__(
        self,
        replicas: Sequence[str],
        *,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        vnodes: int = DEFAULT_VNODES,
        slots: int | Mapping[str, int] | None = None,
    ) -> None:
        if load_factor < 1.0:
            raise ValueError(f"load_factor must be at least 1, got {load_factor}")
        self.ring = HashRing.build(replicas, vnodes)
        self.load_factor = load_factor
        self._inflight = dict.fromkeys(self.ring.replicas, 0)
        self._total = 0
        self._down_until: dict[str, float] = {}
        self._spec = slots  # as given: a replica that joins later gets its share too
        self._given = _given_slots(slots, self.ring.replicas)
        self._started: dict[str, list[float]] = {r: [] for r in self.ring.replicas}
        self._costs: dict[str, Costs] = {}
        self._sent = {r: SentKeys() for r in self.ring.replicas}
        self._learned: dict[str, int] = {}
        self._queued: dict[str, int] = {}  # running, when its last report showed a queue
        self._others = dict.fromkeys(self.ring.replicas, 0)  # requests we did not send
        self._others_total = 0

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.ring.replicas

    @property
    def inflight(self) -> Mapping[str, int]:
        return self._inflight

    def rebuilt(self, replicas: Sequence[str]) -> ReplicaBalancer:
        """A balancer over ``replicas`` with these settings and the slots given and
        learned of the replicas that stay (a pool change must not forget them)."""
        stay = set(replicas)
        new = ReplicaBalancer(replicas, load_factor=self.load_factor, slots=self._spec)
        new._learned = {r: n for r, n in self._learned.items() if r in stay}
        new._costs = {r: c for r, c in self._costs.items() if r in stay}
        new._sent.update({r: k for r, k in self._sent.items() if r in stay})
        return new

    # ---- what a replica bears --------------------------------------------------------

    def slots(self, replica: str) -> int | None:
        """How many requests ``replica`` runs at once: learned, else given, else the
        fewest learned of another replica of the region (one deployment's replicas are
        alike, and a replica that bears more shows it), else None (unknown)."""
        own = self._learned.get(replica, self._given.get(replica))
        if own is None and self._learned:
            return min(self._learned.values())
        return own

    def load(self, replica: str) -> int:
        """The requests ``replica`` holds: ours in flight and, as of its last report,
        those others sent it."""
        return self._inflight[replica] + self._others[replica]

    def capacity(self) -> int:
        """The most requests a replica of unknown slots may hold when taking one more:
        the bounded-load ring's ``ceil(c x (total + 1) / n)``."""
        n = len(self._inflight)
        total = self._total + self._others_total
        return math.ceil(self.load_factor * (total + 1) / n) if n else 0

    def bound(self, replica: str, capacity: int | None = None) -> int:
        """The load below which ``replica`` takes one more request without queueing it:
        its slots when known, else the bounded-load ring's ``capacity``."""
        slots = self.slots(replica)
        if slots is not None:
            return slots
        return self.capacity() if capacity is None else capacity

    def observe(
        self, replica: str, running: int, waiting: int, *, ours_asked: int | None = None
    ) -> None:
        """What ``replica`` reports: vLLM's ``num_requests_running`` and
        ``num_requests_waiting``. A queue in two reports in a row (not a request in
        transit to the next engine step) means it runs all it can: that many are its
        slots, up or down. Running more than its slots without one means it bears
        more. Nothing running (asleep, paused) says nothing about slots.
        ``ours_asked``: our in-flight count on it when the report was asked for (ours
        at the report's moment were at most the more of that and the count now)."""
        if replica not in self._inflight or running < 0 or waiting < 0:
            return
        # what it holds beyond our in-flight requests: other gateways' (ours reach it
        # after we count them and leave it before, so ours never show as others')
        ours = max(self._inflight[replica], ours_asked or 0)
        self._set_others(replica, max(0, running + waiting - ours))
        queued_before = self._queued.pop(replica, None)
        if waiting > 0 and running > 0:
            self._queued[replica] = running
        known = self.slots(replica)
        if queued_before is not None and replica in self._queued:
            self._learn(replica, max(running, queued_before))
        elif known is not None and running > known:
            self._learn(replica, running)

    def unreported(self, replica: str) -> None:
        """``replica``'s report could not be read: what others hold there is unknown
        again (counted as nothing), and a queue seen before is not seen twice."""
        if replica in self._inflight:
            self._set_others(replica, 0)
            self._queued.pop(replica, None)

    def set_costs(self, replica: str, costs: Costs | None) -> None:
        """``replica``'s own figures (``replica_costs.py``): its mean hold and what a
        prefix hit there saves; None: unknown (a full owner is then never waited for).
        Their latest hit share teaches what its cache holds."""
        if replica not in self._inflight:
            return
        if costs is None:
            self._costs.pop(replica, None)
            return
        self._costs[replica] = costs
        if costs.hit_share is not None:
            self._sent[replica].learn(costs.hit_share)

    def _set_others(self, replica: str, n: int) -> None:
        self._others_total += n - self._others[replica]
        self._others[replica] = n

    def _learn(self, replica: str, slots: int) -> None:
        was = self.slots(replica)
        if slots != was:
            self._learned[replica] = slots
            log.info("replica %s runs %d requests at once (was %s)", replica, slots, was)

    # ---- the choice ------------------------------------------------------------------

    def choose(self, key: int, *, now: float = 0.0, exclude: Collection[str] = ()) -> str | None:
        """The replica for ``key``: the first in ring order that has room (its load
        below its ``bound``), skipping ``exclude`` and ejected replicas. If none has,
        the one whose queue is shortest for its slots (the first in ring order among
        equals); if all are ejected, ejection is ignored (a guess beats a refusal).
        None if none is left."""
        cap = self.capacity()
        down = self._down_until
        owner = None
        for r in self.ring.walk(key):  # the common case: an early candidate has room
            if r in exclude or down.get(r, 0.0) > now:
                continue
            if self.load(r) < self.bound(r, cap):
                return owner if owner and self._worth_waiting(owner, key, now) else r
            owner = owner or r
        eligible = [r for r in self.ring.walk(key) if r not in exclude]
        live = [r for r in eligible if down.get(r, 0.0) <= now]
        if not live:  # every eligible replica is ejected: ignore ejection
            with_room = (r for r in eligible if self.load(r) < self.bound(r, cap))
            return next(with_room, None) or self._shortest_queue(eligible, cap)
        return self._shortest_queue(live, cap)

    def wait_s(self, replica: str, now: float) -> float | None:
        """How long one more request would wait for a slot of ``replica`` (full): the
        rest of the mean hold of the request whose end frees the slot it gets (the
        oldest of ours past those already queued), or None when that one is not ours,
        is overdue by more than a hold (stuck: no estimate), or the hold is unknown."""
        costs = self._costs.get(replica)
        slots = self.slots(replica)
        if costs is None or slots is None:
            return None
        ahead = max(0, self.load(replica) - slots)  # already queued there
        started = self._started[replica]
        if ahead >= len(started):
            return None
        rest = costs.hold_s - (now - started[ahead])
        return max(0.0, rest) if rest > -costs.hold_s else None

    def likely_cached(self, replica: str, key: int) -> bool:
        """``key``'s prefix is likely still in ``replica``'s cache (``replica_cache.py``)."""
        sent = self._sent.get(replica)
        return sent is not None and sent.likely_cached(key)

    def _worth_waiting(self, owner: str, key: int, now: float) -> bool:
        """Wait for ``owner`` (full) rather than spill: it likely holds ``key``'s
        prefix, and its slot comes within half the prefill that saves."""
        wait = self.wait_s(owner, now)
        if wait is None or not wait < self._costs[owner].hit_saving_s / 2:
            return False
        return self.likely_cached(owner, key)

    def _shortest_queue(self, candidates: Sequence[str], cap: int) -> str | None:
        """Where one more request waits least: the fewest held per slot, counting it
        (min keeps the first of equals: ring order, so affinity breaks the tie)."""
        return min(
            candidates,
            key=lambda r: (self.load(r) + 1) / max(self.bound(r, cap), 1),
            default=None,
        )

    # ---- the proxy's bookkeeping -----------------------------------------------------

    def acquire(self, replica: str, now: float | None = None, key: int | None = None) -> None:
        """A request starts on ``replica``; ``now`` (monotonic) times it for the
        waits of ``wait_s`` (untimed ones still count as load); ``key``, its prefix,
        is then in that replica's cache for a while."""
        self._inflight[replica] += 1
        self._total += 1
        if now is not None:
            self._started[replica].append(now)
        if key is not None:
            self._sent[replica].sent(key)

    def release(self, replica: str) -> None:
        """A request on ``replica`` ended. Its start time is not known here: the
        oldest one goes (requests of one replica end about in the order they began)."""
        if self._inflight[replica] > 0:
            self._inflight[replica] -= 1
            self._total -= 1
            started = self._started[replica]
            if len(started) > self._inflight[replica]:
                started.pop(0)

    def eject(self, replica: str, until: float) -> None:
        """Skip ``replica`` until ``until`` (it refused a connection): the next requests
        go straight to the next replica instead of paying a failed connect each."""
        self._down_until[replica] = until

    def readmit(self, replica: str) -> None:
        self._down_until.pop(replica, None)


def _given_slots(slots: int | Mapping[str, int] | None, replicas: Sequence[str]) -> dict[str, int]:
    """``slots`` per replica; refuses a count below 1 (a replica that runs nothing is
    not in rotation)."""
    if slots is None:
        return {}
    given = dict.fromkeys(replicas, slots) if isinstance(slots, int) else dict(slots)
    bad = {r: n for r, n in given.items() if n < 1}
    if bad:
        raise ValueError(f"slots must be at least 1, got {bad}")
    return {r: n for r, n in given.items() if r in replicas}
