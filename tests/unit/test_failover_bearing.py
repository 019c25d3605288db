"""Failover planning on measured, prefix-aware capacity (docs/capacity.md). Pure, on World."""

from __future__ import annotations

import pytest

from controlplane.core.bearing import allowed_now, cbu_now
from controlplane.core.failover import plan_failover, resplit_after_prewarm
from controlplane.core.ladder_tick import ladder_moves
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import (
    CapacityPolicy,
    CapacityRecord,
    CapacitySource,
    HitProbe,
    WorkloadProfile,
    resolve,
)
from controlplane.kernel.ladder.file import load_ladder
from controlplane.kernel.ladder.model import CBU_SIGNAL, Conditions, with_headroom
from controlplane.kernel.model import FailoverPlan, Health, RegionHealth
from tests.unit.world import World

DAY = 86400.0


def record(
    region: str,
    r_base: float,
    beta: float = 0.85,
    *,
    at: float = 1000.0,
    fos: float = 2.0,
    engine: str = "0.11.0",
    replicas: int = 1,
) -> CapacityRecord:
    probe = HitProbe(hit_rate=0.0, baseline_p99_s=0.1, ultimate_rps=r_base, ultimate_bounded=True)
    return CapacityRecord(
        region=region,
        measured_at=at,
        engine_version=engine,
        replica=f"http://{region}-0:8000",
        slo=CapacitySLO(ttft_p99_s=1.0),
        factor_of_safety=fos,
        probes=(probe,),
        r_base_rps=r_base,
        beta=beta,
        active_replicas=replicas,
        profile=WorkloadProfile(
            prompt_tokens_p50=500, prompt_tokens_p90=2000, output_tokens=64, shared_prefix_share=0.5
        ),
    )


def world(load: dict[str, float], hit: dict[str, float] | None = None) -> World:
    w = World()
    for r in w.topo.names:
        signals = {"load_rps": load.get(r, 0.0), "prefix_hit_rate": (hit or {}).get(r, 0.0)}
        verdict = Health.UNHEALTHY if r == "us-east" else Health.HEALTHY
        w.health[r] = RegionHealth(region=r, verdict=verdict, signals=signals)
    return w


def plan(w: World) -> FailoverPlan:
    return plan_failover(w.snapshot(), w.topo, "us-east", reason="test", actor="t")


def test_typed_capacity_overloads_one_target_and_measured_capacity_splits_the_load() -> None:
    # us-east serves 60 rps at a hit rate of 0.6. Typed, us-west (capacity_rps 100, idle)
    # has more headroom than us-central (50, 20 served): it would take 60/(100+30) = 46 %...
    w = world({"us-east": 60.0, "us-central": 20.0}, hit={"us-central": 0.5, "us-west": 0.7})
    typed = plan(w)
    # ...and here the typed figures are wrong: us-west's two replicas bear 18 rps each cold
    # (factor of safety 2: 18 allowed cold), us-central's four bear 30 cold each (60 allowed).
    w.capacity = {
        "us-west": record("us-west", 18.0),
        "us-central": record("us-central", 30.0),
    }
    w.active_replicas = {"us-west": 2, "us-central": 4}
    snap = w.snapshot()
    west, central = snap.regions["us-west"], snap.regions["us-central"]
    # Typed: us-west 100 allowed, takes ~46 % of 60 rps cold: ~27.7 rps > its 18 cold.
    assert typed.targets["us-west"] * 60 > allowed_at_cold(w, "us-west")
    measured = plan(w)
    assert not measured.headroom_short and measured.shortfall_rps == 0
    assert set(measured.cbu_after) == {"us-west", "us-central"}
    assert all(c <= 1.0 + 1e-6 for c in measured.cbu_after.values())
    # us-central is busier but bears more: it takes the larger share now.
    assert measured.targets["us-central"] > measured.targets["us-west"]
    assert any("us-west: measured capacity" in n for n in measured.notes)
    # The served load at its own hit rate counts: us-central's 20 rps at h=0.5 use
    # 20 / (120 / (1 - 0.425) / 2) of it.
    assert cbu_now(central, w.topo, w.now) == pytest.approx(20 / (120 / (1 - 0.425) / 2))
    assert allowed_now(west, w.topo, w.now) == pytest.approx(36 / (1 - 0.85 * 0.7) / 2)


def allowed_at_cold(w: World, region: str) -> float:
    rec = w.capacity.get(region)
    n = w.active_replicas.get(region, 1)
    return rec.allowed_rps(0.0, n) if rec else 1e9


def test_targets_too_small_make_a_shortfall_the_plan_states_and_the_ladder_acts_on() -> None:
    w = world({"us-east": 90.0})
    w.capacity = {"us-west": record("us-west", 20.0), "us-central": record("us-central", 20.0)}
    w.active_replicas = {"us-west": 2, "us-central": 1}
    p = plan(w)
    # Cold: us-west bears 40/2 = 20, us-central 10: 30 of 90 rps.
    assert p.headroom_short and p.shortfall_rps == pytest.approx(60.0)
    assert p.cbu_after == pytest.approx({"us-west": 1.0, "us-central": 1.0})
    assert p.targets == pytest.approx({"us-west": 2 / 3, "us-central": 1 / 3}, abs=1e-5)
    assert any("short by 60.0 rps" in n and "shedding low priority" in n for n in p.notes)
    # Carried out, the failover records the shortfall; with it the targets' ladders
    # degrade (shedding is a step of the ladder) as soon as their triggers fire, which
    # they would not do for a region in NORMAL that no failover leans on.
    w.all_report("us-east", Health.UNHEALTHY, load_rps=90.0)
    for r in ("us-west", "us-central"):
        w.all_report(r, Health.HEALTHY, load_rps=0.0)
    for _ in range(4):
        w.tick()
    rec = w.records["us-east"][0]
    assert rec.failover is not None and rec.failover.plan.shortfall_rps == pytest.approx(60.0)
    busy = {"load_rps": 19.0, "prefix_hit_rate": 0.0}  # us-west at CBU 0.95
    w.health["us-west"] = RegionHealth(region="us-west", verdict=Health.HEALTHY, signals=busy)
    writes, _ = ladder_moves(w.snapshot(), w.topo, load_ladder(), "t")
    assert [(x.region, x.kind) for x in writes] == [("us-west", "apply")]
    assert "headroom 5% < 20%" in writes[0].audit.reason


def test_a_stale_or_foreign_engine_measurement_falls_back_to_the_typed_capacity() -> None:
    policy = CapacityPolicy(max_age_s=7 * DAY)
    rec = record("eu", 50.0, at=0.0)
    fresh = resolve("eu", rec, capacity_rps=10, policy=policy, now=DAY, active_replicas=2)
    assert fresh.source is CapacitySource.MEASURED
    assert fresh.allowed(0.0) == pytest.approx(50.0)  # 2 x 50 / 2
    old = resolve("eu", rec, capacity_rps=10, policy=policy, now=8 * DAY, active_replicas=2)
    assert old.source is CapacitySource.STALE and old.allowed(0.9) == 10.0
    assert "8.0 days ago" in old.reason
    other = resolve(
        "eu", rec, capacity_rps=10, policy=policy, now=DAY, active_replicas=2, engine_version="0.12"
    )
    assert other.source is CapacitySource.STALE and "0.12" in other.reason
    # An engine not known (no agent said; a probe of an engine without /version) is
    # not judged: only age makes such a probe stale.
    for rec_engine, region_engine in (("0.11.0", ""), ("", "0.12")):
        unknown = resolve(
            "eu",
            rec.model_copy(update={"engine_version": rec_engine}),
            capacity_rps=10,
            policy=policy,
            now=DAY,
            active_replicas=2,
            engine_version=region_engine,
        )
        assert unknown.source is CapacitySource.MEASURED
    none = resolve("eu", None, capacity_rps=10, policy=policy, now=DAY, active_replicas=2)
    assert none.source is CapacitySource.TYPED and none.allowed(0.5) == 10.0


def test_capacity_utilisation_is_a_ladder_signal_and_trigger() -> None:
    signals = with_headroom({"load_rps": 110.0}, capacity_rps=100.0)
    assert signals[CBU_SIGNAL] == pytest.approx(1.1)
    assert Conditions(cbu_over=1.0).holding(signals, 0.5) == ("capacity utilisation 1.10 > 1",)
    assert Conditions(cbu_over=1.2).holding(signals, 0.5) == ()
    assert CBU_SIGNAL not in with_headroom({}, capacity_rps=100.0)  # no load: no evidence


def test_a_planned_failover_splits_again_at_its_switch_by_what_the_prewarm_warmed() -> None:
    w = world({"us-east": 60.0}, hit={"us-east": 0.8})
    w.capacity = {"us-west": record("us-west", 20.0), "us-central": record("us-central", 20.0)}
    w.active_replicas = {"us-west": 2, "us-central": 1}
    cold = plan(w)  # bears 30 of 60 cold
    assert cold.shortfall_rps == pytest.approx(30.0)
    snap = w.snapshot()
    warm = resplit_after_prewarm(snap, w.topo, cold, attained=1.0)
    # warm at h = 0.8: each bears 1 / (1 - 0.85 x 0.8) = 3.125 x as much: 93.75 in all.
    assert warm.shortfall_rps == 0 and not warm.headroom_short
    assert max(warm.cbu_after.values()) <= 1.0
    assert warm.notes[-1].startswith("split again after the pre-warm: the moved traffic at hit")
    half = resplit_after_prewarm(snap, w.topo, cold, attained=0.5)  # h = 0.4: x 1.515
    assert half.shortfall_rps == pytest.approx(60 - 30 / (1 - 0.85 * 0.4), rel=1e-3)
    assert resplit_after_prewarm(snap, w.topo, cold, attained=None) == cold
