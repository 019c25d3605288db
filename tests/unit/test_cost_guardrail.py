"""The cost guardrail on a fake clock (docs/scaling.md, "Cost"): the budget caps a
scale-up and the record says so, the ladder sheds for the pool instead; an operator's
failover's allowance ends and the budget binds again; the utilisation rules on WARM;
the ``cost:`` section's validation. An operator's lift in the leader's cycle:
test_scale_tick_budget.py."""

from __future__ import annotations

import pytest

from controlplane.core.ladder_tick import ladder_moves
from controlplane.core.scale_tick import pool_budget
from controlplane.core.scaler import Capacity, Moving, PoolSignals, size_pool
from controlplane.core.spend import budget_for, efficiency, spend_lines
from controlplane.kernel.config import ConfigError, parse_topology
from controlplane.kernel.ladder.file import load_ladder
from controlplane.kernel.model import (
    Cause,
    RegionHealth,
)
from controlplane.kernel.pool.cost import CostPolicy, Prices
from controlplane.kernel.pool.scale import ScaleRecord, ScalingPolicy
from controlplane.kernel.snapshot import RegionView
from tests.unit.world import World, topology

POLICY = ScalingPolicy(horizon_s=30, stable_window_s=60, burst_warm=1, checkpoint_s=10)
TEN = Capacity(lambda h: 10.0, "measured")  # 10 rps a replica, whatever the hit rate
PRICES = Prices(active=10.0, warm=2.0)  # $ per replica-hour
ZONES = {"us-east": "us", "us-west": "us", "us-central": "us", "eu-west": "eu"}


def cost(**more: object) -> CostPolicy:
    return CostPolicy.model_validate({"prices": PRICES.model_dump(), **more})


def size(
    load: float,
    budget_policy: CostPolicy,
    *,
    now: float = 100.0,
    spend: dict[str, float] | None = None,
) -> ScaleRecord:
    """One pool sized at ``load`` rps (forecast off: the load now) against its budget."""
    budget = budget_for(budget_policy, "us-east", ZONES, spend or {})
    signals = PoolSignals(now, load, 0.0, 0.0, None, active_now=1)
    policy = POLICY.model_copy(update={"forecast": False})
    sized = size_pool(
        "us-east", None, signals, TEN, policy, now=now, ttft_slo_s=None, budget=budget
    )
    return sized.record


def test_the_budget_caps_a_scale_up_and_the_record_says_so() -> None:
    # 60 rps needs 6 ACTIVE at $10: the pool's $45/h buys 4 (and the 1 burst WARM at $2)
    rec = size(60.0, cost(pool_budgets={"us-east": 45.0}))
    assert (rec.active, rec.warm) == (4, 1)
    assert rec.budget is not None and rec.budget.short == 2
    assert rec.budget.spend_per_hour <= 45.0 and rec.budget.scope == "pool"
    binds = [r for r in rec.reasons if r.startswith("budget binds")]
    assert binds and "6 ACTIVE -> 4" in binds[0] and "the ladder sheds" in binds[0]
    # within the budget: nothing said, nothing short
    free = size(30.0, cost(pool_budgets={"us-east": 100.0}))
    assert free.active == 3 and free.budget is not None and not free.budget.binds
    assert free.budget.utilisation == pytest.approx((3 * 10 + 1 * 2) / 100)


def test_a_zone_budget_counts_the_other_pools_of_the_zone_and_the_fleet_all() -> None:
    spend = {"us-east": 0.0, "us-west": 30.0, "eu-west": 50.0}
    rec = size(60.0, cost(zone_budgets={"us": 70.0}, fleet_budget=500.0), spend=spend)
    assert rec.active == 4 and rec.budget is not None and rec.budget.scope == "zone:us"
    fleet = size(60.0, cost(fleet_budget=100.0), spend=spend)  # $20 left: 2 ACTIVE
    assert fleet.active == 2 and fleet.budget is not None and fleet.budget.short == 4
    # never under min_active: the floor holds even with no room at all
    broke = size(60.0, cost(fleet_budget=10.0), spend=spend)
    assert broke.active == POLICY.min_active


def test_the_ladder_sheds_for_a_pool_the_budget_holds_short() -> None:
    topo = topology().model_copy(
        update={"scaling": POLICY, "cost": cost(pool_budgets={"us-east": 45.0})}
    )
    w = World(topo=topo)
    rec = size(60.0, cost(pool_budgets={"us-east": 45.0}), now=w.now)
    snap = w.snapshot()
    east = snap.regions["us-east"]
    # what the pool serves at its capped size: 4 x 10 rps against 60 rps of load
    health = RegionHealth(region="us-east", since=0, signals={"load_rps": 60.0})
    view = east.model_copy(update={"scale": rec, "health": health, "active_replicas": 4})
    snap = snap.model_copy(update={"regions": {**snap.regions, "us-east": view}})
    moves, _ = ladder_moves(snap, topo, load_ladder(), "cp-test")
    assert [m.region for m in moves] == ["us-east"]
    assert moves[0].audit.details["cause"] == Cause.BUDGET.value
    # the same pool within its budget: NORMAL, nothing to apply
    calm = view.model_copy(update={"scale": rec.model_copy(update={"budget": None})})
    snap = snap.model_copy(update={"regions": {**snap.regions, "us-east": calm}})
    assert ladder_moves(snap, topo, load_ladder(), "cp-test")[0] == []


def test_a_failover_allowance_ends_and_the_budget_binds_again() -> None:
    topo = topology().model_copy(
        update={
            "scaling": POLICY,
            "cost": cost(pool_budgets={"us-east": 45.0}, failover_allowance_s=1800),
        }
    )
    snap = World(topo=topo).snapshot()
    spend = dict.fromkeys(topo.names, 0.0)
    early = Moving(source="us-west", started_at=snap.now - 100, rps=50.0, hit_rate=0.0)
    budget = pool_budget(snap, topo, "us-east", early, spend)
    # exempt to the allowance less its 30 s wind-down (test_cost_allowance_end.py)
    assert budget is not None and "1670 s left" in budget.exempt
    late = Moving(source="us-west", started_at=snap.now - 1900, rps=50.0, hit_rate=0.0)
    budget = pool_budget(snap, topo, "us-east", late, spend)
    assert budget is not None and not budget.exempt and "allowance ended 100 s ago" in budget.lapsed
    # sized for the moved load within the allowance; capped (and short: the ladder) after
    signals = PoolSignals(snap.now, 10.0, 0.0, 0.0, None, active_now=1)
    for moving, active, short in ((early, 6, 0), (late, 4, 2)):
        rec = size_pool(
            "us-east",
            None,
            signals,
            TEN,
            POLICY,
            now=snap.now,
            ttft_slo_s=None,
            moving=moving,
            budget=pool_budget(snap, topo, "us-east", moving, spend),
        ).record
        assert rec.active == active and rec.budget is not None and rec.budget.short == short
    assert any("allowance ended" in r for r in rec.reasons)


def test_low_utilisation_for_a_window_shrinks_warm_and_high_stops_its_growth() -> None:
    policy = POLICY.model_copy(update={"forecast": False, "standby_rps": 50.0})
    low = cost(pool_budgets={"us-east": 1000.0}, low_window_s=60)
    stored: ScaleRecord | None = None
    signals = PoolSignals(0.0, 10.0, 0.0, 0.0, None, active_now=1)
    warms = []
    for t in range(0, 100, 10):
        sized = size_pool(
            "us-east",
            stored,
            PoolSignals(float(t), 10.0, 0.0, 0.0, None, active_now=1),
            TEN,
            policy,
            now=float(t),
            ttft_slo_s=None,
            memory=stored,
            budget=budget_for(low, "us-east", ZONES, {}),
        )
        stored = last = sized.record
        warms.append(last.warm)
    # standby 50 rps: 4 WARM beyond the one ACTIVE (burst_warm within them); after 60 s
    # under 50 %, down to the floor (burst_warm: the forecast needs nothing more)
    assert warms[0] == 4 and warms[-1] == 1
    assert any("WARM 4 -> its floor 1" in r for r in last.reasons)
    # over 85 %: the standby's WARM does not grow past what the pool has
    high = cost(pool_budgets={"us-east": 12.0})
    base = ScaleRecord(unit="us-east", active=1, warm=1, decided_at=0, changed_at=0)
    rec = size_pool(
        "us-east",
        base,
        signals,
        TEN,
        policy,
        now=1.0,
        ttft_slo_s=None,
        budget=budget_for(high, "us-east", ZONES, {}),
    ).record
    assert rec.warm == 1 and any("grows only as the forecast needs" in r for r in rec.reasons)


def test_spend_lines_and_efficiency() -> None:
    policy = cost(pool_budgets={"us-east": 40.0}, zone_budgets={"us": 100.0}, fleet_budget=200.0)
    lines = spend_lines(policy, ZONES, {"us-east": 20.0, "us-west": 30.0, "eu-west": 10.0})
    by = {(x.scope, x.name): x for x in lines}
    assert by[("pool", "us-east")].utilisation == 0.5
    assert by[("pool", "us-west")].utilisation is None
    assert by[("zone", "us")].dollars_per_hour == 50.0
    assert by[("fleet", "fleet")].utilisation == pytest.approx(60.0 / 200.0)
    rec = ScaleRecord(
        unit="us-east",
        active=3,
        warm=1,
        decided_at=0,
        changed_at=0,
        load_rps=20.0,
        per_replica_rps=10.0,
    )
    assert efficiency(rec, paid=4) == 0.5 and efficiency(rec, paid=0) is None


def test_a_bad_cost_section_is_refused_naming_the_field() -> None:
    base = {
        "cluster": "t",
        "regions": [{"name": "a", "zone": "z", "agent": "h:1", "capacity_rps": 10}],
    }
    good = {"prices": {"active": 4, "warm": 1}, "pool_budgets": {"a": 10}, "zone_budgets": {"z": 9}}
    assert parse_topology({**base, "cost": good}).cost is not None
    for bad, said in (
        ({**good, "pool_budgets": {"b": 1}}, "cost.pool_budgets names unknown pools ['b']"),
        ({**good, "zone_budgets": {"y": 1}}, "cost.zone_budgets names unknown zones ['y']"),
        ({**good, "low_utilisation": 0.8}, "low_utilisation < target_utilisation"),
        ({**good, "fleet_budget": -1}, "cost.fleet_budget"),
        ({**good, "pool_budgets": {"a": 0}}, "cost.pool_budgets.a: Input should be greater than 0"),
        ({"prices": {"active": 4}}, "cost.prices.warm"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_topology({**base, "cost": bad})
        assert said in str(err.value), str(err.value)


def test_views_without_a_lift_are_not_lifted() -> None:
    view = World().snapshot().regions["us-east"]
    assert isinstance(view, RegionView) and view.lifted(0.0) is None
