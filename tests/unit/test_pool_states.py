"""Warm-pool states, edges, dwell times and the planner (regions.pool.states, .planner): pure,
with a fake clock (a plain float ``now``)."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from regions.pool.planner import Plan, plan
from regions.pool.states import (
    EDGES,
    DwellPolicy,
    PoolConfig,
    PoolTarget,
    Replica,
    ReplicaState,
    TransitionRefused,
    cancel_refusal,
    cancelled,
    died,
    refusal,
    transition,
)

COLD, WARM, ACTIVE, IDLE = (
    ReplicaState.COLD,
    ReplicaState.WARM,
    ReplicaState.ACTIVE,
    ReplicaState.IDLE,
)
D = DwellPolicy()  # WARM 300 s, IDLE 1800 s, ACTIVE 120 s
T0 = 1_000_000.0


def rep(
    name: str, state: ReplicaState, since: float = T0, *, managed: bool = True, busy: bool = False
) -> Replica:
    url = None if state is COLD and managed else f"http://{name}"
    return Replica(name=name, url=url, state=state, since=since, managed=managed, busy=busy)


def kinds(p: Plan) -> list[tuple[str, str]]:
    return sorted((a.kind, a.replica) for a in p.actions)


def apply(replicas: Sequence[Replica], p: Plan, now: float) -> list[Replica]:
    """What the manager does when every action succeeds."""
    by = {r.name: r for r in replicas}
    for a in p.actions:
        if a.kind == "cancel":
            by[a.replica] = cancelled(by[a.replica])
            continue
        url = f"http://{a.replica}" if a.kind == "launch" else None
        by[a.replica] = transition(by[a.replica], a.to, now, D, url)
    return list(by.values())


def states(replicas: Sequence[Replica]) -> dict[str, ReplicaState]:
    return {r.name: r.state for r in replicas}


# -- the table and the dwell times -------------------------------------------------------
def test_defaults_are_the_documented_dwell_times() -> None:
    assert (D.warm_min_s, D.idle_min_s, D.active_min_s) == (300.0, 1800.0, 120.0)


def test_cold_to_active_is_refused_with_the_way_round() -> None:
    reason = refusal(rep("r0", COLD), ACTIVE, T0 + 1e6, D)
    assert reason is not None and "never" in reason and "WARM" in reason
    with pytest.raises(TransitionRefused, match="COLD -> ACTIVE is never allowed"):
        transition(rep("r0", COLD), ACTIVE, T0 + 1e6, D)


@pytest.mark.parametrize("src", list(ReplicaState))
@pytest.mark.parametrize("dst", list(ReplicaState))
def test_only_the_table_edges_are_allowed_once_dwells_are_over(
    src: ReplicaState, dst: ReplicaState
) -> None:
    allowed = refusal(rep("r0", src), dst, T0 + 10_000, D) is None
    assert allowed == ((src, dst) in EDGES)


@pytest.mark.parametrize(
    ("src", "dst", "minimum"),
    [(IDLE, WARM, 1800.0), (WARM, COLD, 300.0), (ACTIVE, IDLE, 120.0)],
)
def test_dwell_times_hold_moves_back_until_they_are_over(
    src: ReplicaState, dst: ReplicaState, minimum: float
) -> None:
    r = rep("r0", src)
    reason = refusal(r, dst, T0 + minimum - 1, D)
    assert reason is not None and f"dwell {minimum:g} s" in reason
    assert refusal(r, dst, T0 + minimum, D) is None


def test_waking_and_resuming_never_wait() -> None:
    assert refusal(rep("r0", WARM), ACTIVE, T0, D) is None
    assert refusal(rep("r0", IDLE), ACTIVE, T0, D) is None


def test_static_endpoints_are_never_stopped_and_busy_replicas_never_moved() -> None:
    reason = refusal(rep("r0", WARM, managed=False), COLD, T0 + 1e6, D)
    assert reason is not None and "static" in reason
    reason = refusal(rep("r0", WARM, busy=True), ACTIVE, T0, D)
    assert reason is not None and "in flight" in reason


def test_transition_stamps_since_and_handles_urls() -> None:
    r = transition(rep("r0", COLD), WARM, T0 + 5, D, url="http://new")
    assert (r.state, r.since, r.url) == (WARM, T0 + 5, "http://new")
    stopped = transition(r, COLD, T0 + 400, D)
    assert stopped.url is None and stopped.since == T0 + 400


@pytest.mark.parametrize("state", list(ReplicaState))
def test_any_replica_can_die(state: ReplicaState) -> None:
    r = died(rep("r0", state, busy=True), T0 + 3)
    assert (r.state, r.since, r.url, r.busy) == (COLD, T0 + 3, None, False)
    static = died(rep("s0", state, managed=False), T0 + 3)
    assert static.state is COLD and static.url == "http://s0"  # it may come back there


def test_config_must_hold_its_own_targets() -> None:
    assert PoolConfig(active=1, warm=2).slots == 3
    assert PoolConfig(active=1, warm=2, size=5).slots == 5
    with pytest.raises(ValidationError, match="cannot hold its own targets"):
        PoolConfig(active=2, warm=2, size=3)
    with pytest.raises(ValidationError):
        PoolConfig(active=1, warm=1, extra=True)  # type: ignore[call-arg]


# -- the planner -------------------------------------------------------------------------
def test_a_fresh_pool_launches_to_warm_and_wakes_on_the_next_plan() -> None:
    target = PoolTarget(active=1, warm=2)
    pool = [rep(f"r{i}", COLD) for i in range(3)]
    first = plan(pool, target, T0, D)
    assert kinds(first) == [("launch", "r0"), ("launch", "r1"), ("launch", "r2")]
    assert first.shortfall == 1 and any("never COLD -> ACTIVE" in n for n in first.notes)
    pool = apply(pool, first, T0 + 30)
    second = plan(pool, target, T0 + 30, D)
    assert [a.kind for a in second.actions] == ["wake"] and second.shortfall == 0
    pool = apply(pool, second, T0 + 31)
    assert sorted(states(pool).values()) == [ACTIVE, WARM, WARM]
    assert plan(pool, target, T0 + 32, D).actions == ()  # steady


def test_activation_prefers_idle_replicas_most_recently_drained_first() -> None:
    pool = [
        rep("a", ACTIVE),
        rep("i_old", IDLE, T0 + 1),
        rep("i_new", IDLE, T0 + 50),
        rep("w", WARM),
    ]
    p = plan(pool, PoolTarget(active=2, warm=1), T0 + 60, D)
    assert kinds(p) == [("resume", "i_new")]
    p = plan(pool, PoolTarget(active=4, warm=0), T0 + 60, D)
    assert kinds(p) == [("resume", "i_new"), ("resume", "i_old"), ("wake", "w")]


def test_scale_down_waits_for_the_active_dwell_and_says_why() -> None:
    pool = [rep("a", ACTIVE, T0), rep("b", ACTIVE, T0 + 100)]
    p = plan(pool, PoolTarget(active=1, warm=1), T0 + 110, D)
    assert p.actions == () and len(p.deferred) == 2
    assert all("ACTIVE dwell 120 s" in d for d in p.deferred)
    p = plan(pool, PoolTarget(active=1, warm=1), T0 + 150, D)
    assert kinds(p) == [("drain", "a")]  # the longest ACTIVE goes first


def test_idle_sleeps_after_its_dwell_and_warm_beyond_target_stops_after_its_own() -> None:
    pool = [rep("a", ACTIVE), rep("i", IDLE, T0), rep("w1", WARM, T0), rep("w2", WARM, T0)]
    target = PoolTarget(active=1, warm=1)
    early = plan(pool, target, T0 + 200, D)
    assert early.actions == () and any("WARM dwell 300 s" in d for d in early.deferred)
    p = plan(pool, target, T0 + 400, D)
    assert kinds(p) == [("stop", "w1")]  # IDLE still in its dwell; one WARM too many
    p = plan(apply(pool, p, T0 + 400), target, T0 + 1800, D)
    assert kinds(p) == [("sleep", "i")]


def test_idle_counts_as_standby_for_launching_but_not_for_stopping() -> None:
    pool = [rep("a", ACTIVE), rep("i", IDLE), rep("w", WARM), rep("c", COLD)]
    assert plan(pool, PoolTarget(active=1, warm=2), T0 + 10, D).actions == ()
    pool = [rep("a", ACTIVE), rep("i", IDLE), rep("w1", WARM), rep("w2", WARM)]
    p = plan(pool, PoolTarget(active=1, warm=2), T0 + 1000, D)
    assert [a.kind for a in p.actions] == []  # IDLE may be resumed: keep both WARM


def test_launches_in_flight_are_counted_not_repeated() -> None:
    pool = [rep("a", ACTIVE), rep("c0", COLD, busy=True), rep("c1", COLD)]
    assert plan(pool, PoolTarget(active=1, warm=1), T0, D).actions == ()
    p = plan(pool, PoolTarget(active=1, warm=2), T0, D)
    assert kinds(p) == [("launch", "c1")]


def test_a_dead_managed_replica_is_relaunched_and_a_static_one_reprobed() -> None:
    pool = [rep("a", ACTIVE), rep("w", WARM), died(rep("x", WARM), T0 + 5)]
    p = plan(pool, PoolTarget(active=1, warm=2), T0 + 5, D)
    assert kinds(p) == [("launch", "x")]
    static = [rep("s0", ACTIVE, managed=False), died(rep("s1", WARM, managed=False), T0)]
    p = plan(static, PoolTarget(active=1, warm=0), T0 + 5, D)
    assert kinds(p) == [("launch", "s1")]  # adopt it when it answers again


def test_too_small_a_pool_says_so() -> None:
    pool = [rep("a", ACTIVE), rep("w", WARM)]
    p = plan(pool, PoolTarget(active=3, warm=1), T0, D)
    assert p.shortfall == 1 and kinds(p) == [("wake", "w")]
    assert any("pool too small" in n for n in p.notes)


def test_a_burst_and_its_aftermath_on_a_fake_clock() -> None:
    """Failover burst -> scale back -> IDLE dwell -> WARM -> one stopped after its WARM
    dwell (3 WARM > target 2); no COLD -> ACTIVE ever."""
    pool = [rep("r0", ACTIVE), rep("r1", WARM), rep("r2", WARM), rep("r3", COLD)]
    small, big = PoolTarget(active=1, warm=2), PoolTarget(active=3, warm=1)
    seen: list[tuple[ReplicaState, ReplicaState]] = []
    now = T0
    for target, until in ((big, T0 + 600), (small, T0 + 4000)):
        while now < until:
            p = plan(pool, target, now, D)
            before = {r.name: r.state for r in pool}
            pool = apply(pool, p, now)
            seen += [(before[a.replica], a.to) for a in p.actions]
            now += 30.0
    assert (COLD, ACTIVE) not in seen and set(seen) <= set(EDGES)
    assert sorted(states(pool).values()) == [ACTIVE, COLD, WARM, WARM]
    assert seen.count((ACTIVE, IDLE)) == 2 and seen.count((IDLE, WARM)) == 2


# -- properties ----------------------------------------------------------------------------
replica_sets = st.lists(
    st.tuples(
        st.sampled_from(list(ReplicaState)), st.floats(0, 4000), st.booleans(), st.booleans()
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(replica_sets, st.integers(0, 8), st.integers(0, 8))
def test_every_planned_action_is_an_allowed_edge_once_per_replica(
    specs: list[tuple[ReplicaState, float, bool, bool]], active: int, warm: int
) -> None:
    now = T0 + 4000
    pool = [
        rep(f"r{i}", s, T0 + since, managed=m, busy=b) for i, (s, since, m, b) in enumerate(specs)
    ]
    p = plan(pool, PoolTarget(active=active, warm=warm), now, D)
    by = {r.name: r for r in pool}
    assert len({a.replica for a in p.actions}) == len(p.actions)
    for a in p.actions:
        if a.kind == "cancel":
            assert cancel_refusal(by[a.replica]) is None, a
        else:
            assert refusal(by[a.replica], a.to, now, D) is None, a
    after = apply(pool, p, now)
    reachable = sum(r.state is ACTIVE or (r.state in (IDLE, WARM) and not r.busy) for r in pool)
    assert sum(r.state is ACTIVE for r in after) >= min(active, reachable)  # scale-up now


def test_only_a_managed_slot_being_launched_can_have_its_launch_cancelled() -> None:
    loading = rep("c", COLD, busy=True)
    assert cancelled(loading) == loading.model_copy(update={"busy": False})
    for r in (rep("c", COLD), rep("s", COLD, managed=False, busy=True), rep("w", WARM)):
        assert cancel_refusal(r) is not None
        with pytest.raises(TransitionRefused, match="no launch of ours in flight"):
            cancelled(r)


def test_the_pure_modules_import_no_io() -> None:
    allowed = {
        "__future__",
        "collections",
        "enum",
        "math",
        "typing",
        "pydantic",
        "regions",
        "controlplane",
    }
    pure = ("states", "planner", "plan_phases", "lending")
    root = Path(__file__).parents[2]
    # the sizing formula lives in the kernel (failoverctl doctor uses it too)
    files = [root / "regions" / "pool" / f"{m}.py" for m in pure]
    files.append(root / "controlplane" / "kernel" / "pool" / "sizing.py")
    kernel = {"controlplane.kernel.model", "controlplane.kernel.pool.sizing"}
    for path in files:
        name = path.name
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
                if node.module and node.module.startswith("regions."):
                    assert node.module in {f"regions.pool.{m}" for m in pure}
                if node.module and node.module.startswith("controlplane."):
                    assert node.module in kernel  # Frozen and the formula only
            else:
                continue
            assert roots <= allowed, (name, roots)
