"""The cost guardrail prices what the pool holds (docs/scaling.md, "Cost"): replicas
being launched, IDLE ones and WARM ones in their dwell stay paid for whatever the
scaler asks, so a scale-up must fit beside them; IDLE has its own price; what the agent
publishes of them in ``pools/<unit>`` reaches the budget through the snapshot."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from rich.console import Console

from controlplane.cli.cost_cmds import cost_tables
from controlplane.core.scale_tick import pool_budget
from controlplane.core.scaler import Capacity, PoolSignals, size_pool
from controlplane.core.spend import (
    CostReport,
    Held,
    PoolCost,
    ScopeCost,
    allowed_scopes,
    budget_for,
    cost_report,
    held_spend,
)
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.model import RegionHealth, RegionRecord
from controlplane.kernel.pool.cost import BudgetNote, CostPolicy, Prices
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.pool.scale import ScaleRecord, ScalingPolicy
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.kernel.store.memory import MemoryStore
from regions.agent.pool_config import AgentPoolConfig
from regions.agent.warm_pool import AgentPool, PoolPublishing
from regions.pool.snapshot import PoolSnapshot
from regions.pool.states import PoolTarget, Replica, ReplicaState
from tests.unit.world import topology

POLICY = ScalingPolicy(horizon_s=30, stable_window_s=60, burst_warm=1, checkpoint_s=10)
TEN = Capacity(lambda h: 10.0, "measured")  # 10 rps a replica, whatever the hit rate
PRICES = Prices(active=10.0, warm=2.0)  # $ per replica-hour
ZONES = {"us-east": "us", "us-west": "us", "us-central": "us", "eu-west": "eu"}


def size(load: float, budget: float, held: Held | None) -> ScaleRecord:
    """One pool sized at ``load`` rps (forecast off) against a pool budget, holding
    ``held`` now."""
    policy_ = CostPolicy(prices=PRICES, pool_budgets={"us-east": budget})
    b = budget_for(policy_, "us-east", ZONES, {}, held=held)
    active_now = 1 if held is None else held.active
    signals = PoolSignals(100.0, load, 0.0, 0.0, None, active_now=active_now)
    policy = POLICY.model_copy(update={"forecast": False})
    return size_pool(
        "us-east", None, signals, TEN, policy, now=100.0, ttft_slo_s=None, budget=b
    ).record


def test_launches_in_flight_are_paid_for_so_the_burst_warm_is_not_launched() -> None:
    # 60 rps wants 6 ACTIVE; $45/h. Priced from the ask alone: 4 ACTIVE + 1 WARM ($42).
    # Holding 1 ACTIVE and 3 launching ($40, a launch at ACTIVE's price), the 3 become
    # ACTIVE 2-4, and the WARM would be one more launch ($50): none.
    asked = size(60.0, 45.0, None)
    assert (asked.active, asked.warm) == (4, 1)
    rec = size(60.0, 45.0, Held(active=1, launching=3))
    assert (rec.active, rec.warm) == (4, 0)
    assert rec.budget is not None and rec.budget.short == 2
    assert rec.budget.spend_per_hour == pytest.approx(40.0)
    binds = [r for r in rec.reasons if r.startswith("budget binds")]
    assert binds and "held now: 3 launching" in binds[0]


def test_a_pool_whose_launches_already_spend_the_budget_gets_no_more() -> None:
    # 1 ACTIVE and 4 launching: $50/h against $45. No launch more, not even the burst
    # WARM: ACTIVE only as far as the room buys (4) from the launches paid for already
    rec = size(60.0, 45.0, Held(active=1, launching=4))
    assert (rec.active, rec.warm) == (4, 0)
    assert rec.budget is not None and rec.budget.short == 2
    assert rec.budget.spend_per_hour == pytest.approx(50.0)  # what it holds, no more
    assert any("6 ACTIVE -> 4" in r and "held now: 4 launching" in r for r in rec.reasons)


def test_idle_and_dwell_kept_warm_replicas_stay_in_the_spend() -> None:
    # 2 ACTIVE and 4 WARM, all in their WARM dwell ($28/h), $40 budget: each wake adds
    # $8 (the WARM left cannot be stopped yet): 1 more ACTIVE, not the 4 the sizes buy
    kept = size(60.0, 40.0, Held(active=2, warm=4, warm_kept=4))
    assert kept.active == 3 and kept.budget is not None and kept.budget.short == 3
    free = size(60.0, 40.0, Held(active=2, warm=4))  # past their dwell: stopped, 4 ACTIVE
    assert free.active == 4
    # 4 IDLE (awake: ACTIVE's price by default) beside 2 ACTIVE spend $60 of $45:
    # resuming adds nothing, but only as far as the room buys once the rest is let go
    idle = size(60.0, 45.0, Held(active=2, idle=4))
    assert (idle.active, idle.warm) == (4, 0)
    assert idle.budget is not None and idle.budget.short == 2
    assert idle.budget.spend_per_hour == pytest.approx(60.0)


def test_idle_is_priced_at_its_own_price_active_s_by_default() -> None:
    view = RegionView(
        name="us-east",
        record=RegionRecord(region="us-east", since=0.0),
        health=RegionHealth(region="us-east", since=0.0),
        active_replicas=2,
        warm_replicas=5,  # WARM and IDLE, as pools/<unit> counts them
        idle_replicas=2,
        launching_replicas=1,
        lent_replicas=1,
    )
    held = Held.of(view)
    assert held == Held(active=2, idle=2, warm=3, lent=1, launching=1)
    own = CostPolicy(prices=Prices(active=10.0, warm=2.0, idle=7.0))
    # 2 ACTIVE + 1 launching at $10, 2 IDLE at $7, 3 WARM at $2, 1 LENT at ACTIVE's $10
    assert held_spend(own, view) == pytest.approx(30.0 + 14.0 + 6.0 + 10.0)
    default = CostPolicy(prices=PRICES)
    assert held_spend(default, view) == pytest.approx(30.0 + 20.0 + 6.0 + 10.0)
    topo = topology().model_copy(update={"cost": own})
    others = {
        n: RegionView(
            name=n,
            record=RegionRecord(region=n, since=0.0),
            health=RegionHealth(region=n, since=0.0),
        )
        for n in topo.names
        if n != "us-east"
    }
    report = cost_report(Snapshot(now=1.0, regions={"us-east": view, **others}), topo)
    assert report is not None
    [line] = [p for p in report.pools if p.unit == "us-east"]
    assert (line.warm, line.idle, line.launching) == (5, 2, 1)
    assert line.dollars_per_hour == pytest.approx(60.0)


def test_the_leader_hands_the_budget_what_the_pool_holds() -> None:
    topo = topology().model_copy(
        update={
            "scaling": POLICY,
            "cost": CostPolicy(prices=PRICES, pool_budgets={"us-east": 45.0}),
        }
    )
    views = {
        n: RegionView(
            name=n,
            record=RegionRecord(region=n, since=0.0),
            health=RegionHealth(region=n, since=0.0),
            active_replicas=1,
            warm_replicas=3 if n == "us-east" else 0,
            idle_replicas=1 if n == "us-east" else 0,
            warm_kept_replicas=2 if n == "us-east" else 0,
            launching_replicas=2 if n == "us-east" else 0,
        )
        for n in topo.names
    }
    budget = pool_budget(Snapshot(now=1.0, regions=views), topo, "us-east", None, {})
    assert budget is not None
    assert budget.held == Held(active=1, idle=1, warm=2, launching=2, warm_kept=2)


def test_pool_members_carry_the_held_counts_and_refuse_bad_ones() -> None:
    m = PoolMembers(
        region="eu",
        active=("http://a",),
        warm=3,
        idle=1,
        warm_kept=2,
        launching=2,
        at=1.0,
        agent="agent:eu",
    )
    assert decode(PoolMembers, encode(m)) == m
    plain = PoolMembers(region="eu", active=(), warm=0, at=1.0, agent="agent:eu")
    # zero counts are left out: a reader of the older shape still reads the value
    assert not {"idle", "warm_kept", "launching"} & set(plain.model_dump(mode="json"))
    with pytest.raises(ValidationError, match="parts of warm"):
        PoolMembers(region="eu", active=(), warm=1, idle=1, warm_kept=1, at=1.0, agent="a")
    with pytest.raises(ValueError, match=">= 0"):
        Held(active=-1)
    with pytest.raises(ValueError, match="warm_kept"):
        Held(warm=1, warm_kept=2)
    with pytest.raises(ValueError, match=">= 0"):
        PRICES.per_hour(1, -1)


def test_the_agent_publishes_idle_dwell_kept_warm_and_launches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = AgentPoolConfig.model_validate(
        {"launcher": {"kind": "static", "urls": ["http://127.0.0.1:9"]}, "active": 1, "warm": 0}
    )
    agent = AgentPool("eu", config, PoolPublishing("unit", MemoryStore()), interval_s=1.0)
    clock = FakeClock(10_000.0)
    monkeypatch.setattr(agent, "_pool_clock", clock)
    dwell = agent.pool.config.dwell.warm_min_s
    now = clock.now()
    replicas = (
        Replica(name="a", url="http://a", state=ReplicaState.ACTIVE, since=0.0),
        Replica(name="i", url="http://i", state=ReplicaState.IDLE, since=now - 1.0),
        Replica(name="w", url="http://w", state=ReplicaState.WARM, since=now - dwell / 2),
        Replica(name="o", url="http://o", state=ReplicaState.WARM, since=now - 2 * dwell),
        Replica(name="s", url="http://s", state=ReplicaState.WARM, since=0.0, managed=False),
        Replica(name="l", state=ReplicaState.COLD, busy=True),  # being launched
        Replica(name="c", state=ReplicaState.COLD),  # an empty slot: nothing held
    )
    snap = PoolSnapshot(replicas=replicas, target=PoolTarget(active=1, warm=3))
    monkeypatch.setattr(agent.pool, "snapshot", lambda: snap)
    monkeypatch.setattr(agent.pool, "warm_count", lambda: 4)  # i, w, o, s
    m = agent.members()
    # in its dwell: w; static (never stopped by the pool): s; o may be stopped now
    assert (m.warm, m.idle, m.warm_kept, m.launching) == (4, 1, 2, 1)


def test_cost_show_says_when_an_allowance_ends_and_when_a_pool_is_over() -> None:
    """The scaler's note reaches ``failoverctl cost show``: an exemption's end and the
    ACTIVE it cuts then, and a pool over its budget (its WARM stops without the dwell)."""
    topo = topology().model_copy(
        update={"cost": CostPolicy(prices=PRICES, pool_budgets={"us-east": 45.0})}
    )
    exempt = BudgetNote(
        spend_per_hour=90.0,
        exempt="failover from us-west: allowance until 1830 s",
        ends_at=4_102_444_800.0,  # 2100-01-01 00:00 UTC
        short_at_end=3,
    )
    over = BudgetNote(spend_per_hour=60.0, utilisation=1.33, over=True)

    def view(n: str, note: BudgetNote | None) -> RegionView:
        scale = (
            None
            if note is None
            else ScaleRecord(unit=n, active=4, warm=1, decided_at=1.0, changed_at=1.0, budget=note)
        )
        return RegionView(
            name=n,
            record=RegionRecord(region=n, since=0.0),
            health=RegionHealth(region=n, since=0.0),
            scale=scale,
        )

    notes = {"us-east": exempt, "us-west": over}
    snap = Snapshot(now=1.0, regions={n: view(n, notes.get(n)) for n in topo.names})
    report = cost_report(snap, topo)
    assert report is not None
    lines = {p.unit: p for p in report.pools}
    east, west = lines["us-east"], lines["us-west"]
    assert (east.ends_at, east.short_at_end, east.over) == (4_102_444_800.0, 3, False)
    assert (west.over, west.ends_at) == (True, None)
    assert lines["eu-west"].over is False and lines["eu-west"].ends_at is None
    console = Console(width=400, record=True)
    for table in cost_tables(report):
        console.print(table)
    text = console.export_text()
    assert "binds again 2100-01-01 00:00 UTC (in " in text
    assert "cutting 3 ACTIVE then" in text
    assert "over the budget: WARM beyond the sizes stops at once" in text
    assert decode(CostReport, encode(report)) == report  # what GetCost carries, read back


def test_allowed_scopes_name_what_lets_each_budgeted_scope_spend_past_it() -> None:
    """A pool's own lift or failover allowance; a zone's or the fleet's: its pools'
    (what tectonic_budget_allowed exports and doctor judges a week's peak by)."""

    def pool(unit: str, zone: str, exempt: str = "", budget: float | None = 10.0) -> PoolCost:
        return PoolCost(
            unit=unit,
            zone=zone,
            active=1,
            warm=0,
            lent=0,
            dollars_per_hour=12.0,
            budget=budget,
            utilisation=None if budget is None else 1.2,
            efficiency=None,
            exempt=exempt,
        )

    report = CostReport(
        at=0.0,
        pools=(
            pool("us-east", "us", exempt="failover target from eu-west"),
            pool("us-west", "us"),
            pool("eu-west", "eu", budget=None),
        ),
        scopes=(
            ScopeCost(scope="zone", name="us", dollars_per_hour=24.0, budget=20.0, utilisation=1.2),
            ScopeCost(scope="zone", name="eu", dollars_per_hour=12.0, budget=20.0, utilisation=0.6),
            ScopeCost(
                scope="fleet", name="fleet", dollars_per_hour=36.0, budget=None, utilisation=None
            ),
        ),
    )
    assert allowed_scopes(report) == {
        ("pool", "us-east"): ("failover target from eu-west",),
        ("pool", "us-west"): (),
        ("zone", "us"): ("us-east: failover target from eu-west",),
        ("zone", "eu"): (),
    }  # no budget, no line: eu-west's pool and the fleet
