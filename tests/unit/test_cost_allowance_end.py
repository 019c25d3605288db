"""How a budget exemption ends, on a fake clock (docs/scaling.md, "Cost"): a failover's
allowance winds down ``failover_wind_down_s`` before its end, so that the replicas the
budget cuts are stopped by then; while exempt the record says when the budget binds
again and what it would cut, and the ladder degrades the pool ahead of the cut so that
it sheds by the time the capacity goes; a pool over its budget says so, and its agent
stops WARM without the WARM dwell."""

from __future__ import annotations

import asyncio
from typing import cast

from controlplane.core.ladder_tick import budget_paid, ladder_lead_s, ladder_moves
from controlplane.core.scale_tick import _budget_news, pool_budget
from controlplane.core.scaler import Capacity, Moving, PoolSignals, size_pool
from controlplane.core.spend import Held, budget_for
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.file import load_ladder
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import Cause, RegionHealth
from controlplane.kernel.pool.cost import BudgetLift, BudgetNote, CostPolicy, Prices
from controlplane.kernel.pool.scale import ScaleRecord, ScalingPolicy
from controlplane.kernel.snapshot import Snapshot
from controlplane.kernel.store.memory import MemoryStore
from regions.agent.scale_follower import ScaleFollower
from regions.pool.manager import WarmPool
from tests.unit.world import World, topology

POLICY = ScalingPolicy(horizon_s=30, stable_window_s=60, burst_warm=1, checkpoint_s=10)
TEN = Capacity(lambda h: 10.0, "measured")  # 10 rps a replica, whatever the hit rate
PRICES = Prices(active=10.0, warm=2.0)  # $ per replica-hour
ZONES = {"us-east": "us", "us-west": "us", "us-central": "us", "eu-west": "eu"}
# $45/h buys 4 ACTIVE at $10 (and a burst WARM at $2); the allowance is 1800 s, its last
# 30 s the wind-down
COST = CostPolicy(prices=PRICES, pool_budgets={"us-east": 45.0})


def costed(cost: CostPolicy = COST) -> Topology:
    return topology().model_copy(update={"scaling": POLICY, "cost": cost})


def moving(started_at: float) -> Moving:
    return Moving(source="us-west", started_at=started_at, rps=50.0, hit_rate=0.0)


def sized(snap: Snapshot, topo: Topology, move: Moving, load: float = 10.0) -> ScaleRecord:
    """us-east sized for ``load`` of its own and the moved 50 rps, with the budget
    ``pool_budget`` hands it at ``snap.now``."""
    spend = dict.fromkeys(topo.names, 0.0)
    return size_pool(
        "us-east",
        None,
        PoolSignals(snap.now, load, 0.0, 0.0, None, active_now=1),
        TEN,
        POLICY,
        now=snap.now,
        ttft_slo_s=None,
        moving=move,
        budget=pool_budget(snap, topo, "us-east", move, spend),
    ).record


def test_the_allowance_winds_down_before_its_end_so_the_cut_is_over_by_then() -> None:
    topo = costed()
    snap = World(topo=topo).snapshot()
    spend = dict.fromkeys(topo.names, 0.0)
    # 1760 s in: exempt, to 1770 s (1800 less the 30 s wind-down)
    early = pool_budget(snap, topo, "us-east", moving(snap.now - 1760), spend)
    assert early is not None and "10 s left of its 1800 s budget allowance" in early.exempt
    assert early.ends_at == snap.now + 10
    # 1780 s in: the budget binds again, 20 s before the allowance ends
    late = pool_budget(snap, topo, "us-east", moving(snap.now - 1780), spend)
    assert late is not None and not late.exempt and late.ends_at is None
    assert "ends in 20 s: the budget binds again 30 s before" in late.lapsed
    # no wind-down: exempt to the allowance's end; one longer than it: never exempt
    none = costed(COST.model_copy(update={"failover_wind_down_s": 0.0}))
    at_end = pool_budget(snap, none, "us-east", moving(snap.now - 1780), spend)
    assert at_end is not None and at_end.exempt and at_end.ends_at == snap.now + 20
    short = costed(COST.model_copy(update={"failover_allowance_s": 20.0}))
    never = pool_budget(snap, short, "us-east", moving(snap.now), spend)
    assert never is not None and not never.exempt


def test_while_exempt_the_record_says_when_the_budget_binds_and_what_it_cuts() -> None:
    topo = costed()
    snap = World(topo=topo).snapshot()
    # its own 10 rps and 50 moved: 6 ACTIVE; the budget buys 4 of them once it binds
    rec = sized(snap, topo, moving(snap.now - 1000))
    note = rec.budget
    assert rec.active == 6 and note is not None and note.exempt and note.short == 0
    assert note.ends_at == snap.now + 770 and note.short_at_end == 2
    assert any("the budget binds again in 770 s: it buys 4 of these 6" in r for r in rec.reasons)
    # within the budget once it binds: nothing to prepare for
    rich = costed(COST.model_copy(update={"pool_budgets": {"us-east": 100.0}}))
    fits = sized(snap, rich, moving(snap.now - 1000)).budget
    assert fits is not None and fits.ends_at is not None and fits.short_at_end == 0
    # an operator's lift ends at its until: the same word
    lift = BudgetLift(unit="us-east", reason="INC-9", actor="ana", at=0.0, until=snap.now + 60)
    east = snap.regions["us-east"].model_copy(update={"lift": lift})
    lifted = snap.model_copy(update={"regions": {**snap.regions, "us-east": east}})
    spend = dict.fromkeys(topo.names, 0.0)
    b = pool_budget(lifted, topo, "us-east", None, spend)
    assert b is not None and b.exempt and b.ends_at == snap.now + 60


def test_budget_paid_counts_the_cut_only_within_the_ladders_lead() -> None:
    lead = ladder_lead_s(load_ladder())
    assert lead == 40.0  # four steps, 10 s apart: shed-batch 30 s after the first
    note = BudgetNote(spend_per_hour=60.0, exempt="failover", ends_at=1000.0, short_at_end=2)
    rec = ScaleRecord(unit="us-east", active=6, warm=0, decided_at=0, changed_at=0, budget=note)
    assert budget_paid(rec, 1000.0 - lead - 1, lead) is None  # not yet
    assert budget_paid(rec, 1000.0 - lead, lead) == 4  # what the budget buys then
    short = rec.model_copy(update={"active": 4, "budget": BudgetNote(spend_per_hour=40, short=2)})
    assert budget_paid(short, 0.0, lead) == 4  # short now: its ACTIVE are capped already
    assert budget_paid(rec.model_copy(update={"budget": None}), 1000.0, lead) is None


def test_the_ladder_sheds_by_the_time_the_exemption_ends() -> None:
    """A fake clock from 60 s before the exemption's end: no step until the ladder's
    lead (40 s), then a step every 10 s, shed-batch 10 s before the cut, each step's
    cause the budget; the pool bears 60 rps on 6 ACTIVE, of which the budget buys 4."""
    topo = costed()
    w = World(topo=topo)
    end = w.now + 60
    note = BudgetNote(spend_per_hour=60.0, exempt="failover", ends_at=end, short_at_end=2)
    health = RegionHealth(region="us-east", since=0, signals={"load_rps": 60.0})
    ladder = load_ladder()
    record: DegradationRecord | None = None
    applied: dict[float, tuple[str, str]] = {}
    for t in range(61):
        now = end - 60 + t
        rec = ScaleRecord(
            unit="us-east",
            active=6,
            warm=0,
            decided_at=now,
            changed_at=0,
            per_replica_rps=10.0,
            budget=note,
        )
        snap = w.snapshot().model_copy(update={"now": now})
        east = snap.regions["us-east"].model_copy(
            update={"scale": rec, "health": health, "active_replicas": 6, "ladder": record}
        )
        snap = snap.model_copy(update={"regions": {**snap.regions, "us-east": east}})
        moves, _ = ladder_moves(snap, topo, ladder, "cp-test")
        for m in moves:
            assert m.region == "us-east" and m.audit.details["cause"] == Cause.BUDGET.value
            applied[now - end] = (m.kind.value, m.step or "")
            record = m.record
    assert applied == {
        -40.0: ("apply", "speculative-decoding-off"),
        -30.0: ("apply", "context-cap-16k"),
        -20.0: ("apply", "parallel-tool-calls-off"),
        -10.0: ("apply", "shed-batch"),
    }


def test_a_pool_over_its_budget_says_so_and_only_then() -> None:
    """What the pool holds spends past the room (the end of an exemption: 6 ACTIVE at
    $10 against $45): the note's ``over``, which its agent reads to stop WARM without
    the dwell. Within it, exempt, or with what it holds unknown: not over."""
    policy = POLICY.model_copy(update={"forecast": False})

    def note(held: Held | None, exempt: str = "") -> BudgetNote:
        b = budget_for(COST, "us-east", ZONES, {}, held=held, exempt=exempt)
        signals = PoolSignals(100.0, 40.0, 0.0, 0.0, None, active_now=held.active if held else 1)
        rec = size_pool(
            "us-east", None, signals, TEN, policy, now=100.0, ttft_slo_s=None, budget=b
        ).record
        assert rec.budget is not None
        if rec.budget.over:
            assert any(r.startswith("over its budget now (") for r in rec.reasons)
        return rec.budget

    assert note(Held(active=6)).over
    assert note(Held(active=4, warm=5, warm_kept=5)).over  # WARM in their dwell: $50
    assert not note(Held(active=4)).over
    assert not note(Held(active=6), exempt="failover from us-west").over
    assert not note(None).over


def test_the_record_is_written_at_once_when_the_pool_goes_over_or_will_be_short() -> None:
    base = ScaleRecord(unit="us-east", active=4, warm=0, decided_at=0, changed_at=0)

    def with_note(**note: object) -> ScaleRecord:
        return base.model_copy(update={"budget": BudgetNote(spend_per_hour=40.0, **note)})

    calm = with_note()
    assert not _budget_news(calm, with_note(binds="budget binds: ..."))  # capped, not short
    assert _budget_news(calm, with_note(over=True))
    assert _budget_news(calm, with_note(short_at_end=2, ends_at=9.0))
    assert _budget_news(calm, with_note(short=1))
    assert not _budget_news(with_note(over=True), with_note(over=True))


class _Pool:
    """What the follower hands the warm pool (``WarmPool.set_sizes``), recorded."""

    slots = 8

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool]] = []

    async def set_sizes(
        self, active: int, warm: int, *, over_budget: bool = False
    ) -> tuple[int, int]:
        self.calls.append((active, warm, over_budget))
        return active, warm


def test_the_agent_hands_its_pool_the_over_budget_word() -> None:
    keys, store, pool = Keys("t"), MemoryStore(), _Pool()
    follower = ScaleFollower("us-east", cast(WarmPool, pool), store, keys, interval_s=1.0)

    async def follow(note: BudgetNote | None) -> None:
        rec = ScaleRecord(unit="us-east", active=4, warm=0, decided_at=0, changed_at=0, budget=note)
        await store.put(keys.scale("us-east"), encode(rec))
        await follower._record.load()
        await follower.step()

    asyncio.run(follow(BudgetNote(spend_per_hour=60.0, over=True)))
    asyncio.run(follow(BudgetNote(spend_per_hour=40.0)))
    asyncio.run(follow(None))
    assert pool.calls == [(4, 0, True), (4, 0, False), (4, 0, False)]
