"""Degradation step 1 at the region agent, the pure parts: which variant the ladder
wants, the pool planner's roll between variants (one at a time, never below the ACTIVE
target), the roll's progress and story, the launch argv of each variant, the
simulator's spec-decode counters, and the actuator's first read on an in-memory store."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.codec import encode
from controlplane.kernel.config import ConfigError
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import DegradationRecord, FeatureFlags
from controlplane.kernel.store.memory import MemoryStore
from regions.agent.pool_config import parse_pool_config
from regions.agent.spec_decode_actuator import SpecDecodeActuator
from regions.agent.warm_pool import AgentPool, PoolPublishing
from regions.pool.launchers import SimulatorLauncher, VllmSpec, vllm_command
from regions.pool.manager import WarmPool
from regions.pool.planner import Plan, plan
from regions.pool.spec_decode import (
    NO_SPEC_DECODE,
    SPEC_DECODE,
    active_with_spec_decode,
    progress_line,
    roll_progress,
    switch_line,
    wanted_variant,
)
from regions.pool.states import (
    DwellPolicy,
    PoolConfig,
    PoolTarget,
    Replica,
    ReplicaState,
    cancel_refusal,
    cancelled,
    is_stale,
    refusal,
    transition,
)
from regions.simulator.metrics import EngineStats, SpecDecodeStats
from regions.simulator.server import SimConfig, Simulator, spec_decode_stats

COLD, WARM, ACTIVE, IDLE = (
    ReplicaState.COLD,
    ReplicaState.WARM,
    ReplicaState.ACTIVE,
    ReplicaState.IDLE,
)
SPEC, PLAIN = SPEC_DECODE, NO_SPEC_DECODE
D = DwellPolicy(warm_min_s=300, idle_min_s=1800, active_min_s=120, drain_s=10)
T0 = 1_000_000.0
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


def rep(name: str, state: ReplicaState, variant: str | None = SPEC, since: float = T0) -> Replica:
    url = None if state is COLD else f"http://{name}"
    return Replica(
        name=name, url=url, state=state, since=since, variant=None if state is COLD else variant
    )


def apply(replicas: Sequence[Replica], p: Plan, target: PoolTarget, now: float) -> list[Replica]:
    """What the manager does when every action succeeds (launches take the target's
    variant, like ``WarmPool._apply``)."""
    by = {r.name: r for r in replicas}
    for a in p.actions:
        r = by[a.replica]
        if a.kind == "cancel":
            by[a.replica] = cancelled(r)
            continue
        if a.kind == "launch":
            r = r.model_copy(update={"variant": target.variant})
        url = f"http://{a.replica}" if a.kind == "launch" else None
        by[a.replica] = transition(r, a.to, now, D, url, retiring=a.retire)
    return list(by.values())


def count(replicas: Sequence[Replica], state: ReplicaState, variant: str | None = None) -> int:
    return sum(r.state is state and (variant is None or r.variant == variant) for r in replicas)


def roll(
    pool: list[Replica], target: PoolTarget, start: float, ticks: int = 40
) -> tuple[list[Replica], list[int], float]:
    """Plan and apply every 5 s; the ACTIVE count after each tick, and when it settled."""
    now, actives, settled = start, [], start
    for _ in range(ticks):
        p = plan(pool, target, now, D)
        after = apply(pool, p, target, now)
        actives.append(count(after, ACTIVE))
        if after != pool:
            settled = now
        pool, now = after, now + 5
    return pool, actives, settled


# -- which variant ---------------------------------------------------------------------
def test_the_ladder_flag_picks_the_variant() -> None:
    assert wanted_variant(None) == SPEC  # no record: nothing degraded
    off = DegradationRecord(
        region="eu",
        applied=("speculative_decoding_off",),
        flags=FeatureFlags(speculative_decoding=False),
        epoch=1,
    )
    assert wanted_variant(off) == PLAIN
    assert wanted_variant(off.model_copy(update={"flags": FeatureFlags()})) == SPEC


def test_staleness_is_the_variant_against_the_target() -> None:
    t = PoolTarget(active=1, warm=1, variant=PLAIN)
    assert is_stale(rep("a", ACTIVE, SPEC), t) and not is_stale(rep("b", ACTIVE, PLAIN), t)
    assert not is_stale(rep("c", WARM, None), t)  # unknown (a static endpoint): never
    assert not is_stale(rep("d", ACTIVE, SPEC), PoolTarget(active=1, warm=1))  # no target
    assert not is_stale(Replica(name="e", variant=SPEC), t)  # an empty slot is free for any
    launching = Replica(name="f", busy=True, variant=SPEC)
    assert is_stale(launching, t)  # launched as the old variant: no standby of the new


# -- the planner's roll ----------------------------------------------------------------
def test_a_roll_replaces_one_replica_at_a_time_never_below_the_target() -> None:
    pool = [rep("r0", ACTIVE), rep("r1", ACTIVE), rep("r2", WARM)]
    target = PoolTarget(active=2, warm=1, variant=PLAIN)
    pool, actives, _ = roll(pool, target, T0 + 1000)
    assert min(actives) >= 2 and max(actives) <= 3  # never below, at most one extra
    assert count(pool, ACTIVE, PLAIN) == 2 and count(pool, WARM, PLAIN) == 1
    assert not any(is_stale(r, target) for r in pool)


def test_the_first_step_wakes_a_fresh_replica_and_only_then_drains() -> None:
    target = PoolTarget(active=1, warm=1, variant=PLAIN)
    pool = [rep("old", ACTIVE), rep("new", WARM, PLAIN)]
    first = plan(pool, target, T0 + 1000, D)
    assert [(a.kind, a.replica) for a in first.actions] == [("wake", "new")]
    assert "roll to no-spec-decode" in first.actions[0].reason
    pool = apply(pool, first, target, T0 + 1000)
    second = plan(pool, target, T0 + 1005, D)
    assert [(a.kind, a.replica) for a in second.actions] == [("drain", "old")]
    assert "replaced" in second.actions[0].reason


def test_stale_replicas_are_never_woken_nor_count_as_standby() -> None:
    target = PoolTarget(active=2, warm=1, variant=PLAIN)
    pool = [rep("a", ACTIVE, PLAIN), rep("w", WARM, SPEC), rep("c", COLD)]
    p = plan(pool, target, T0 + 1000, D)
    kinds = sorted((a.kind, a.replica) for a in p.actions)
    assert kinds == [("launch", "c"), ("stop", "w")]  # retired at once, no WARM dwell
    assert next(a for a in p.actions if a.kind == "stop").retire


def test_the_anti_flap_dwell_holds_a_stale_drain_and_drain_s_its_retirement() -> None:
    target = PoolTarget(active=1, warm=0, variant=PLAIN)
    fresh_old = [rep("old", ACTIVE, SPEC, since=T0), rep("new", ACTIVE, PLAIN, since=T0)]
    p = plan(fresh_old, target, T0 + 60, D)  # old ACTIVE for 60 s < 120 s
    assert not p.actions and any("ACTIVE dwell 120" in d for d in p.deferred)
    drained = [rep("old", IDLE, SPEC, since=T0), rep("new", ACTIVE, PLAIN, since=T0)]
    p = plan(drained, target, T0 + 5, D)  # requests sent before gateways saw it leave
    assert not p.actions and any("drain 10" in d for d in p.deferred)
    p = plan(drained, target, T0 + 10, D)  # drain_s over; IDLE dwell (1800 s) not needed
    assert [(a.kind, a.retire) for a in p.actions] == [("sleep", True)]
    assert refusal(drained[0], WARM, T0 + 10, D) is not None  # a fresh one would wait


def test_a_pool_without_a_spare_slot_says_what_the_roll_waits_for() -> None:
    target = PoolTarget(active=1, warm=0, variant=PLAIN)
    p = plan([rep("only", ACTIVE)], target, T0 + 1000, D)
    assert not p.actions and any("pool too small" in n for n in p.notes)
    assert any("roll to no-spec-decode: 1 ACTIVE" in n for n in p.notes)


def test_flag_back_on_rolls_back_through_a_larger_pool() -> None:
    pool = [rep("r0", ACTIVE, PLAIN), rep("r1", WARM, PLAIN), rep("r2", COLD)]
    target = PoolTarget(active=1, warm=2, variant=SPEC)
    pool, actives, settled = roll(pool, target, T0 + 1000)
    assert min(actives) >= 1 and max(actives) <= 2
    assert count(pool, ACTIVE, SPEC) == 1 and count(pool, WARM, SPEC) == 2
    # Settled: planning again changes nothing (idempotent, level-triggered).
    assert plan(pool, target, settled + 1000, D).actions == ()


variants = st.sampled_from([SPEC, PLAIN, None])
replica_sets = st.lists(
    st.tuples(st.sampled_from(list(ReplicaState)), st.floats(0, 4000), variants, st.booleans()),
    max_size=7,
)


@settings(max_examples=300, deadline=None)
@given(replica_sets, st.integers(0, 4), st.integers(0, 3), st.sampled_from([SPEC, PLAIN]))
def test_a_plan_never_takes_active_below_the_target_nor_wakes_the_stale(
    specs: list[tuple[ReplicaState, float, str | None, bool]],
    active: int,
    warm: int,
    variant: str,
) -> None:
    now = T0 + 4000
    pool = [
        rep(f"r{i}", s, v, T0 + since).model_copy(update={"busy": b and s is COLD})
        for i, (s, since, v, b) in enumerate(specs)
    ]
    target = PoolTarget(active=active, warm=warm, variant=variant)
    p = plan(pool, target, now, D)
    by = {r.name: r for r in pool}
    for a in p.actions:
        if a.kind == "cancel":
            assert cancel_refusal(by[a.replica]) is None, a
            continue
        assert refusal(by[a.replica], a.to, now, D, retiring=a.retire) is None, a
        if a.kind in ("wake", "resume"):
            assert not is_stale(by[a.replica], target), a
    before = count(pool, ACTIVE)
    after = apply(pool, p, target, now)
    assert count(after, ACTIVE) >= min(before, target.active)
    stale_active = sum(r.state is ACTIVE and is_stale(r, target) for r in pool)
    assert count(after, ACTIVE) <= max(before, target.active + (1 if stale_active else 0))


# -- progress and story ------------------------------------------------------------------
def test_progress_is_read_from_what_runs_and_told_when_it_moves() -> None:
    target = PoolTarget(active=2, warm=1, variant=PLAIN)
    start = [rep("r0", ACTIVE), rep("r1", ACTIVE), rep("r2", WARM)]
    p0 = roll_progress(start, target)
    assert (p0.active_wanted, p0.active_other, p0.retiring, p0.done) == (0, 2, 1, False)
    assert active_with_spec_decode(start) == 2
    off = DegradationRecord(
        region="eu",
        applied=("speculative_decoding_off",),
        flags=FeatureFlags(speculative_decoding=False),
        epoch=4,
        reason="ttft p99 2.3x baseline",
    )
    line = switch_line("eu", off, SPEC, PLAIN, p0)
    assert "speculative decoding OFF" in line and "epoch 4" in line and "rolling 2" in line
    assert "never below 2 ACTIVE" in line and "ttft p99" in line
    assert progress_line("eu", p0, p0, 1.0) is None  # nothing moved: nothing said
    mid = roll_progress(
        [rep("r0", ACTIVE), rep("r1", ACTIVE, PLAIN), rep("r2", ACTIVE, PLAIN)], target
    )
    said = progress_line("eu", p0, mid, 3.0)
    assert said is not None and "2/2 ACTIVE on it, 1 ACTIVE still on the other" in said
    end = roll_progress([rep("r1", ACTIVE, PLAIN), rep("r2", ACTIVE, PLAIN)], target)
    said = progress_line("eu", mid, end, 9.5)
    assert end.done and said is not None and "done after 9.5 s" in said
    assert progress_line("eu", end, end, 20.0) is None
    with pytest.raises(ValueError, match="target variant"):
        roll_progress(start, PoolTarget(active=1, warm=0))


# -- launching each variant -----------------------------------------------------------
def test_vllm_argv_has_the_speculative_config_only_for_its_variant(tmp_path: Path) -> None:
    spec = VllmSpec(model="m", python="/usr/bin/python3", speculative_config=NGRAM)
    with_it = vllm_command(spec, 8000, tmp_path, variant=SPEC).argv
    default = vllm_command(spec, 8000, tmp_path).argv
    without = vllm_command(spec, 8000, tmp_path, variant=PLAIN).argv
    i = with_it.index("--speculative-config")
    assert with_it[i + 1] == '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'
    assert default == with_it and "--speculative-config" not in without
    assert "--speculative-config" not in vllm_command(VllmSpec(model="m"), 8000, tmp_path).argv
    with pytest.raises(ValueError, match="empty"):
        VllmSpec(model="m", speculative_config={})


async def test_launchers_know_their_variants_and_refuse_others() -> None:
    assert SimulatorLauncher(speculative_config=NGRAM).variants == (SPEC, PLAIN)
    assert SimulatorLauncher().variants == ()
    with pytest.raises(RuntimeError, match="variant 'spec-decode' unknown"):
        await SimulatorLauncher().launch(SPEC)


def test_a_pool_with_a_speculative_config_needs_a_slot_to_roll() -> None:
    with pytest.raises(ConfigError, match="slot beyond its 1 ACTIVE"):
        parse_pool_config(
            {"launcher": {"kind": "simulator", "speculative_config": NGRAM}, "active": 1, "warm": 0}
        )
    cfg = parse_pool_config(
        {
            "launcher": {"kind": "simulator", "speculative_config": NGRAM},
            "active": 1,
            "warm": 0,
            "size": 2,
        }
    )
    assert cfg.launcher.build().variants == (SPEC, PLAIN)
    with pytest.raises(ConfigError, match="speculative_config is empty"):
        parse_pool_config({"launcher": {"kind": "vllm", "speculative_config": {}}})


# -- the simulator's counters ---------------------------------------------------------------
def test_spec_decode_counters_follow_vllms_per_step_accounting() -> None:
    sd = SpecDecodeStats(num_spec_tokens=3, accepted_per_draft=2)
    for i in range(7):  # 7 decode tokens: steps of 3 (2 accepted + bonus): 3 + 3 + 1
        sd.observe_decode_token(i)
    assert (sd.drafts, sd.draft_tokens, sd.accepted) == (3, 9, 4)
    assert sd.accepted_per_pos == [2, 2, 0]
    assert sd.drafts + sd.accepted == 7  # every decode token accounted for once


def test_the_simulator_exports_spec_decode_metrics_only_with_a_config() -> None:
    plain = Simulator(SimConfig())
    assert "spec_decode" not in plain.engine.metrics_text()
    sim = Simulator(SimConfig(speculative_config=NGRAM))
    text = sim.engine.metrics_text()
    for name in (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ):
        assert f'{name}{{engine="0",model_name="tiny"}} 0.0' in text
    assert (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",'
        'position="2"} 0.0' in text
    )
    assert sim.engine.config.decode_tokens_per_s == 3 * plain.engine.config.decode_tokens_per_s
    assert isinstance(sim.engine.stats, EngineStats) and spec_decode_stats(None) is None
    with pytest.raises(ValueError, match="positive integer"):
        spec_decode_stats({"num_speculative_tokens": "3"})


# -- the actuator's first read ---------------------------------------------------------------
async def test_prime_reads_the_flag_before_the_pool_launches(memory_store: MemoryStore) -> None:
    keys = Keys("unit")
    off = DegradationRecord(
        region="eu",
        applied=("speculative_decoding_off",),
        flags=FeatureFlags(speculative_decoding=False),
        epoch=2,
    )
    await memory_store.put(keys.degradation("eu"), encode(off))
    cfg = parse_pool_config({"launcher": {"kind": "simulator", "speculative_config": NGRAM}})
    agent_pool = AgentPool("eu", cfg, PoolPublishing("unit", memory_store), interval_s=0.1)
    assert isinstance(agent_pool.spec_decode, SpecDecodeActuator)
    assert agent_pool.pool.variant == SPEC
    await agent_pool.spec_decode.prime()
    assert agent_pool.pool.variant == PLAIN  # COLD slots now launch without it
    assert agent_pool.signals() == {
        "replicas_warm": 0.0,
        "pool_shortfall": 0.0,
        "spec_decode_wanted": 0.0,
        "spec_decode_active": 0.0,
        "spec_decode_roll_left": 0.0,
    }
    memory_store.set_available(False)  # etcd away at start: the configured default
    again = AgentPool("eu", cfg, PoolPublishing("unit", memory_store), interval_s=0.1)
    assert isinstance(again.spec_decode, SpecDecodeActuator)
    await again.spec_decode.prime(timeout_s=0.5)
    assert again.pool.variant == SPEC and again.signals()["spec_decode_wanted"] == 1.0
    pool = WarmPool(SimulatorLauncher(speculative_config=NGRAM), PoolConfig())
    with pytest.raises(ValueError, match="not one of the launcher's"):
        pool.set_variant("medusa")
