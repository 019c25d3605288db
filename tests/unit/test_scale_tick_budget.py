"""An operator's budget lift in the leader's cycle (tests/unit/world.py: the real
snapshot reader, ``decide`` and orchestrator on an in-memory store, a fake clock): it
exempts the pool from its budget, then ends by itself at its end, audited, and the
budget binds again (docs/scaling.md, "Cost")."""

from __future__ import annotations

import asyncio

from controlplane.kernel.codec import decode, encode
from controlplane.kernel.model import AuditAction, Health, HealthReport, ObserverKind
from controlplane.kernel.pool.cost import BudgetLift, CostPolicy, Prices
from controlplane.kernel.pool.scale import ScaleRecord, ScalingPolicy
from tests.unit.world import World, topology

POLICY = ScalingPolicy(horizon_s=30, stable_window_s=60, burst_warm=1, checkpoint_s=10)
COST = CostPolicy(prices=Prices(active=10.0, warm=2.0), pool_budgets={"us-east": 45.0})


def scale_record(w: World) -> ScaleRecord:
    kv = asyncio.run(w.store.get(w.keys.scale("us-east")))
    assert kv is not None
    return decode(ScaleRecord, kv.value)


def agent(w: World, region: str, load: float) -> None:
    w.reports[(region, f"agent:{region}")] = HealthReport(
        region=region,
        observer=f"agent:{region}",
        kind=ObserverKind.AGENT,
        health=Health.HEALTHY,
        signals={"load_rps_raw": load, "load_rps": load},
        received_at=w.now,
    )


def test_a_budget_lift_exempts_the_pool_and_ends_by_itself() -> None:
    policy = POLICY.model_copy(update={"forecast": False})
    base = topology()
    # us-east bears 10 rps (typed, on its one replica): 60 rps needs 6
    regions = tuple(
        r.model_copy(update={"capacity_rps": 10.0}) if r.name == "us-east" else r
        for r in base.regions
    )
    topo = base.model_copy(update={"regions": regions, "scaling": policy, "cost": COST})
    w = World(topo=topo)
    w.active_replicas = {"us-east": 1}
    lift = BudgetLift(unit="us-east", reason="INC-7 launch", actor="ana", at=w.now, until=w.now + 5)
    asyncio.run(w.store.put(w.keys.budget_lift("us-east"), encode(lift)))
    for _ in range(3):
        agent(w, "us-east", 60.0)
        w.tick()
    rec = scale_record(w)
    assert rec.active == 6 and rec.budget is not None and rec.budget.short == 0
    assert "budget lifted by ana: INC-7 launch" in rec.budget.exempt
    for _ in range(4):  # past its until: the leader ends it, audited, and the budget binds
        agent(w, "us-east", 60.0)
        w.tick()
    assert asyncio.run(w.store.get(w.keys.budget_lift("us-east"))) is None
    ended = [e for e in w.audit if e.action is AuditAction.BUDGET_UNLIFT]
    assert len(ended) == 1 and "expired" in ended[0].reason and "INC-7" in ended[0].reason
    rec = scale_record(w)
    assert rec.active == 4 and rec.budget is not None and rec.budget.short == 2
    assert any(r.startswith("budget binds") for r in rec.reasons)
