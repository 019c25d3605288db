"""The scaler in the leader's cycle (tests/unit/world.py: the real snapshot reader,
``decide`` and orchestrator on an in-memory store, a fake clock): ``scale/<unit>``
records written fenced, audited when the size changes, checkpointed otherwise; a new
leader continues from the record; paused automation and no ``scaling:`` write nothing."""

from __future__ import annotations

import asyncio
import math

import pytest

from controlplane.core.scale_tick import moving_loads
from controlplane.core.scaler import Capacity, Moving, PoolSignals, size_pool
from controlplane.kernel.codec import decode
from controlplane.kernel.model import (
    AuditAction,
    ControlFlags,
    FailoverPlan,
    FailoverProgress,
    FailoverStep,
    Health,
    HealthReport,
    ObserverKind,
    PrewarmFigures,
    RegionHold,
    RegionRecord,
    RegionState,
)
from controlplane.kernel.pool.scale import ScaleRecord, ScalingPolicy
from controlplane.metrics import ControlPlaneMetrics
from tests.unit.world import World, topology

POLICY = ScalingPolicy(horizon_s=30, stable_window_s=60, burst_warm=1, checkpoint_s=10)


def scaled_world(policy: ScalingPolicy | None = POLICY) -> World:
    return World(topo=topology().model_copy(update={"scaling": policy}))


def agent_report(w: World, region: str, load: float, **more: float) -> None:
    w.reports[(region, f"agent:{region}")] = HealthReport(
        region=region,
        observer=f"agent:{region}",
        kind=ObserverKind.AGENT,
        health=Health.HEALTHY,
        signals={"load_rps_raw": load, "load_rps": load, **more},
        received_at=w.now,
    )


def scale_record(w: World, unit: str) -> ScaleRecord | None:
    async def read() -> ScaleRecord | None:
        kv = await w.store.get(w.keys.scale(unit))
        return None if kv is None else decode(ScaleRecord, kv.value)

    return asyncio.run(read())


def run(w: World, seconds: int, load: dict[str, float], **more: float) -> None:
    for _ in range(seconds):
        for region, rps in load.items():
            agent_report(w, region, rps, **more)
        w.tick()


def test_every_pool_gets_a_record_and_a_change_is_audited_with_its_reasons() -> None:
    w = scaled_world()
    w.active_replicas = {"us-east": 2, "us-west": 2}
    run(w, 20, {"us-east": 30.0, "us-west": 180.0})
    east, west = scale_record(w, "us-east"), scale_record(w, "us-west")
    assert east is not None and west is not None
    # typed capacity_rps 100 over 2 replicas: 50 rps each; 180 rps needs 4 or more
    assert west.active >= 4 and east.active <= west.active
    assert "typed capacity_rps 100 / 2 replicas" in west.reasons[0]
    scaled = [e for e in w.audit if e.action is AuditAction.SCALE and e.region == "us-west"]
    assert scaled and scaled[-1].details["active"] == str(west.active)
    assert "forecast" in scaled[-1].reason
    # no agent ever reported for eu-west: its size holds at what serves, said why
    eu = scale_record(w, "eu-west")
    assert eu is not None and "signal dark" in eu.reasons[0]


def test_a_checkpoint_keeps_the_forecast_and_a_new_leader_continues_it() -> None:
    w = scaled_world()
    w.active_replicas = {"us-east": 2}
    for i in range(40):  # a ramp: 20 -> 176 rps
        run(w, 1, {"us-east": 20.0 + 4.0 * i})
    before = scale_record(w, "us-east")
    assert before is not None and before.forecast is not None
    assert w.now - before.decided_at <= POLICY.checkpoint_s  # written at least that often
    checkpoints = [r for r in w.results if any(x.audit is None for x in r.scale)]
    assert checkpoints  # written without an audit entry when nothing changed
    w.orchestrator.sizes = {}  # leadership changed hands: only etcd's record is left
    run(w, int(POLICY.checkpoint_s) + 1, {"us-east": 180.0})  # a checkpoint falls due
    after = scale_record(w, "us-east")
    assert after is not None and after.forecast is not None
    assert after.active >= before.active
    assert after.forecast.observations > before.forecast.observations  # continued
    assert after.forecast.trend > 1.0


def test_paused_automation_and_no_scaling_section_write_nothing() -> None:
    w = scaled_world()
    w.control = ControlFlags(paused=True, reason="maintenance")
    run(w, 5, {"us-east": 100.0})
    assert scale_record(w, "us-east") is None
    off = scaled_world(None)
    run(off, 5, {"us-east": 100.0})
    assert scale_record(off, "us-east") is None
    assert not any(e.action is AuditAction.SCALE for e in off.audit)


def test_a_held_unit_keeps_its_size_while_the_others_are_sized() -> None:
    w = scaled_world()
    w.holds["us-east"] = RegionHold(unit="us-east", reason="r", actor="a", at=0, until=9e9)
    run(w, 5, {"us-east": 100.0, "us-west": 100.0})
    assert scale_record(w, "us-east") is None and scale_record(w, "us-west") is not None


def test_failover_targets_are_sized_for_the_moved_load_and_come_back_down_after() -> None:
    w = scaled_world(ScalingPolicy(horizon_s=30, stable_window_s=60, burst_warm=0))
    w.active_replicas = dict.fromkeys(w.topo.names, 2)  # typed: 50 rps per replica
    load = {"us-east": 150.0, "us-west": 20.0, "us-central": 20.0, "eu-west": 20.0}

    def observe(east: Health) -> None:
        for r, rps in load.items():
            health = east if r == "us-east" else Health.HEALTHY
            w.all_report(r, health, load_rps=rps, load_rps_raw=rps)
        w.tick()

    for _ in range(30):
        observe(Health.HEALTHY)
    before = {r: rec.active for r in w.topo.names if (rec := scale_record(w, r))}
    for _ in range(6):
        observe(Health.UNHEALTHY)
    assert w.state("us-east") == "FAILING_OVER"
    plan = w.records["us-east"][0].failover.plan  # type: ignore[union-attr]
    assert plan.moved_rps == 150.0
    for target, weight in plan.targets.items():
        rec = scale_record(w, target)
        assert rec is not None and rec.incoming is not None
        assert rec.incoming.source == "us-east"
        # its own 20 rps and its share of the 150 moved, cold: 50 rps per replica
        assert rec.active >= math.ceil((20.0 + 150.0 * weight) / 50)
        assert any("failover from us-east" in r for r in rec.reasons)
    source = scale_record(w, "us-east")
    assert source is not None and source.active >= before["us-east"]  # kept to come back
    peak = {t: scale_record(w, t).active for t in plan.targets}  # type: ignore[union-attr]

    while w.state("us-east") != "NORMAL":  # healthy again: recovery walks traffic home
        observe(Health.HEALTHY)
        assert w.now < 2000, w.state("us-east")
    for _ in range(120):  # the stable window, then the targets' extra replicas go
        observe(Health.HEALTHY)
    for target in plan.targets:
        rec = scale_record(w, target)
        assert rec is not None and rec.incoming is None
        assert rec.active == 1 < peak[target]  # 20 rps of its own: one replica
        assert any(
            e.action is AuditAction.SCALE
            and e.region == target
            and e.details["active"] == str(rec.active)
            for e in w.audit
        )


def test_the_leader_exports_each_pools_desired_replicas_and_forecast() -> None:
    w = scaled_world()
    w.active_replicas = {"us-east": 2}
    run(w, 12, {"us-east": 120.0})
    metrics = ControlPlaneMetrics()
    get = metrics.registry.get_sample_value
    metrics.tick_done(leader=True, snapshot=w.snapshot(), result=w.results[-1])
    east = w.results[-1].sizes["us-east"]
    labels = {"region": "us-east"}
    assert get("tectonic_pool_desired_replicas", {**labels, "state": "active"}) == east.active
    assert get("tectonic_pool_desired_replicas", {**labels, "state": "warm"}) == east.warm
    assert get("tectonic_pool_forecast_rps", {**labels, "series": "observed"}) == 120.0
    upper = get("tectonic_pool_forecast_rps", {**labels, "series": "upper"})
    assert upper is not None and upper >= 120.0 * 0.9
    # eu-west never reported: dark, its size held, no forecast series
    assert get("tectonic_pool_forecast_rps", {"region": "eu-west", "series": "observed"}) is None
    assert get("tectonic_pool_desired_replicas", {"region": "eu-west", "state": "active"}) == 1
    metrics.tick_done(leader=False, snapshot=None)  # a follower exports none
    assert get("tectonic_pool_desired_replicas", {**labels, "state": "active"}) is None


def _failing(source: str, started_at: float, targets: dict[str, float], rps: float) -> RegionRecord:
    """``source`` FAILING_OVER since ``started_at``, moving ``rps`` (at hit rate 0.5, the
    pre-warm verified) onto ``targets``."""
    plan = FailoverPlan(
        source=source,
        targets=targets,
        reason="test",
        actor="test",
        moved_rps=rps,
        source_hit_rate=0.5 if source == "us-west" else 0.0,
    )
    progress = FailoverProgress(
        plan=plan,
        started_at=started_at,
        done=(FailoverStep.PREWARM, FailoverStep.SWITCH),
        prewarm_result=PrewarmFigures(attained_fraction=1.0),
    )
    return RegionRecord(
        region=source, state=RegionState.FAILING_OVER, since=started_at, failover=progress
    )


def test_two_failovers_onto_one_target_add_up_from_the_earliest() -> None:
    """us-west (60 rps at hit rate 0.5, from t=100) and eu-west (80 rps cold, from t=200,
    half to us-east, half to us-central): us-east gets both, 100 rps at their hit rate
    (0.3: the hits over the requests), named and timed by the earliest (its allowance
    is not restarted, and the scaler's baseline for it is kept); a later failover used
    to replace the earlier one's load."""
    snap = scaled_world().snapshot()
    regions = dict(snap.regions)
    regions["us-west"] = regions["us-west"].model_copy(
        update={"record": _failing("us-west", 100.0, {"us-east": 1.0}, 60.0)}
    )
    regions["eu-west"] = regions["eu-west"].model_copy(
        update={"record": _failing("eu-west", 200.0, {"us-east": 0.5, "us-central": 0.5}, 80.0)}
    )
    moving = moving_loads(snap.model_copy(update={"regions": regions}))
    east, central = moving["us-east"], moving["us-central"]
    assert (east.source, east.started_at, east.rps) == ("us-west", 100.0, 100.0)
    assert east.hit_rate == pytest.approx(0.3)
    assert (central.source, central.started_at, central.rps, central.hit_rate) == (
        "eu-west",
        200.0,
        40.0,
        0.0,
    )
    # the scaler sized us-east for the first alone; the second joins: its baseline (its
    # own 20 rps, taken before any load moved) stays, and both loads are added to it
    first = Moving(source="us-west", started_at=100.0, rps=60.0, hit_rate=0.5)
    ten = Capacity(lambda h: 10.0, "measured")
    policy = POLICY.model_copy(update={"forecast": False})

    def size(load: float, move: Moving, memory: ScaleRecord | None, now: float) -> ScaleRecord:
        signals = PoolSignals(now, load, 0.5, 0.0, None, active_now=1)
        return size_pool(
            "us-east", None, signals, ten, policy, now=now, ttft_slo_s=None, moving=move,
            memory=memory,
        ).record  # fmt: skip

    before = size(20.0, first, None, 150.0)
    assert before.incoming is not None and before.active == 8  # 20 + 60 rps
    after = size(80.0, east, before, 250.0)  # it serves 80 now: its own and the first's
    assert after.incoming == before.incoming and after.active == 12  # 20 + 100 rps
