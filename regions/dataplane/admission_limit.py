"""Admission control: how many requests each replica of a region may hold at once, and
who waits or is refused beyond that. Pure: no I/O and no clock (callers pass ``now``),
so the gateway, the endpoint picker and the tests drive it alike.

**The limit** (per replica) is an adaptive concurrency limit in the family of Netflix's
concurrency-limits and Envoy's adaptive concurrency filter, but steered by first-token
time against a target, not by round-trip time: a streamed answer's length says how much
the client asked for, not how loaded the replica is, while its first token waits for
the queue and the prefill that load lengthens.

* A first token within ``target_s`` grows the limit by ``1 / limit`` (one more request
  per limit's worth of good answers: additive increase), but only while the replica
  uses at least half its limit (an idle replica's good answers say nothing about more).
* A first token later than the target shrinks it multiplicatively, by
  ``target / first_token`` clamped to [``min_backoff``, ``backoff``]: a slight overshoot
  takes 10 %, a first token twice the target halves the limit. Only answers to requests
  admitted since the last decrease count for the next one (the others were admitted
  under the old limit and say nothing new), so a burst of late answers makes one cut.
* The limit stays within [1, ``max_limit``]; ``max_limit`` (from the measured capacity)
  None is unbounded; ``set_max_limit`` moves it (limits above come down at once). It
  starts at ``initial_limit``, or, when that is None, at
  ``max_limit`` (what the measurement says the replica bears), or at 16 without one.

**Partitions**: each request is interactive or batch (:func:`priority_of`, from the
``x-priority`` header: ``batch`` / ``low`` are batch, anything else interactive). They
reserve shares of each replica's limit (0.9 / 0.1 by default). A replica under its limit
admits either (a share one partition leaves unused is borrowed by the other); at its
limit, a freed slot goes first to a partition under its share, interactive before batch,
so a batch request that borrowed gives its slot back to interactive ones when it ends.
No replica ever holds more than its limit.

**The queue** (one per region; a waiter takes the first slot that frees on any replica):
over the limit a request waits at most ``max_wait_s``, in a queue of at most
``max_queue`` (a full one drops its newest batch waiter for an interactive arrival, or
refuses the arrival). A queue that has not emptied for ``max_wait_s``, or one whose
waiter timed out less than ``max_wait_s`` ago, is standing (the region is overloaded,
not absorbing a burst; a moment's emptiness between arrivals does not end that): then
waiters get ``standing_wait_s`` only, so admitted requests do not each spend the whole
wait before their replica starts (as in CoDel, where a standing queue's sojourn is cut).
A refusal says when to retry: the time the queue ahead takes to drain at the mean time
a request holds its slot, 1 to ``retry_after_max_s`` seconds.

No maintained library fits: the adaptive limiters on PyPI (ace-concurrency, aimd-limiter,
adaptive-concurrency, all 0.x) steer by CPU, rate or round-trip time, with no priority
partitions, and own the waiting themselves; this one is small and leaves that to callers.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

DEFAULT_INITIAL_LIMIT = 16
DEFAULT_BATCH_VALUES = frozenset({"batch", "low"})
_HOLD_WEIGHT = 0.05  # EWMA weight of one request's slot-hold time (Retry-After's estimate)


class Priority(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


PRIORITIES = (Priority.INTERACTIVE, Priority.BATCH)  # the order slots are offered in


def priority_of(
    value: str | None, batch_values: Collection[str] = DEFAULT_BATCH_VALUES
) -> Priority:
    """A request's partition from its priority header: batch only when it says so, by
    name or by a negative priority (the shedding actuator's scale, where unmarked
    requests are 0); an unknown value must not lose a request its reserved share."""
    if value is None:
        return Priority.INTERACTIVE
    text = value.strip().lower()
    if text in batch_values or (text.lstrip("-").isdigit() and int(text) < 0):
        return Priority.BATCH
    return Priority.INTERACTIVE


@dataclass(frozen=True)
class LimitConfig:
    target_s: float  # the first-token time a replica's answers should stay under
    max_limit: int | None = None  # per replica, from the measured capacity; None: unbounded
    initial_limit: int | None = None  # None: max_limit, else DEFAULT_INITIAL_LIMIT
    backoff: float = 0.9  # the most of the limit a decrease keeps
    min_backoff: float = 0.5  # the least
    interactive_share: float = 0.9  # batch gets the rest
    max_queue: int = 128  # waiters per region
    max_wait_s: float = 1.0
    standing_wait_s: float | None = None  # None: max_wait_s / 10
    retry_after_max_s: int = 30

    def __post_init__(self) -> None:
        problems = [
            why
            for bad, why in (
                (not self.target_s > 0, "target_s must be positive"),
                (self.max_limit is not None and self.max_limit < 1, "max_limit must be >= 1"),
                (
                    self.initial_limit is not None and self.initial_limit < 1,
                    "initial_limit must be >= 1",
                ),
                (
                    not 0 < self.min_backoff <= self.backoff < 1,
                    "need 0 < min_backoff <= backoff < 1",
                ),
                (not 0 < self.interactive_share < 1, "interactive_share must be in (0, 1)"),
                (self.max_queue < 0, "max_queue must be >= 0"),
                (not self.max_wait_s >= 0, "max_wait_s must be >= 0"),
                (
                    self.standing_wait_s is not None
                    and not 0 <= self.standing_wait_s <= self.max_wait_s,
                    "standing_wait_s must be within [0, max_wait_s]",
                ),
                (self.retry_after_max_s < 1, "retry_after_max_s must be >= 1"),
            )
            if bad
        ]
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def start_limit(self) -> float:
        if self.initial_limit is None:
            return float(self.max_limit or DEFAULT_INITIAL_LIMIT)
        return float(min(self.initial_limit, self.max_limit or self.initial_limit))

    @property
    def upper(self) -> float:
        return math.inf if self.max_limit is None else float(self.max_limit)

    @property
    def standing_wait(self) -> float:
        if self.standing_wait_s is None:
            return self.max_wait_s / 10
        return self.standing_wait_s

    def share(self, priority: Priority) -> float:
        if priority is Priority.INTERACTIVE:
            return self.interactive_share
        return 1.0 - self.interactive_share


@dataclass(frozen=True, slots=True)
class Grant:
    """A request may go to ``replica``; hand it back with ``release``."""

    ticket: int
    replica: str
    priority: Priority
    granted_at: float
    epoch: int  # the replica's decreases when granted (see ``observe``)
    queued: bool  # it waited first


@dataclass(frozen=True, slots=True)
class Waiting:
    """Queued: a later call's ``Events`` grant or refuse it."""

    ticket: int
    priority: Priority
    since: float
    avoid: frozenset[str] = frozenset()  # replicas it must not be given (already tried)


@dataclass(frozen=True, slots=True)
class Refusal:
    ticket: int
    priority: Priority
    reason: str  # queue_full | timeout | evicted
    retry_after_s: int


REFUSAL_REASONS = ("queue_full", "timeout", "evicted")


@dataclass(frozen=True, slots=True)
class Events:
    """What became of waiters during a call."""

    granted: tuple[Grant, ...] = ()
    refused: tuple[Refusal, ...] = ()

    def __add__(self, other: Events) -> Events:
        return Events(self.granted + other.granted, self.refused + other.refused)

    def __bool__(self) -> bool:
        return bool(self.granted or self.refused)


NOTHING = Events()


@dataclass
class _Replica:
    limit: float
    inflight: int = 0
    by_priority: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(PRIORITIES, 0))
    epoch: int = 0  # decreases so far
    gone: bool = False  # left the region: takes nothing new, forgotten once empty

    @property
    def cap(self) -> int:
        return max(1, int(self.limit))

    def has_room(self) -> bool:
        return not self.gone and self.inflight < self.cap


class AdmissionLimiter:
    """One region's limiter: its replicas' limits and in-flight counts, and its queue."""

    def __init__(self, config: LimitConfig, replicas: Iterable[str] = ()) -> None:
        self.config = config
        self._replicas: dict[str, _Replica] = {}
        self._queues: dict[Priority, OrderedDict[int, Waiting]] = {
            p: OrderedDict() for p in PRIORITIES
        }
        self._granted: dict[int, Grant] = {}
        self._next_ticket = 0
        self._busy_since: float | None = None  # since when the queue has not been empty
        self._timed_out_at: float | None = None  # when a waiter last timed out
        self._hold_s = config.target_s  # mean slot-hold time, until answers say better
        self.set_replicas(replicas, 0.0)

    # ---- what it holds ----------------------------------------------------------------

    def limits(self) -> dict[str, float]:
        return {name: r.limit for name, r in self._replicas.items() if not r.gone}

    def inflight(self, replica: str | None = None) -> int:
        if replica is not None:
            r = self._replicas.get(replica)
            return r.inflight if r is not None else 0
        return sum(r.inflight for r in self._replicas.values())

    def inflight_of(self, replica: str, priority: Priority) -> int:
        r = self._replicas.get(replica)
        return r.by_priority[priority] if r is not None else 0

    def waiting(self, priority: Priority | None = None) -> int:
        if priority is not None:
            return len(self._queues[priority])
        return sum(len(q) for q in self._queues.values())

    def standing(self, now: float) -> bool:
        """Overload, not a burst: the queue has not emptied for ``max_wait_s``, or a
        waiter timed out within the last ``max_wait_s``."""
        wait = self.config.max_wait_s
        since, timed_out = self._busy_since, self._timed_out_at
        return (since is not None and now - since >= wait) or (
            timed_out is not None and now - timed_out < wait
        )

    def next_deadline(self, now: float) -> float | None:
        """When the oldest waiter times out, at the current wait; None without waiters."""
        wait = self._max_wait(now)
        fronts = [next(iter(q.values())).since for q in self._queues.values() if q]
        return min(fronts) + wait if fronts else None

    # ---- calls ------------------------------------------------------------------------

    def set_replicas(self, replicas: Iterable[str], now: float) -> Events:
        """The region's replicas now: new ones start at the start limit; one that left
        takes nothing new and is forgotten once its requests ended."""
        names = dict.fromkeys(replicas)
        for name in names:
            r = self._replicas.get(name)
            if r is None:
                self._replicas[name] = _Replica(self.config.start_limit)
            else:
                r.gone = False
        for name, r in list(self._replicas.items()):
            if name not in names:
                r.gone = True
                if r.inflight == 0:
                    del self._replicas[name]
        return self._expire(now) + self._dispatch(now)

    def set_max_limit(self, max_limit: int | None, now: float) -> Events:
        """A new upper bound (the measured capacity changed; None: unbounded). Limits
        above it come down to it at once; below it they grow to it as answers allow
        (additive increase), not by a jump a fresh measurement may not yet deserve."""
        self.config = replace(self.config, max_limit=max_limit)  # checked there
        for r in self._replicas.values():
            r.limit = min(r.limit, self.config.upper)
        return self._expire(now) + self._dispatch(now)

    def acquire(
        self,
        priority: Priority,
        candidates: Iterable[str],
        now: float,
        avoid: Collection[str] = (),
    ) -> tuple[Grant | Waiting | Refusal, Events]:
        """Admit a request to the first of ``candidates`` (the router's order; then any
        other replica not in ``avoid``) under its limit, else queue or refuse it; also
        what became of other waiters meanwhile."""
        events = self._expire(now)
        ticket = self._next_ticket
        self._next_ticket += 1
        avoid = frozenset(avoid)
        # A replica with room has no waiter that may take it (every call ends by giving
        # free slots to waiters), so nobody is passed over. The router's order first,
        # then any other replica the request may go to, as a waiter would.
        for name in itertools.chain(candidates, self._replicas):
            r = self._replicas.get(name)
            if r is not None and name not in avoid and r.has_room():
                return self._grant(ticket, name, r, priority, now, queued=False), events
        decision, evicted = self._enqueue(ticket, priority, now, avoid)
        return decision, events + evicted

    def observe(self, grant: Grant, first_token_s: float, now: float) -> Events:
        """A first token came ``first_token_s`` after the grant: adjust its replica's
        limit (see the module's docstring); a larger one may admit waiters."""
        held = self._granted.get(grant.ticket)  # as held: it may have moved
        r = None if held is None else self._replicas.get(held.replica)
        if held is None or r is None:
            return NOTHING
        grant = held
        cfg = self.config
        if first_token_s > cfg.target_s:
            if grant.epoch == r.epoch:  # admitted under the current limit: news
                factor = min(cfg.backoff, max(cfg.min_backoff, cfg.target_s / first_token_s))
                r.limit = max(1.0, r.limit * factor)
                r.epoch += 1
            return self._expire(now)
        if 2 * r.inflight >= r.cap and r.limit < cfg.upper:
            r.limit = min(cfg.upper, r.limit + 1.0 / r.limit)
        return self._expire(now) + self._dispatch(now)

    def release(self, grant: Grant, now: float) -> Events:
        """The granted request ended (answered, failed or cut): its slot frees."""
        held = self._granted.pop(grant.ticket, None)  # as held: it may have moved
        if held is None:
            return NOTHING  # released already
        self._unhold(held)
        self._hold_s += _HOLD_WEIGHT * (max(0.0, now - held.granted_at) - self._hold_s)
        return self._expire(now) + self._dispatch(now)

    def move(self, grant: Grant, replica: str, now: float) -> tuple[Grant | None, Events]:
        """The data plane went past ``grant``'s replica to ``replica`` (the first reset
        or refused): the request runs there now, so its slot does too, even past that
        replica's limit (it is running already; later requests wait behind it), and the
        first replica's slot frees. None (nothing changed) when the grant was released
        already or ``replica`` is not one of the region's."""
        held = self._granted.get(grant.ticket)  # as held: it may have moved before
        target = self._replicas.get(replica)
        if held is None or target is None or target.gone:
            return None, NOTHING
        self._unhold(held)
        target.inflight += 1
        target.by_priority[held.priority] += 1
        moved = replace(held, replica=replica, epoch=target.epoch)
        self._granted[held.ticket] = moved
        return moved, self._expire(now) + self._dispatch(now)

    def expire(self, now: float) -> Events:
        """Refuse the waiters whose wait ran out (for a timer at ``next_deadline``)."""
        return self._expire(now)

    def withdraw(self, ticket: int, now: float) -> Events:
        """A waiter or a granted request whose client left: forget it."""
        grant = self._granted.get(ticket)
        if grant is not None:
            return self.release(grant, now)
        for q in self._queues.values():
            if q.pop(ticket, None) is not None:
                self._settle_busy()
                break
        return NOTHING

    # ---- inside -----------------------------------------------------------------------

    def _grant(
        self, ticket: int, name: str, r: _Replica, priority: Priority, now: float, *, queued: bool
    ) -> Grant:
        r.inflight += 1
        r.by_priority[priority] += 1
        grant = Grant(ticket, name, priority, now, r.epoch, queued)
        self._granted[ticket] = grant
        return grant

    def _unhold(self, grant: Grant) -> None:
        """``grant``'s replica holds it no longer; a replica that left is forgotten
        once empty."""
        r = self._replicas.get(grant.replica)
        if r is not None:
            r.inflight -= 1
            r.by_priority[grant.priority] -= 1
            if r.gone and r.inflight == 0:
                del self._replicas[grant.replica]

    def _enqueue(
        self, ticket: int, priority: Priority, now: float, avoid: frozenset[str]
    ) -> tuple[Waiting | Refusal, Events]:
        cfg = self.config
        evicted = NOTHING
        if cfg.max_queue == 0 or cfg.max_wait_s == 0:
            return self._refusal(ticket, priority, "queue_full"), NOTHING
        if self.waiting() >= cfg.max_queue:
            batch = self._queues[Priority.BATCH]
            if priority is not Priority.INTERACTIVE or not batch:
                return self._refusal(ticket, priority, "queue_full"), NOTHING
            _, newest = batch.popitem(last=True)  # batch is refused first
            evicted = Events(refused=(self._refusal(newest.ticket, newest.priority, "evicted"),))
        waiter = Waiting(ticket, priority, now, avoid)
        self._queues[priority][ticket] = waiter
        if self._busy_since is None:
            self._busy_since = now
        return waiter, evicted

    def _max_wait(self, now: float) -> float:
        return self.config.standing_wait if self.standing(now) else self.config.max_wait_s

    def _expire(self, now: float) -> Events:
        wait = self._max_wait(now)
        refused = []
        for priority, q in self._queues.items():
            while q:
                oldest = next(iter(q.values()))
                if now - oldest.since <= wait:
                    break  # FIFO: the rest came later
                q.popitem(last=False)
                refused.append(self._refusal(oldest.ticket, priority, "timeout"))
                self._timed_out_at = now
        self._settle_busy()
        return Events(refused=tuple(refused)) if refused else NOTHING

    def _dispatch(self, now: float) -> Events:
        """Give every free slot to a waiter that may take it."""
        if not self.waiting():
            return NOTHING
        granted = []
        for name, r in self._replicas.items():
            while r.has_room():
                waiter = self._next_waiter(name, r)
                if waiter is None:
                    break
                granted.append(
                    self._grant(waiter.ticket, name, r, waiter.priority, now, queued=True)
                )
        self._settle_busy()
        return Events(granted=tuple(granted)) if granted else NOTHING

    def _next_waiter(self, name: str, r: _Replica) -> Waiting | None:
        """The oldest waiter of the first partition under its share on ``r`` (interactive
        before batch), else of any partition (borrowing: ``r`` is under its limit)."""
        cfg = self.config
        under = [p for p in PRIORITIES if r.by_priority[p] < cfg.share(p) * r.limit]
        for priority in (*under, *(p for p in PRIORITIES if p not in under)):
            q = self._queues[priority]
            for ticket, waiter in q.items():
                if name not in waiter.avoid:
                    del q[ticket]
                    return waiter
        return None

    def _settle_busy(self) -> None:
        if not self.waiting():
            self._busy_since = None

    def _refusal(self, ticket: int, priority: Priority, reason: str) -> Refusal:
        """Retry after the time the waiters (and this request) take to get a slot."""
        cfg = self.config
        room = sum(r.cap for r in self._replicas.values() if not r.gone) or 1
        drain = math.ceil(self._hold_s * (self.waiting() + 1) / room)
        return Refusal(ticket, priority, reason, min(cfg.retry_after_max_s, max(1, drain)))
