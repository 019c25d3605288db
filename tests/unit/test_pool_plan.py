"""The warm pool's planner (regions.pool.planner.plan) as a whole: exact plans for mixed
pools (every phase's moves, in order, with their reasons), and invariants over random
pools (phase order, input order, scale-up's picks, the shortfall, held moves)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regions.pool.planner import PHASES, Plan, PlanPhase, plan
from regions.pool.states import (
    ACTIVE,
    COLD,
    IDLE,
    WARM,
    Action,
    DwellPolicy,
    PoolTarget,
    Replica,
    ReplicaState,
    TransitionRefused,
    cancelled,
    dwell_for,
    is_stale,
    transition,
)

T0 = 1_000_000.0
D = DwellPolicy()  # WARM 300 s, IDLE 1800 s, ACTIVE 120 s, drain 10 s


def rep(
    name: str,
    state: ReplicaState,
    ago: float = 0.0,
    *,
    variant: str | None = None,
    managed: bool = True,
    busy: bool = False,
) -> Replica:
    """A replica in ``state`` for ``ago`` seconds at T0."""
    url = None if state is COLD and managed else f"http://{name}"
    return Replica(
        name=name,
        url=url,
        state=state,
        since=T0 - ago,
        managed=managed,
        busy=busy,
        variant=variant,
    )


def line(a: Action) -> str:
    return f"{a.kind} {a.replica}{' retire' if a.retire else ''} | {a.reason}"


# -- exact plans: one pool per direction, each with several phases at work ---------------
SCALE_DOWN = [
    rep("a0", ACTIVE, 500),
    rep("a1", ACTIVE, 100),
    rep("a2", ACTIVE, 60),
    rep("i0", IDLE, 2000),
    rep("i1", IDLE, 100),
    rep("s0", COLD, 50, managed=False),
    rep("w0", WARM, 900),
    rep("w1", WARM, 200),
    rep("w2", WARM, 100),
    rep("c0", COLD, 10),
]
SCALE_UP = [
    rep("a0", ACTIVE, 500),
    rep("i0", IDLE, 2000),
    rep("i1", IDLE, 100),
    rep("w0", WARM, 900),
    rep("w1", WARM, 400),
    rep("c0", COLD, 10),
    rep("c1", COLD, 5, busy=True),
    rep("c2", COLD, 5),
]
ROLL = [
    rep("a0", ACTIVE, 500, variant="a"),
    rep("a1", ACTIVE, 500, variant="b"),
    rep("i0", IDLE, 60, variant="a"),
    rep("i1", IDLE, 5, variant="a"),
    rep("w0", WARM, 900, variant="a"),
    rep("w1", WARM, 400, variant="b"),
    rep("s0", WARM, 50, variant="a", managed=False),
    rep("c0", COLD, 10),
]
ROLL_DRAIN = [
    rep("a0", ACTIVE, 500, variant="a"),
    rep("a1", ACTIVE, 500, variant="b"),
    rep("a2", ACTIVE, 300, variant="b"),
    rep("w0", WARM, 900, variant="a"),
    rep("c0", COLD, 10, variant="b", busy=True),
]
SHORT = "ACTIVE short of 7: COLD slots launch to WARM first and are woken by a later plan"
EXACT = {
    "scale_down": (
        SCALE_DOWN,
        PoolTarget(active=1, warm=1),
        [
            "drain a0 | 3 ACTIVE > target 1",
            "sleep i0 | IDLE dwell 1800 s over",
            "launch s0 | static endpoint: adopt when reachable",
            "stop w0 | 3 WARM > target 1",
        ],
        [
            "drain: a1 is ACTIVE for 100 s < ACTIVE dwell 120 s",
            "drain: a2 is ACTIVE for 60 s < ACTIVE dwell 120 s",
            "stop: w1 is WARM for 200 s < WARM dwell 300 s",
            "stop: w2 is WARM for 100 s < WARM dwell 300 s",
        ],
        [],
        0,
    ),
    "scale_up": (
        SCALE_UP,
        PoolTarget(active=7, warm=2),
        [
            "resume i1 | 1 ACTIVE < target 7",
            "resume i0 | 1 ACTIVE < target 7",
            "wake w0 | 1 ACTIVE < target 7",
            "wake w1 | 1 ACTIVE < target 7",
            "launch c0 | standby 1 < wanted 4",
            "launch c2 | standby 1 < wanted 4",
        ],
        [],
        [
            "pool too small: wanted 4 in standby, have 1 and 2 COLD slots to launch",
            f"2 {SHORT} (never COLD -> ACTIVE)",
        ],
        2,
    ),
    "roll": (
        ROLL,
        PoolTarget(active=2, warm=1, variant="b"),
        [
            "wake w1 | roll to b: replaces one of 1 ACTIVE on another variant",
            "stop w0 retire | retiring: runs a, b wanted",
            "sleep i0 retire | retiring: runs a, b wanted",
            "launch c0 | standby 0 < wanted 1",
        ],
        ["retire: i1 is IDLE for 5 s < drain 10 s"],
        ["roll to b: 1 ACTIVE and 4 other replica(s) on another variant"],
        0,
    ),
    "roll_drain": (
        ROLL_DRAIN,
        PoolTarget(active=2, warm=2, variant="b"),
        [
            "drain a0 | roll to b: replaced (3 ACTIVE > target 2); runs a",
            "stop w0 retire | retiring: runs a, b wanted",
        ],
        [],
        [
            "roll to b: 1 launch(es) wait for the slot of a replica being retired",
            "roll to b: 1 ACTIVE and 1 other replica(s) on another variant",
        ],
        0,
    ),
}


@pytest.mark.parametrize("case", list(EXACT))
def test_the_whole_plan_for_a_mixed_pool(case: str) -> None:
    pool, target, actions, deferred, notes, shortfall = EXACT[case]
    p = plan(pool, target, T0, D)
    assert [line(a) for a in p.actions] == actions
    assert list(p.deferred) == deferred
    assert list(p.notes) == notes
    assert p.shortfall == shortfall


# -- invariants over random pools ----------------------------------------------------------
VARIANTS = st.sampled_from([None, "a", "b"])
# Ages at the dwell times (ties included) as well as anywhere in between.
AGES = st.one_of(
    st.sampled_from([0.0, 5.0, 10.0, 120.0, 200.0, 300.0, 1800.0, 2000.0, 3000.0]),
    st.floats(0, 4000),
)


@st.composite
def pools(draw: st.DrawFn) -> list[Replica]:
    specs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(list(ReplicaState)), AGES, st.booleans(), st.booleans(), VARIANTS
            ),
            max_size=10,
        )
    )
    names = draw(st.permutations([f"r{i}" for i in range(len(specs))]))
    return [
        rep(name, state, ago, managed=managed, busy=busy, variant=variant)
        for name, (state, ago, managed, busy, variant) in zip(names, specs, strict=True)
    ]


targets = st.builds(PoolTarget, active=st.integers(0, 8), warm=st.integers(0, 8), variant=VARIANTS)
dwells = st.one_of(
    st.just(D),
    st.builds(
        DwellPolicy,
        warm_min_s=st.sampled_from([0.0, 100.0, 300.0]),
        idle_min_s=st.sampled_from([0.0, 200.0, 1800.0]),
        active_min_s=st.sampled_from([0.0, 120.0, 2000.0]),
        drain_s=st.sampled_from([0.0, 10.0, 3000.0]),
    ),
)
plans = settings(max_examples=400, deadline=None)

# The phase each kind of move belongs to; a stale replica's moves are the RETIRE phase's.
PHASE_OF_KIND = {
    "resume": PlanPhase.ACTIVATE,
    "wake": PlanPhase.ACTIVATE,
    "drain": PlanPhase.DRAIN,
    "sleep": PlanPhase.SLEEP,
    "launch": PlanPhase.LAUNCH,
    "stop": PlanPhase.STOP,
    "cancel": PlanPhase.CANCEL,
}


def phase_of(a: Action) -> PlanPhase:
    return PlanPhase.RETIRE if a.retire else PHASE_OF_KIND[a.kind]


def apply(
    replicas: Sequence[Replica], p: Plan, target: PoolTarget, now: float, dwell: DwellPolicy
) -> list[Replica]:
    """What the manager does when every action succeeds (launches take the target's
    variant, like ``WarmPool._apply``)."""
    by = {r.name: r for r in replicas}
    for a in p.actions:
        r = by[a.replica]
        if a.kind == "cancel":  # the launch stops: the slot is free and COLD again
            by[a.replica] = cancelled(r)
            continue
        if a.kind == "launch":
            r = r.model_copy(update={"variant": target.variant})
        url = f"http://{a.replica}" if a.kind == "launch" else None
        by[a.replica] = transition(r, a.to, now, dwell, url, retiring=a.retire)
    return list(by.values())


def test_the_phases_run_in_their_declared_order() -> None:
    assert list(PHASES) == list(PlanPhase)


@plans
@given(pools(), targets, dwells)
def test_moves_come_phase_by_phase(
    pool: list[Replica], target: PoolTarget, dwell: DwellPolicy
) -> None:
    order = list(PlanPhase)
    ranks = [order.index(phase_of(a)) for a in plan(pool, target, T0, dwell).actions]
    assert ranks == sorted(ranks)


@plans
@given(pools(), targets, dwells, st.randoms(use_true_random=False))
def test_the_plan_does_not_depend_on_the_order_of_the_replicas(
    pool: list[Replica], target: PoolTarget, dwell: DwellPolicy, rnd: object
) -> None:
    shuffled = list(pool)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert plan(shuffled, target, T0, dwell) == plan(pool, target, T0, dwell)


@plans
@given(pools(), targets, dwells)
def test_scale_up_takes_the_warmest_caches_and_never_a_stale_replica(
    pool: list[Replica], target: PoolTarget, dwell: DwellPolicy
) -> None:
    p = plan(pool, target, T0, dwell)
    by = {r.name: r for r in pool}
    picked = {a.replica for a in p.of("resume", "wake")}
    assert not any(is_stale(by[n], target) for n in picked)
    # A stale replica only leaves: drained while ACTIVE (the roll), then retired (or its
    # launch cancelled).
    on_stale = [a for a in p.actions if is_stale(by[a.replica], target)]
    assert all(a.retire or a.kind in ("drain", "cancel") for a in on_stale)
    assert all(is_stale(by[a.replica], target) for a in p.actions if a.retire)

    def key(r: Replica) -> tuple[float, str]:
        return (r.since, r.name)

    def fresh(state: ReplicaState) -> list[Replica]:
        return [r for r in pool if r.state is state and not r.busy and not is_stale(r, target)]

    resumed = [r for r in fresh(IDLE) if r.name in picked]
    left_idle = [r for r in fresh(IDLE) if r.name not in picked]
    woken = [r for r in fresh(WARM) if r.name in picked]
    left_warm = [r for r in fresh(WARM) if r.name not in picked]
    # IDLE first, most recently drained first; then WARM, the longest asleep first.
    assert not (woken and left_idle)
    assert all(key(r) > key(o) for r in resumed for o in left_idle)
    assert all(key(r) < key(o) for r in woken for o in left_warm)


@plans
@given(pools(), targets, dwells)
def test_the_shortfall_is_what_the_plan_leaves_short_and_drains_keep_the_target(
    pool: list[Replica], target: PoolTarget, dwell: DwellPolicy
) -> None:
    p = plan(pool, target, T0, dwell)
    before = sum(r.state is ACTIVE for r in pool)
    after = sum(r.state is ACTIVE for r in apply(pool, p, target, T0, dwell))
    assert p.shortfall == max(target.active - after, 0)
    if p.of("drain"):
        assert after >= target.active
    assert after <= max(before, target.active + 1)  # the roll's surge: one beyond


@plans
@given(pools(), targets, dwells)
def test_a_held_move_names_a_replica_the_plan_leaves_alone(
    pool: list[Replica], target: PoolTarget, dwell: DwellPolicy
) -> None:
    p = plan(pool, target, T0, dwell)
    moved = {a.replica for a in p.actions}
    for held in p.deferred:
        m = re.match(r"(drain|retire|stop): (\S+) is ", held)
        assert m is not None, held
        assert m.group(2) not in moved, held


def test_a_scaled_pool_puts_idle_replicas_to_sleep_after_its_own_dwell() -> None:
    """The leader's scaler sizes the pool: its stable window was the hysteresis, so IDLE
    (awake, paid like ACTIVE) sleeps after ``scaled_idle_min_s``, not ``idle_min_s``;
    never before ``drain_s`` (a sleep aborts what the replica still runs)."""
    pool = [rep("a", ACTIVE, 900), rep("i", IDLE, 45)]
    static = plan(pool, PoolTarget(active=1, warm=0), T0, D)
    assert [a.kind for a in static.actions] == []  # 45 s of 1,800
    scaled = plan(pool, PoolTarget(active=1, warm=0, scaled=True), T0, D)
    assert [(a.kind, a.replica) for a in scaled.actions] == [("sleep", "i")]
    assert "IDLE dwell 10 s over" in scaled.actions[0].reason
    quick = DwellPolicy(scaled_idle_min_s=0.0)  # drain_s (10 s) still holds
    young = [rep("a", ACTIVE, 900), rep("i", IDLE, 5)]
    assert plan(young, PoolTarget(active=1, warm=0, scaled=True), T0, quick).actions == ()
    slow = DwellPolicy(scaled_idle_min_s=60.0)
    assert plan(pool, PoolTarget(active=1, warm=0, scaled=True), T0, slow).actions == ()


def test_the_pool_checks_a_scaled_sleep_with_the_dwell_it_was_planned_with() -> None:
    """The pool re-checks every planned move (``transition``) with the dwell the planner
    used: a scaled pool's IDLE replica of 45 s may sleep; by the pool file's 1,800 s it
    may not (an agent once crashed on that refusal)."""
    idle = rep("i", IDLE, 45)
    scaled = PoolTarget(active=1, warm=0, scaled=True)
    assert transition(idle, WARM, T0, dwell_for(D, scaled)).state is WARM
    with pytest.raises(TransitionRefused, match="IDLE dwell"):
        transition(idle, WARM, T0, dwell_for(D, PoolTarget(active=1, warm=0)))


def test_an_over_budget_pool_stops_warm_without_the_warm_dwell() -> None:
    """The leader says the pool spends past its budget (``over_budget``: the end of a
    failover's allowance cut 3 ACTIVE, now asleep): WARM beyond the target stops at
    once, the longest WARM first; within the budget the same replicas wait out a scaled
    pool's WARM dwell (120 s: it guards against launch churn). IDLE still waits its
    drain."""
    pool = [
        rep("a", ACTIVE, 900),
        rep("w1", WARM, 400),
        rep("w2", WARM, 11),
        rep("w3", WARM, 1),
        rep("i", IDLE, 5),
    ]
    over = plan(pool, PoolTarget(active=1, warm=0, scaled=True, over_budget=True), T0, D)
    assert [(a.kind, a.replica) for a in over.actions] == [
        ("stop", "w1"),
        ("stop", "w2"),
        ("stop", "w3"),
    ]
    assert all("over the budget: no WARM dwell" in a.reason for a in over.actions)
    within = plan(pool, PoolTarget(active=1, warm=0, scaled=True), T0, D)
    assert [(a.kind, a.replica) for a in within.actions] == [("stop", "w1")]
    assert any("w2 is WARM for 11 s < WARM dwell 120 s" in d for d in within.deferred)
    # the pool re-checks the stop with the same rule
    young = rep("w3", WARM, 1)
    overrun = PoolTarget(active=1, warm=0, scaled=True, over_budget=True)
    assert transition(young, COLD, T0, dwell_for(D, overrun)).state is COLD
    with pytest.raises(TransitionRefused, match="WARM dwell"):
        transition(young, COLD, T0, dwell_for(D, PoolTarget(active=1, warm=0, scaled=True)))
    # and only WARM: the IDLE dwell and the ACTIVE anti-flap dwell hold
    assert dwell_for(D, overrun).idle_min_s == D.scaled_idle_min_s
    assert dwell_for(D, overrun).active_min_s == D.active_min_s


def test_a_scaled_pools_warm_beyond_the_target_stops_after_the_scaled_warm_dwell() -> None:
    """WARM the scaler no longer asks for (launched for a ramp's knee that the forecast
    has since revised) stops after ``scaled_warm_min_s`` (120 s), not the pool file's
    ``warm_min_s`` (300 s); the pool file's sizes keep their 300 s, and a pool file
    with a shorter WARM dwell keeps it under the scaler too."""
    pool = [rep("a", ACTIVE, 900), rep("w1", WARM, 150), rep("w2", WARM, 100)]
    scaled = plan(pool, PoolTarget(active=1, warm=0, scaled=True), T0, D)
    assert [(a.kind, a.replica) for a in scaled.actions] == [("stop", "w1")]
    assert any("w2 is WARM for 100 s < WARM dwell 120 s" in d for d in scaled.deferred)
    filed = plan(pool, PoolTarget(active=1, warm=0), T0, D)
    assert filed.actions == ()
    assert any("w1 is WARM for 150 s < WARM dwell 300 s" in d for d in filed.deferred)
    short = DwellPolicy(warm_min_s=60.0)
    assert dwell_for(short, PoolTarget(active=1, warm=0, scaled=True)).warm_min_s == 60.0


def test_active_beyond_the_target_is_standby_and_launches_nothing() -> None:
    """A scale-down that raises WARM as it lowers ACTIVE (the scaler's planned burst):
    the drained replicas sleep into that standby, so nothing is launched for it; held
    by the ACTIVE dwell they count too (they go once it is over). Only what they leave
    short is launched."""
    cold = [rep(f"c{i}", COLD) for i in range(4)]
    old = [rep(f"a{i}", ACTIVE, 900) for i in range(5)]
    p = plan([*old, *cold], PoolTarget(active=2, warm=3, scaled=True), T0, D)
    assert sorted(a.kind for a in p.actions) == ["drain"] * 3
    young = [rep(f"a{i}", ACTIVE, 30) for i in range(5)]  # ACTIVE dwell: 120 s
    held = plan([*young, *cold], PoolTarget(active=2, warm=3, scaled=True), T0, D)
    assert held.actions == ()
    assert any("drain:" in d for d in held.deferred)
    more = plan([*old, *cold], PoolTarget(active=2, warm=5, scaled=True), T0, D)
    assert [a.kind for a in more.actions].count("launch") == 2
    assert [a.reason for a in more.of("launch")] == ["standby 3 < wanted 5"] * 2


KNEE = [  # a ramp's knee: the targets fell while three launches load (since: when begun)
    rep("a0", ACTIVE, 900),
    rep("a1", ACTIVE, 900),
    rep("w0", WARM, 400),
    rep("c0", COLD, 90, busy=True),
    rep("c1", COLD, 30, busy=True),
    rep("c2", COLD, 10, busy=True),
    rep("i0", IDLE, 5),
]


def test_launches_beyond_what_the_targets_want_are_cancelled_newest_first() -> None:
    """2 WARM wanted, 1 WARM and 3 launches: the 2 newest launches are cancelled (the
    furthest from done); the IDLE replica is not counted (it may be resumed), so a
    plan that cancels never launches. With 4 WARM wanted, or 3 more ACTIVE (the IDLE and
    WARM replicas woken for two, the launches for the third and the standby), none is."""
    p = plan(KNEE, PoolTarget(active=2, warm=2), T0, D)
    assert [line(a) for a in p.of("cancel")] == [
        "cancel c2 | 1 WARM + 3 launching > wanted 2",
        "cancel c1 | 1 WARM + 3 launching > wanted 2",
    ]
    assert not p.of("launch")
    assert not plan(KNEE, PoolTarget(active=2, warm=4), T0, D).of("cancel")
    up = plan(KNEE, PoolTarget(active=5, warm=2), T0, D)
    assert [a.kind for a in up.actions] == ["resume", "wake"]
    # the standby all woken: the launches are what will be standby, two beyond the 1
    # wanted
    both = plan(KNEE, PoolTarget(active=4, warm=1), T0, D)
    assert [line(a) for a in both.of("cancel")] == [
        "cancel c2 | 0 WARM + 3 launching > wanted 1",
        "cancel c1 | 0 WARM + 3 launching > wanted 1",
    ]


def test_a_launch_of_another_variant_is_cancelled_whatever_the_targets() -> None:
    """Launched as ``a`` before the roll to ``b`` began: up, it would be no one's
    standby (retired at once), so it is cancelled even where the standby is short."""
    pool = [rep("a0", ACTIVE, 900, variant="b"), rep("c0", COLD, 10, variant="a", busy=True)]
    p = plan(pool, PoolTarget(active=1, warm=3, variant="b"), T0, D)
    assert [line(a) for a in p.of("cancel")] == ["cancel c0 | launching as a, b wanted"]


@plans
@given(pools(), targets, dwells)
def test_a_plan_cancels_only_launches_and_never_launches_beside_a_cancel(
    pool: list[Replica], target: PoolTarget, dwell: DwellPolicy
) -> None:
    p = plan(pool, target, T0, dwell)
    by = {r.name: r for r in pool}
    cancelled = [by[a.replica] for a in p.of("cancel")]
    assert all(r.busy and r.state is COLD and r.managed for r in cancelled)
    if any(not is_stale(r, target) for r in cancelled):
        assert not [a for a in p.of("launch") if by[a.replica].managed]
        # and never below what is wanted: WARM left and launches left cover it
        after = apply(pool, p, target, T0, dwell)
        warm = sum(r.state is WARM and not r.busy and not is_stale(r, target) for r in after)
        loading = sum(
            r.busy and r.state is COLD and r.managed and not is_stale(r, target) for r in after
        )
        assert warm + loading >= target.warm
