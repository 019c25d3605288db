"""The ``cost`` bench's pool and the leader around it: what both of its scenarios run.

- :class:`SheddingSim`: the autoscale bench's model (``bench/autoscale_sim.py``) with
  admission shedding: while ``shedding``, a batch request is refused at arrival.
- :class:`Leader`: once a second before the scaler, the leader's view of the pool as
  ``core/scale_tick`` builds it: a :class:`~controlplane.kernel.snapshot.Snapshot` with
  the pool's ``pools/<unit>`` counts (the planner's slots) and, once a failover runs,
  the source region FAILING_OVER with its plan; then the real
  ``scale_tick.moving_loads`` (the failover's load moving here, and its hit rate) and
  ``scale_tick.pool_budget`` (the budget, exempt within the failover's allowance,
  binding again after it) hand the scaler what the leader's tick hands ``size_pool``.
- :class:`FailoverTarget`: the autoscale bench's Tectonic (``size_pool`` once a second,
  the agent's warm-pool planner) with the failover's ``moving`` passed to ``size_pool``
  as ``scale_moves`` passes it.
- :class:`LadderDriver`: the leader's ladder tick for the pool (``core/ladder_tick``'s
  inputs), the real executor on ``runbooks/degradation.yaml``.
- :func:`spend_per_second`: the truth, the model's replicas in each state x the prices.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from bench import autoscale
from bench.autoscale_policies import Tectonic
from bench.autoscale_sim import (
    ACTIVE,
    IDLE,
    LOADING,
    STATES,
    STOPPING,
    WAKING,
    WARM,
    Controller,
    Sim,
)
from controlplane.core.ladder_executor import mode_for, next_ladder_action
from controlplane.core.ladder_tick import budget_paid, ladder_lead_s
from controlplane.core.scale_tick import moving_loads as leader_moving  # what scale_moves passes
from controlplane.core.scale_tick import pool_budget
from controlplane.core.scaler import Capacity
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.ladder.model import LOAD_SIGNAL, Ladder, with_headroom
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import (
    FailoverPlan,
    FailoverProgress,
    FailoverStep,
    PrewarmFigures,
    RegionHealth,
    RegionRecord,
    RegionState,
)
from controlplane.kernel.pool.cost import CostPolicy
from controlplane.kernel.pool.scale import ScalingPolicy
from controlplane.kernel.snapshot import RegionView, Snapshot
from regions.pool.states import DwellPolicy

UNIT = "bench"  # the pool's failover unit, as the autoscale bench's scaler names it
SOURCE = "source"  # the failed region whose load a failover moves onto the pool
ZONE = "z"  # both in one zone; only the pool's own budget is set
SHED_STEP = "shed-batch"  # runbooks/degradation.yaml's last step (shed_low_priority)
GPU_HELD = (ACTIVE, IDLE, WAKING, LOADING, STOPPING)


# ---- the model with admission shedding --------------------------------------------------


class SheddingSim(Sim):
    """The autoscale model; while ``shedding``, a batch request is refused at admission
    (never routed, never served), as the gateway's ``shed_low_priority`` refuses it."""

    batch: np.ndarray
    shed: np.ndarray
    shedding: bool = False

    def tag(self, batch: np.ndarray) -> None:
        self.batch = batch
        self.shed = np.zeros(len(batch), dtype=bool)

    def _arrive(self, i: int) -> None:
        if self.shedding and self.batch[i]:
            self.shed[i] = True
            return
        super()._arrive(i)


def shedding_sim(s: autoscale.Setup, batch: np.ndarray) -> SheddingSim:
    sim = SheddingSim(
        autoscale.ENGINE, autoscale.LIFE, s.arrivals, start_s=s.start, end_s=s.scenario.end_s,
        launches=s.launches, hit_rate=s.scenario.hit,
    )  # fmt: skip
    sim.tag(batch)
    return sim


# ---- the scaler: Tectonic with a failover's moving load -----------------------------------


# The autoscale bench's Tectonic: its ``moving`` (set by :class:`Leader` each second)
# goes to ``size_pool`` as the leader's ``scale_moves`` passes it.
FailoverTarget = Tectonic


def failover_target(s: autoscale.Setup) -> FailoverTarget:
    """Seeded as ``autoscale.tectonic`` seeds its Tectonic (forecast on): the ACTIVE the
    first load needs, the WARM its first decision keeps for ``standby_rps``."""
    o = s.o
    policy = ScalingPolicy(
        forecast=True, burst_warm=o.burst_warm, standby_rps=o.standby_rps, max_active=o.max_replicas
    )
    why = f"engine model: first-token p99 at the SLO / {o.factor_of_safety:g}"
    return FailoverTarget(
        policy, Capacity(lambda h: s.per_replica(h) / o.factor_of_safety, why), slo_s=o.slo_s,
        dwell=DwellPolicy(), slots=2 * o.max_replicas,
    )  # fmt: skip


def seed_pool(s: autoscale.Setup, scaler: FailoverTarget, sim: Sim) -> None:
    scaler.seed(sim, s.need[0], autoscale.first_warm(s, scaler.policy))


# ---- the leader's view: the snapshot scale_tick reads ---------------------------------------


@dataclass(frozen=True)
class Failover:
    """The failover the leader runs: ``source`` FAILING_OVER from ``started_at`` (the
    model's clock), its plan moving ``moved_rps`` (measured at the source, at
    ``source_hit_rate``) all onto the pool; ``attained``: the pre-warm's verified
    attainment on it (None: no pre-warm, the load arrives cold)."""

    started_at: float
    moved_rps: float
    source_hit_rate: float
    attained: float | None = 1.0

    def record(self) -> RegionRecord:
        plan_ = FailoverPlan(
            source=SOURCE,
            targets={UNIT: 1.0},
            reason="bench: the source's replicas failed",
            actor="bench",
            moved_rps=self.moved_rps,
            source_hit_rate=self.source_hit_rate,
        )
        warmed = self.attained is not None
        progress = FailoverProgress(
            plan=plan_,
            started_at=self.started_at,
            done=(FailoverStep.PREWARM, FailoverStep.SWITCH) if warmed else (FailoverStep.SWITCH,),
            prewarm_result=PrewarmFigures(attained_fraction=self.attained),
        )
        return RegionRecord(
            region=SOURCE, state=RegionState.FAILING_OVER, since=self.started_at, failover=progress
        )


def topology(cost: CostPolicy) -> Topology:
    """The two regions the leader knows, with the pool's ``cost:`` section (what
    ``pool_budget`` reads: prices, budgets, ``failover_allowance_s``, zones)."""
    return parse_topology(
        {
            "cluster": "bench",
            "regions": [
                {"name": n, "zone": ZONE, "agent": f"127.0.0.1:{i}", "capacity_rps": 100}
                for i, n in enumerate((UNIT, SOURCE), start=1)
            ],
            "cost": cost.model_dump(),
        }
    )


class Leader(Controller):
    """Once a second before the scaler: the leader's snapshot of the pool and the
    failover (when one runs), and what ``scale_tick`` hands ``size_pool`` from it: the
    moving load (``moving_loads``) and the budget (``pool_budget``, with ``held``: what the
    pool holds now, ``pools/<unit>`` as the agent publishes it)."""

    interval_s = 1.0

    def __init__(self, scaler: FailoverTarget, cost: CostPolicy, failover: Failover | None) -> None:
        self.scaler, self.failover, self.topo = scaler, failover, topology(cost)
        self._pool = RegionView(
            name=UNIT, record=RegionRecord(region=UNIT), health=RegionHealth(region=UNIT)
        )
        self._source = RegionView(
            name=SOURCE, record=RegionRecord(region=SOURCE), health=RegionHealth(region=SOURCE)
        )
        self._failing = None if failover is None else failover.record()
        self.exempt: list[float] = []  # seconds the budget handed the scaler was exempt
        self.lapsed_at: float | None = None  # the first second it said the allowance ended

    def tick(self, now: float, sim: Sim) -> None:
        snap = Snapshot(now=now, regions={UNIT: self._held(now), SOURCE: self._source_at(now)})
        moving = leader_moving(snap).get(UNIT)
        # no zone or fleet budget: what other pools spend is not read
        budget = pool_budget(snap, self.topo, UNIT, moving, {})
        assert budget is not None  # the topology has cost:
        if budget.exempt:
            self.exempt.append(now)
        if budget.lapsed and self.lapsed_at is None:
            self.lapsed_at = now
        self.scaler.budget, self.scaler.moving = budget, moving

    def _held(self, now: float) -> RegionView:
        """``pools/<unit>`` from the planner's slots: ACTIVE (WAKING being made ACTIVE),
        WARM with IDLE (and of it IDLE, and the WARM in their dwell), launches."""
        live = [r for r in self.scaler.slots.values() if r is not None]
        n = Counter(r.state for r in live)
        # the agent's dwell check (regions/agent/warm_pool.py): WARM it may not stop yet
        dwell = self.scaler.dwell.warm_min_s
        kept = sum(r.state == WARM and now - r.since < dwell for r in live)
        return self._pool.model_copy(
            update={
                "active_replicas": n[ACTIVE] + n[WAKING],
                "warm_replicas": n[WARM] + n[IDLE],
                "idle_replicas": n[IDLE],
                "warm_kept_replicas": kept,
                "launching_replicas": n[LOADING],
            }
        )

    def _source_at(self, now: float) -> RegionView:
        if self._failing is None or self.failover is None or now < self.failover.started_at:
            return self._source
        return self._source.model_copy(update={"record": self._failing})


# ---- the ladder ---------------------------------------------------------------------------


class LadderDriver(Controller):
    """The leader's ladder tick for the pool (``core/ladder_tick``'s inputs, in process):
    the budget holds it short now or within the ladder's lead (``ladder_tick.budget_paid``
    on the scaler's record, with ``ladder_lead_s``): DEGRADING; else RECOVERING (a NORMAL
    region; a failover target whose plan is not ``headroom_short``). Signals: the load,
    against what the budget pays for while short (``_bearable``), else the record's
    ACTIVE capacity."""

    interval_s = 1.0

    def __init__(self, scaler: Tectonic, ladder: Ladder) -> None:
        self.scaler, self.ladder = scaler, ladder
        self.lead_s = ladder_lead_s(ladder)
        self.record = DegradationRecord(region=UNIT)
        self.changes: list[tuple[float, str, str]] = []  # (t, APPLY/RESTORE, step)
        self.short: list[float] = []  # seconds the record was short (budget.short)
        # seconds the budget would hold it short once an exemption ending within the
        # lead ends (budget.short_at_end): the ladder degrades ahead of the cut
        self.ahead: list[float] = []

    def tick(self, now: float, sim: Sim) -> None:
        rec = self.scaler.memory
        if rec is None or rec.per_replica_rps is None:
            return
        paid = budget_paid(rec, now, self.lead_s)
        if rec.budget is not None and rec.budget.short:
            self.short.append(now)
        elif paid is not None:
            self.ahead.append(now)
        mode = mode_for(RegionState.NORMAL, short_of_headroom=paid is not None)
        bears = rec.per_replica_rps * (rec.active if paid is None else paid)
        signals = with_headroom({LOAD_SIGNAL: sim.load_rps(now)}, bears)
        action = next_ladder_action(self.ladder, self.record, signals, mode, now)
        if action.change is not None:
            self.changes.append((now, action.kind.value, action.step or ""))
        self.record = action.record
        assert isinstance(sim, SheddingSim)
        sim.shedding = SHED_STEP in self.record.applied

    def short_s(self, lo: float = 0.0, hi: float = math.inf) -> int:
        """Seconds in [lo, hi) the record was short."""
        return sum(lo <= t < hi for t in self.short)

    def shed_on(self) -> list[float]:
        """When the ladder applied ``shed-batch``."""
        return [c[0] for c in self.changes if c[2] == SHED_STEP and c[1] == "apply"]


# ---- the truth -----------------------------------------------------------------------------


def spend_per_second(
    sim: Sim, prices_active: float, prices_warm: float
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """$/h each second of [0, end) from the model's replica states (the truth): each
    entry is the state during the second that ends at its ``t``."""
    t = np.asarray(sim.timeline["t"])
    keep = (t > 0.0) & (t <= sim.end_s)
    by = {st: np.asarray(sim.timeline[st])[keep] for st in STATES}
    spend = sum(by[st] * prices_active for st in GPU_HELD) + by[WARM] * prices_warm
    return t[keep], np.asarray(spend, dtype=float), by


def r4(x: float, digits: int = 4) -> float:
    return round(float(x), digits)
