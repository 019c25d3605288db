"""The admission limiter (regions.dataplane.admission_limit) as a state machine: any
sequence of arrivals, first tokens, releases, moves, clients leaving, replica changes
and time passing keeps its limits within bounds, never admits past a limit, gives batch
a queued slot while interactive waits only within batch's share, evicts only batch,
counts what is in flight exactly, bounds its queue and leaves nobody waiting beside a
free slot. Its single behaviours, one by one: test_admission_limit.py."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from regions.dataplane.admission_limit import (
    AdmissionLimiter,
    Events,
    Grant,
    LimitConfig,
    Priority,
    Refusal,
    Waiting,
)

INTER, BATCH = Priority.INTERACTIVE, Priority.BATCH
TARGET = 1.0

# ---- the state machine: any sequence of calls keeps the invariants ----------------------


class LimiterMachine(RuleBasedStateMachine):
    """Arrivals, first tokens, releases, moves, replica changes and time passing, in any order;
    every call's outcome is checked against the rules it must keep."""

    @initialize(
        max_limit=st.one_of(st.none(), st.integers(1, 12)),
        initial=st.one_of(st.none(), st.integers(1, 20)),
        max_queue=st.integers(0, 6),
        share=st.sampled_from([0.5, 0.75, 0.9]),
    )
    def build(
        self, max_limit: int | None, initial: int | None, max_queue: int, share: float
    ) -> None:
        self.config = LimitConfig(
            target_s=TARGET,
            max_limit=max_limit,
            initial_limit=initial,
            max_queue=max_queue,
            interactive_share=share,
            max_wait_s=1.0,
        )
        self.lim = AdmissionLimiter(self.config, ["a", "b"])
        self.replicas = ["a", "b"]
        self.now = 0.0
        self.grants: list[Grant] = []
        self.waiters: dict[int, Waiting] = {}

    def _apply(self, events: Events) -> None:
        for g in events.granted:
            assert self.waiters.pop(g.ticket, None) is not None, "granted a ticket nobody queued"
            self.grants.append(g)
        for r in events.refused:
            assert self.waiters.pop(r.ticket, None) is not None, "refused a ticket nobody queued"
            assert 1 <= r.retry_after_s <= self.config.retry_after_max_s
        self._check_grants(events.granted)

    def _check_grants(self, granted: Sequence[Grant]) -> None:
        limits = self.lim.limits()
        for g in granted:
            # never admitted past the limit: nothing lowers a limit while it grants
            assert self.lim.inflight(g.replica) <= max(1, int(limits[g.replica]))
        for g in granted:
            if g.priority is BATCH and g.queued and self._interactive_may_take(g.replica):
                # batch got a slot from the queue while interactive waited: only when
                # interactive already held its share of that replica
                held = self.lim.inflight_of(g.replica, INTER)
                assert held >= self.config.share(INTER) * limits[g.replica]

    def _interactive_may_take(self, replica: str) -> bool:
        return any(w.priority is INTER and replica not in w.avoid for w in self.waiters.values())

    @rule(batch=st.booleans(), order=st.permutations(["a", "b"]), avoid_first=st.booleans())
    def arrive(self, batch: bool, order: list[str], avoid_first: bool) -> None:
        priority = BATCH if batch else INTER
        avoid = {order[0]} if avoid_first else set()
        had_batch_waiter = self.lim.waiting(BATCH) > 0
        got, events = self.lim.acquire(
            priority, [r for r in order if r not in avoid], self.now, avoid
        )
        self._apply(events)
        if isinstance(got, Grant):
            assert got.replica not in avoid
            self.grants.append(got)
            self._check_grants([got])
        elif isinstance(got, Waiting):
            self.waiters[got.ticket] = got
        else:
            assert isinstance(got, Refusal)
            if priority is INTER and got.reason == "queue_full" and self.config.max_queue:
                assert not had_batch_waiter, "interactive refused while batch waited"
        evicted = [r for r in events.refused if r.reason == "evicted"]
        assert all(r.priority is BATCH for r in evicted), "only batch is evicted"

    @precondition(lambda self: self.grants)
    @rule(pick=st.integers(0, 1000), seconds=st.floats(0.0, 4.0))
    def first_token(self, pick: int, seconds: float) -> None:
        g = self.grants[pick % len(self.grants)]
        self._apply(self.lim.observe(g, seconds, self.now))

    @precondition(lambda self: self.grants)
    @rule(pick=st.integers(0, 1000))
    def release(self, pick: int) -> None:
        g = self.grants.pop(pick % len(self.grants))
        self._apply(self.lim.release(g, self.now))

    @precondition(lambda self: self.grants)
    @rule(pick=st.integers(0, 1000), to=st.sampled_from(["a", "b", "c", "z"]))
    def moved(self, pick: int, to: str) -> None:
        """The data plane went past a grant's replica to ``to``."""
        i = pick % len(self.grants)
        g = self.grants[i]
        ours = to in self.lim.limits()
        moved, events = self.lim.move(g, to, self.now)
        assert (moved is not None) == ours, "moved only to a replica of the region's"
        if moved is not None:
            assert (moved.ticket, moved.replica, moved.priority) == (g.ticket, to, g.priority)
            self.grants[i] = moved
        self._apply(events)

    @precondition(lambda self: self.waiters)
    @rule(pick=st.integers(0, 1000))
    def client_leaves(self, pick: int) -> None:
        ticket = sorted(self.waiters)[pick % len(self.waiters)]
        del self.waiters[ticket]
        self._apply(self.lim.withdraw(ticket, self.now))

    @rule(seconds=st.floats(0.0, 1.5))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self._apply(self.lim.expire(self.now))

    @rule(replicas=st.sampled_from([["a"], ["a", "b"], ["b", "c"], ["a", "b", "c"]]))
    def replicas_change(self, replicas: list[str]) -> None:
        self.replicas = replicas
        self._apply(self.lim.set_replicas(replicas, self.now))

    @invariant()
    def limits_stay_within_bounds(self) -> None:
        upper = self.config.max_limit or float("inf")
        for value in self.lim.limits().values():
            assert 1.0 <= value <= upper

    @invariant()
    def in_flight_counts_match_the_grants(self) -> None:
        for name in {*self.replicas, *(g.replica for g in self.grants)}:
            held = [g for g in self.grants if g.replica == name]
            assert self.lim.inflight(name) == len(held)
            for p in (INTER, BATCH):
                assert self.lim.inflight_of(name, p) == sum(g.priority is p for g in held)

    @invariant()
    def the_queue_is_bounded_and_known(self) -> None:
        assert self.lim.waiting() == len(self.waiters) <= self.config.max_queue

    @invariant()
    def nobody_waits_beside_a_free_slot(self) -> None:
        limits = self.lim.limits()
        for name, value in limits.items():
            if self.lim.inflight(name) < max(1, int(value)):
                assert not any(name not in w.avoid for w in self.waiters.values())


TestLimiterMachine = LimiterMachine.TestCase
TestLimiterMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
