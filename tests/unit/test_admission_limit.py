"""The admission limiter (regions.dataplane.admission_limit), driven with a fake clock:
the limit grows under good first-token times and shrinks under bad ones (a late answer
to a request admitted before a cut makes no second cut), batch borrows only what is free
and is refused before interactive under overload, the queue waits, times out, stands and
evicts as its docstring says, a moved request takes its slot on the other replica; and
the gateway's settings (the target from the SLO, the flags). Any sequence of calls
keeping the invariants: test_admission_limit_machine.py."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regions.dataplane.admission_gate import AdmissionOptions
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
from regions.gateway.__main__ import parse_args as gateway_args

INTER, BATCH = Priority.INTERACTIVE, Priority.BATCH
TARGET = 1.0


def limiter(replicas: Sequence[str] = ("a",), **config: object) -> AdmissionLimiter:
    return AdmissionLimiter(LimitConfig(target_s=TARGET, **config), replicas)  # type: ignore[arg-type]


def admit(lim: AdmissionLimiter, priority: Priority, now: float = 0.0) -> Grant:
    got, _ = lim.acquire(priority, lim.limits(), now)
    assert isinstance(got, Grant), got
    return got


# ---- growing and shrinking ---------------------------------------------------------------


@given(
    start=st.integers(1, 40),
    answers=st.lists(st.floats(0.0, TARGET), min_size=1, max_size=200),
    bound=st.one_of(st.none(), st.integers(1, 60)),
)
def test_the_limit_grows_while_first_tokens_stay_under_the_target(
    start: int, answers: list[float], bound: int | None
) -> None:
    lim = limiter(initial_limit=start, max_limit=bound)
    upper = bound or float("inf")
    held = [admit(lim, INTER) for _ in range(int(lim.limits()["a"]))]  # the replica is busy
    before = lim.limits()["a"]
    for i, seconds in enumerate(answers):
        lim.observe(held[i % len(held)], seconds, 0.0)
    after = lim.limits()["a"]
    assert after <= upper
    assert after > before or before == upper


@given(
    start=st.integers(1, 64),
    late=st.lists(st.floats(TARGET * 1.01, 30.0), min_size=1, max_size=30),
)
def test_the_limit_shrinks_when_first_tokens_pass_the_target(start: int, late: list[float]) -> None:
    lim = limiter(initial_limit=start)
    for seconds in late:
        before = lim.limits()["a"]
        g = admit(lim, INTER)  # admitted under the current limit: its answer is news
        lim.observe(g, seconds, 0.0)
        lim.release(g, 0.0)
        after = lim.limits()["a"]
        assert after >= 1.0
        assert after < before or before == 1.0
        # multiplicative: between min_backoff and backoff of what it was
        assert after >= max(1.0, before * 0.5) - 1e-9
        assert after <= max(1.0, before * 0.9) + 1e-9


def test_late_answers_to_requests_admitted_before_a_cut_make_no_second_cut() -> None:
    lim = limiter(initial_limit=10)
    old = [admit(lim, INTER) for _ in range(5)]
    lim.observe(old[0], 2 * TARGET, 0.0)  # halves: 10 -> 5
    assert lim.limits()["a"] == pytest.approx(5)
    for g in old[1:]:
        lim.observe(g, 3 * TARGET, 0.0)  # admitted under 10: old news
    assert lim.limits()["a"] == pytest.approx(5)


def test_an_idle_replica_does_not_grow_its_limit() -> None:
    lim = limiter(initial_limit=10)
    g = admit(lim, INTER)  # 1 of 10 in flight
    for _ in range(50):
        lim.observe(g, 0.1, 0.0)
    assert lim.limits()["a"] == 10


def test_the_start_limit_is_the_bound_when_one_is_given() -> None:
    assert limiter(max_limit=40).limits()["a"] == 40
    assert limiter().limits()["a"] == 16  # unbounded: starts at 16
    assert limiter(initial_limit=8, max_limit=4).limits()["a"] == 4


# ---- partitions -------------------------------------------------------------------------


def test_batch_borrows_only_while_the_replica_is_under_its_limit() -> None:
    lim = limiter(initial_limit=10, max_queue=10)
    batch = [admit(lim, BATCH) for _ in range(10)]  # interactive is quiet: batch borrows it all
    got, _ = lim.acquire(INTER, ["a"], 0.0)
    assert isinstance(got, Waiting)  # never past the limit, even for interactive
    events = lim.release(batch[0], 0.0)
    assert [g.ticket for g in events.granted] == [got.ticket]  # the freed slot goes back


@given(
    limit=st.integers(2, 30),
    share=st.sampled_from([0.5, 0.8, 0.9]),
    waiting=st.lists(st.booleans(), min_size=1, max_size=40),
)
def test_a_freed_slot_goes_to_batch_only_within_its_share(
    limit: int, share: float, waiting: list[bool]
) -> None:
    lim = limiter(initial_limit=limit, max_queue=100, interactive_share=share)
    held = [admit(lim, INTER) for _ in range(limit)]
    for batch in waiting:
        lim.acquire(BATCH if batch else INTER, ["a"], 0.0)
    for g in held:
        events = lim.release(g, 0.0)
        for granted in events.granted:
            if granted.priority is BATCH and lim.waiting(INTER):
                assert lim.inflight_of("a", BATCH) <= (1 - share) * limit + 1


def test_batch_keeps_its_reserved_share_while_interactive_overloads() -> None:
    lim = limiter(initial_limit=10, max_queue=100)  # batch reserves 0.1 x 10: one slot
    held = [admit(lim, INTER) for _ in range(10)]
    for _ in range(5):
        lim.acquire(INTER, ["a"], 0.0)
    batch, _ = lim.acquire(BATCH, ["a"], 0.0)
    first = lim.release(held[0], 0.0)  # interactive holds 9 of its 9: batch's turn
    assert [g.ticket for g in first.granted] == [batch.ticket]
    second = lim.release(held[1], 0.0)  # batch holds its 1: back to interactive
    assert [g.priority for g in second.granted] == [INTER]


def overload_run(
    seed: int, offered: float, batch_mix: float, hold_s: float, steps: int
) -> dict[Priority, float]:
    """Poisson-ish arrivals at ``offered`` x the replicas' capacity, each request holding
    its slot ``hold_s``; the share of each partition refused."""
    rng = random.Random(seed)
    lim = limiter(("a", "b"), initial_limit=10, max_queue=20, max_wait_s=0.5)
    capacity = 2 * 10 / hold_s
    dt = 0.01
    now = 0.0
    ends: list[tuple[float, Grant]] = []
    sent = dict.fromkeys((INTER, BATCH), 0)
    refused = dict.fromkeys((INTER, BATCH), 0)

    def settle(events: Events) -> None:
        ends.extend((now + hold_s, g) for g in events.granted)
        for r in events.refused:
            refused[r.priority] += 1

    for _ in range(steps):
        now += dt
        for end, g in [e for e in ends if e[0] <= now]:
            ends.remove((end, g))
            settle(lim.release(g, now))
        for _ in range(_poisson(rng, offered * capacity * dt)):
            p = BATCH if rng.random() < batch_mix else INTER
            sent[p] += 1
            got, events = lim.acquire(p, ["a", "b"], now)
            settle(events)
            if isinstance(got, Grant):
                settle(Events(granted=(got,)))
            elif isinstance(got, Refusal):
                refused[p] += 1
        settle(lim.expire(now))
    return {p: refused[p] / sent[p] for p in (INTER, BATCH) if sent[p]}


def _poisson(rng: random.Random, mean: float) -> int:
    n, t = 0, rng.expovariate(1.0)
    while t < mean:
        n += 1
        t += rng.expovariate(1.0)
    return n


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    offered=st.floats(1.5, 3.0),
    batch_mix=st.floats(0.2, 0.5),
)
def test_under_overload_batch_is_refused_before_interactive(
    seed: int, offered: float, batch_mix: float
) -> None:
    shares = overload_run(seed, offered, batch_mix, hold_s=0.2, steps=600)
    assert shares[BATCH] > shares[INTER]


# ---- the queue ----------------------------------------------------------------------------


def test_a_waiter_times_out_after_the_max_wait_with_a_retry_after() -> None:
    lim = limiter(initial_limit=1, max_wait_s=1.0)
    admit(lim, INTER)
    got, _ = lim.acquire(INTER, ["a"], 0.0)
    assert isinstance(got, Waiting)
    assert lim.next_deadline(0.5) == pytest.approx(1.0)
    assert not lim.expire(0.9)
    [refusal] = lim.expire(1.1).refused
    assert (refusal.ticket, refusal.reason) == (got.ticket, "timeout")
    assert refusal.retry_after_s >= 1


def test_a_standing_queue_shortens_the_wait() -> None:
    lim = limiter(initial_limit=1, max_wait_s=1.0, standing_wait_s=0.1)
    admit(lim, INTER)
    now = 0.0
    while now < 1.0:  # a waiter every 50 ms, each timing out: the queue never empties
        lim.acquire(INTER, ["a"], now)
        now += 0.05
    assert lim.standing(now)
    got, _ = lim.acquire(INTER, ["a"], now)
    assert isinstance(got, Waiting)
    deadline = lim.next_deadline(now)
    assert deadline is not None and deadline <= now + 0.1 + 1e-9  # not since + 1 s
    assert got.ticket in {r.ticket for r in lim.expire(now + 0.15).refused}


def test_a_queue_stays_standing_through_a_moment_empty_after_a_timeout() -> None:
    lim = limiter(initial_limit=1, max_wait_s=1.0, standing_wait_s=0.1)
    admit(lim, INTER)
    lim.acquire(INTER, ["a"], 0.0)
    assert lim.expire(1.01).refused  # timed out: the queue is empty again, but
    assert lim.waiting() == 0 and lim.standing(1.5)  # the region is still overloaded
    got, _ = lim.acquire(INTER, ["a"], 1.5)
    assert isinstance(got, Waiting)
    assert lim.next_deadline(1.5) == pytest.approx(1.6)  # a short wait only
    assert [r.ticket for r in lim.expire(1.61).refused] == [got.ticket]
    assert lim.standing(2.6) and not lim.standing(2.62)  # a quiet second ends it


def test_a_full_queue_drops_its_newest_batch_waiter_for_an_interactive_arrival() -> None:
    lim = limiter(initial_limit=1, max_queue=2)
    admit(lim, INTER)
    first, _ = lim.acquire(BATCH, ["a"], 0.0)
    newest, _ = lim.acquire(BATCH, ["a"], 0.0)
    got, events = lim.acquire(INTER, ["a"], 0.0)
    assert isinstance(got, Waiting)
    assert [(r.ticket, r.reason) for r in events.refused] == [(newest.ticket, "evicted")]
    refused, _ = lim.acquire(BATCH, ["a"], 0.0)
    assert isinstance(refused, Refusal) and refused.reason == "queue_full"
    assert isinstance(first, Waiting) and lim.waiting(BATCH) == 1


def test_a_replica_that_left_takes_nothing_new_and_is_forgotten_when_empty() -> None:
    lim = limiter(("a", "b"), initial_limit=1)
    g = admit(lim, INTER)
    lim.set_replicas(["b"] if g.replica == "a" else ["a"], 0.0)
    assert g.replica not in lim.limits()
    assert lim.inflight(g.replica) == 1
    lim.release(g, 0.0)
    assert lim.inflight(g.replica) == 0


def test_a_request_moved_to_another_replica_takes_its_slot_there_and_frees_the_first() -> None:
    """The data plane went past the granted replica: the request runs on the other, even
    past that one's limit, and the first's freed slot goes to its waiter."""
    lim = limiter(("a", "b"), initial_limit=1, max_queue=4, max_wait_s=10.0)
    ga, gb = admit(lim, INTER), admit(lim, INTER)
    assert {ga.replica, gb.replica} == {"a", "b"}
    waiting, _ = lim.acquire(INTER, lim.limits(), 0.0)
    assert isinstance(waiting, Waiting)
    moved, events = lim.move(ga, gb.replica, 1.0)
    assert moved is not None and moved.replica == gb.replica and moved.ticket == ga.ticket
    assert lim.inflight(gb.replica) == 2  # past its limit of 1: it is running there
    assert [g.replica for g in events.granted] == [ga.replica]  # the waiter got the slot
    assert lim.move(moved, "elsewhere", 1.0) == (None, Events())  # not the region's
    lim.release(ga, 2.0)  # the old grant's ticket is the moved one's: released once
    assert lim.inflight(gb.replica) == 1
    assert lim.move(moved, ga.replica, 2.0) == (None, Events())  # released already


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("batch", BATCH),
        (" Low ", BATCH),
        ("interactive", INTER),
        ("7", INTER),
        ("0", INTER),
        ("-1", BATCH),  # the shedding actuator's scale: unmarked is 0, batch below it
        ("", INTER),
        (None, INTER),
        ("x", INTER),
    ],
)
def test_priority_of_the_header_unknown_values_are_interactive(
    header: str | None, expected: Priority
) -> None:
    assert priority_of(header) is expected


def test_bad_settings_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="interactive_share"):
        LimitConfig(target_s=1.0, interactive_share=1.0)
    with pytest.raises(ValueError, match="target_s"):
        LimitConfig(target_s=0.0)


# ---- the gateway's settings: the target from the SLO, the flags --------------------------


def test_the_default_target_leaves_the_queue_wait_within_the_slo() -> None:
    assert AdmissionOptions().target_for(2.0) == 1.0  # 2 s SLO less the 1 s wait
    assert AdmissionOptions(max_queue_wait_s=0.5).target_for(2.0) == 1.5
    assert AdmissionOptions(max_queue_wait_s=1.5).target_for(2.0) == 1.0  # half the SLO
    assert AdmissionOptions(first_token_target_s=0.3).target_for(2.0) == 0.3
    config = AdmissionOptions(max_inflight=32, interactive_share=0.8).limit_config(2.0)
    assert (config.target_s, config.max_limit) == (1.0, 32)
    assert config.share(BATCH) == pytest.approx(0.2)


GATEWAY = ["--topology", "examples/topology.yaml", "--region", "us-east"]


def test_admission_is_off_unless_the_flag_turns_it_on() -> None:
    off, _ = gateway_args(GATEWAY)
    assert off.admission == AdmissionOptions()
    assert not off.admission.enabled
    on, _ = gateway_args(
        [*GATEWAY, "--admission", "--admission-max-wait", "0.5", "--admission-max-inflight", "64"]
    )
    assert on.admission.enabled
    assert (on.admission.max_queue_wait_s, on.admission.max_inflight) == (0.5, 64)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--admission-interactive-share", "1"], "--admission-interactive-share"),
        (["--admission-max-inflight", "0"], "--admission-max-inflight must be positive"),
        (["--admission-target", "0"], "--admission-target must be positive"),
    ],
)
def test_bad_admission_flags_are_refused_naming_the_flag(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        gateway_args([*GATEWAY, *flags])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
