"""The ``cost`` bench's failover scenario: the pool becomes a failover's target, spends
past its budget within the allowance, and the budget binds again after it.

The pool serves its own load (``own_rps``) at the ramp's peak hit rate; ``lead_s``
into the measured run a source region fails and its load (``moved_rps``) is routed
here: extra arrivals on the same model (Poisson, so the sum is one Poisson stream at
``own_rps + moved_rps``), at the same hit rate (the pre-warm verified every chosen
prefix: ``moved_hit_rate(source, 1.0)``). The failover runs to the end of the run (the
source does not recover). What decides is the real code: the leader's view
(``bench/cost_model.Leader``) hands the scaler ``scale_tick.moving_loads``'s load and
``scale_tick.pool_budget``'s budget, exempt until ``cost.failover_allowance_s`` less
``cost.failover_wind_down_s`` after the failover's start, binding again from then (the
replicas it cuts stop without their WARM dwell while the pool is over its budget); the
ladder degrades from its lead before that and sheds batch by the cut. Figures come from
the truth (replicas x prices each second), split at the allowance's window as the
topology sets it (not as the scaler's record says).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench import autoscale
from bench.autoscale_sim import ACTIVE, Scenario
from bench.cost_model import (
    Failover,
    FailoverTarget,
    LadderDriver,
    Leader,
    SheddingSim,
    failover_target,
    r4,
    seed_pool,
    shedding_sim,
    spend_per_second,
)
from controlplane.kernel.ladder.file import load_ladder
from controlplane.kernel.pool.cost import CostPolicy

_OVER = 1.0 + 1e-9  # over the budget: past float rounding of spend / budget


@dataclass(frozen=True)
class Shape:
    """The scenario: the pool's own load, the moved load and its hit rate, when the
    failover starts (``lead_s``), its allowance and how long the run goes on after."""

    own_rps: float
    moved_rps: float
    hit_rate: float
    lead_s: float
    allowance_s: float
    after_s: float

    @property
    def lapse_s(self) -> float:
        """When the allowance ends, on the model's clock."""
        return self.lead_s + self.allowance_s

    @property
    def end_s(self) -> float:
        return self.lapse_s + self.after_s

    def scenario(self) -> Scenario:
        own, both, h = self.own_rps, self.own_rps + self.moved_rps, self.hit_rate
        f = self.lead_s
        knots = ((0.0, own, h), (f, own, h), (f + 1.0, both, h), (self.end_s, both, h))
        return Scenario("failover", knots, self.end_s)


@dataclass
class FailoverRun:
    sim: SheddingSim
    scaler: FailoverTarget
    leader: Leader
    driver: LadderDriver


def run_failover(
    s: autoscale.Setup, shape: Shape, batch: np.ndarray, cost: CostPolicy
) -> FailoverRun:
    """The pool, its leader's view, the scaler and the ladder on the failover's arrivals."""
    sim = shedding_sim(s, batch)
    scaler = failover_target(s)
    seed_pool(s, scaler, sim)
    failover = Failover(
        started_at=shape.lead_s, moved_rps=shape.moved_rps, source_hit_rate=shape.hit_rate
    )
    leader = Leader(scaler, cost, failover)
    driver = LadderDriver(scaler, load_ladder())
    sim.run([leader, scaler, driver])
    return FailoverRun(sim, scaler, leader, driver)


# ---- figures -------------------------------------------------------------------------------


def back_within(t: np.ndarray, over: np.ndarray, lapse: float) -> float | None:
    """Seconds from the allowance's end until the spend is within the budget and stays
    so to the end of the run (0: it was at once); None: still over at the end."""
    late = np.nonzero((t > lapse) & (over > _OVER))[0]
    if late.size == 0:
        return 0.0
    last = int(late[-1])
    if last == t.size - 1:
        return None
    return float(t[last] - lapse)


def requests_in(sim: SheddingSim, lo: float, hi: float, slo_s: float) -> dict[str, object]:
    """Interactive attainment and p99, batch shed, of the requests arriving in [lo, hi)."""
    at = np.asarray(sim.arr.at)
    m = np.nonzero((at >= lo) & (at < hi))[0]
    batch, shed, ttft = sim.batch[m], sim.shed[m], sim.ttft[m]
    inter = ~batch
    return {
        "requests": int(m.size),
        "interactive_attainment": r4(np.mean(ttft[inter] <= slo_s)) if inter.any() else None,
        "interactive_p99_s": r4(np.percentile(ttft[inter], 99)) if inter.any() else None,
        "batch_shed_share": r4(shed[batch].sum() / max(1, batch.sum())),
    }


def phase(
    run: FailoverRun,
    t: np.ndarray,
    over: np.ndarray,
    active: np.ndarray,
    span: tuple[float, float],
    slo_s: float,
) -> dict[str, object]:
    """One phase's requests (arriving in [lo, hi)) and spend (the seconds in (lo, hi])."""
    lo, hi = span
    sec = (t > lo) & (t <= hi)
    return {
        "from_s": lo,
        "to_s": hi,
        **requests_in(run.sim, lo, hi, slo_s),
        "max_spend_over_budget": r4(over[sec].max()) if sec.any() else None,
        "seconds_over_budget": int((over[sec] > _OVER).sum()),
        "peak_active": int(active[sec].max()) if sec.any() else None,
        "short_s": run.driver.short_s(lo, hi),
    }


def figures(
    run: FailoverRun, shape: Shape, cost: CostPolicy, budget: float, slo_s: float
) -> dict[str, object]:
    """The failover run from the truth: spend / budget outside and inside the allowance's
    window, the time back within the budget after it, the phases' requests."""
    prices = cost.prices
    t, spend, by = spend_per_second(run.sim, prices.active, prices.warm)
    over = spend / budget
    f, lapse = shape.lead_s, shape.lapse_s
    inside = (t > f) & (t <= lapse)  # seconds whose state the exempt decisions set
    worst = int(np.argmax(np.where(inside, -np.inf, over)))  # the worst second outside
    spans = {"before": (0.0, f), "allowance": (f, lapse), "after": (lapse, shape.end_s)}
    phases = {k: phase(run, t, over, by[ACTIVE], v, slo_s) for k, v in spans.items()}
    since = requests_in(run.sim, f, shape.end_s, slo_s)  # the failover part: from its start
    leader = run.leader
    shed_on = run.driver.shed_on()
    cut = leader.lapsed_at  # the exemption's end: the budget binds again from here
    ahead = run.driver.ahead
    # from the ladder's first step ahead of the cut (else the cut) to the allowance's end
    ending = (ahead[0] if ahead else lapse if cut is None else min(cut, lapse), lapse)
    return {
        "max_spend_over_budget": r4(over[~inside].max()),
        "max_spend_over_budget_at_s": float(t[worst]),
        "states_at_max_spend": {st: int(v[worst]) for st, v in by.items() if v[worst]},
        "max_spend_over_budget_in_allowance": r4(over[inside].max()) if inside.any() else None,
        "allowance_s": shape.allowance_s,
        "allowance_window_s": [f, lapse],
        "back_within_budget_s": back_within(t, over, lapse),
        "wind_down_s": cost.failover_wind_down_s,
        "back_within_budget_after_cut_s": None if cut is None else back_within(t, over, cut),
        "seconds_over_budget_after_allowance": int(((t > lapse) & (over > _OVER)).sum()),
        "interactive_attainment": since["interactive_attainment"],
        "interactive_p99_s": since["interactive_p99_s"],
        "batch_shed_share": since["batch_shed_share"],
        "requests": since["requests"],
        "phases": phases,
        "allowance_end": phase(run, t, over, by[ACTIVE], ending, slo_s),
        "exempt_from_s": leader.exempt[0] if leader.exempt else None,
        "exempt_until_s": leader.exempt[-1] if leader.exempt else None,
        "lapsed_at_s": leader.lapsed_at,
        "shed_batch_applied_at_s": next((x for x in shed_on if x >= f), None),
        "degrading_ahead_from_s": ahead[0] if ahead else None,
        "ladder_changes": [[c[0], c[1], c[2]] for c in run.driver.changes if c[0] >= 0],
        "scaler_targets": [list(x) for x in run.scaler.targets if x[0] >= f - 1],
        "dollars": r4(spend.sum() / 3600.0, 2),
    }


def settings(shape: Shape, cost: CostPolicy) -> dict[str, object]:
    return {
        "own_rps": shape.own_rps,
        "moved_rps": shape.moved_rps,
        "hit_rate": shape.hit_rate,
        "failover_at_s": shape.lead_s,
        "allowance_s": shape.allowance_s,
        "wind_down_s": cost.failover_wind_down_s,
        "after_s": shape.after_s,
        "end_s": shape.end_s,
        "failover_allowance_s": cost.failover_allowance_s,
        "moved_load": "extra Poisson arrivals on the same model from failover_at_s to the "
        "end (the source does not recover), tagged batch as the pool's own are, at the same "
        "hit rate: the pre-warm verified every chosen prefix (attained 1.0, so "
        "moved_hit_rate is the source's)",
        "leader": "each second before the scaler, a Snapshot of the pool (pools/<unit> "
        "from the planner's slots) and the source FAILING_OVER with its plan (moved_rps, "
        "source_hit_rate, targets {pool: 1}, PREWARM and SWITCH done) from failover_at_s; "
        "controlplane.core.scale_tick.moving_loads and pool_budget on it hand size_pool its "
        "moving and budget, as scale_moves does",
        "allowance_window": "the seconds (failover_at_s, failover_at_s + allowance_s] of "
        "the truth: their states follow decisions the budget exempted, and its last "
        "wind_down_s the budget's cut winding the pool down to it; every other second "
        "counts for max_spend_over_budget",
        "allowance_end": "the requests arriving, and the seconds, from the ladder's first "
        "step ahead of the cut (degrading_ahead_from_s) to the allowance's end",
        "time": "the model's own seconds, no compression: the allowance lasts "
        "cost.failover_allowance_s of the model (--allowance-s, the topology's default "
        "1800 s; --quick sets a shorter allowance, not a faster clock)",
    }
