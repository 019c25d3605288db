"""``python -m bench cost``: the reference ramp with a pool budget that binds at its peak.

The autoscale bench's reference ramp (12 -> 240 requests/s in 90 s, hit rate 0.65 ->
0.83, ``--peak-s`` at 240, back down; ``bench/autoscale.py``'s ``scenarios``) on its
discrete-event model of the simulator's engine (``bench/autoscale_sim.py``), each
request tagged interactive or batch (``--batch-share``, seeded). Two runs on the same
arrivals:

- **budget**: Tectonic's real scaler (:func:`controlplane.core.scaler.size_pool`) with
  the pool's real budget (:func:`controlplane.core.spend.budget_for` of a
  :class:`~controlplane.kernel.pool.cost.CostPolicy` whose ``pool_budgets`` is
  ``--budget-share`` x the oracle's peak ACTIVE replicas x ``--active-price``), the
  agent's real warm-pool planner, and the real degradation ladder
  (:func:`controlplane.core.ladder_executor.next_ladder_action` on
  ``runbooks/degradation.yaml``, a fake clock, once a second after the scaler), fed as
  ``core/ladder_tick`` feeds it: DEGRADING while the record's ``budget.short`` > 0, the
  load against what the budget pays for (``per_replica_rps`` x the record's ACTIVE).
  While its ``shed-batch`` step is applied, batch requests are refused at admission
  (as the gateway's ``shed_low_priority`` does), interactive ones are served;
  The budget is handed what the pool holds each second before the scaler runs, as the
  leader reads ``pools/<unit>`` (``core/scale_tick.pool_budget``'s ``held``): the
  planner's slots, ACTIVE (with WAKING: being made ACTIVE), IDLE, WARM (and of them
  those in their WARM dwell) and launching (LOADING);
- **no budget**: the same without ``cost:`` (no budget, no ladder), for comparison.

Truth (not the scaler's record): each second, the spend is the model's replicas in
each state times the price sheet: ACTIVE, IDLE, WAKING, LOADING and STOPPING hold a GPU
(``--active-price``), WARM is asleep (``--warm-price`` x it). ``max_spend_over_budget``
is the highest spend / budget over [0, end) (no failover here: no allowance excluded).
One JSON line per run, then the headline; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from bench import autoscale
from bench._common import BenchError, Reporter, terminate_as_interrupt
from bench.autoscale_policies import Tectonic, capacity_curve
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
from controlplane.core.spend import Budget, Held, budget_for
from controlplane.kernel.ladder.file import load_ladder
from controlplane.kernel.ladder.model import LOAD_SIGNAL, Ladder, with_headroom
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import RegionState
from controlplane.kernel.pool.cost import CostPolicy, Prices

UNIT = "bench"  # the pool's failover unit, as the autoscale bench's scaler names it
SHED_STEP = "shed-batch"  # runbooks/degradation.yaml's last step (shed_low_priority)
GPU_HELD = (ACTIVE, IDLE, WAKING, LOADING, STOPPING)


@dataclass(frozen=True)
class Goals:
    max_spend_over_budget: float = 1.0  # at most
    interactive_attainment: float = 0.99  # at least


GOALS = Goals()


@dataclass(frozen=True)
class Options:
    quick: bool = False
    seed: int = 1
    slo_s: float = 5.0
    preroll_s: float = 600.0
    batch_share: float = 0.3
    budget_share: float = 0.8
    active_price: float = 10.0
    warm_price: float = 0.6
    standby_rps: float = 240.0
    max_replicas: int = 64
    capacity_requests: int = 100_000
    quiet: bool = False


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


class LadderDriver(Controller):
    """The leader's ladder tick for the pool (``core/ladder_tick``'s inputs, in process):
    the budget holds it short (the scaler's record's ``budget.short`` > 0): DEGRADING;
    else RECOVERING (a NORMAL region). Signals: the load, against what the budget pays
    for while short (``_bearable``), else the record's ACTIVE capacity."""

    interval_s = 1.0

    def __init__(self, scaler: Tectonic, ladder: Ladder) -> None:
        self.scaler, self.ladder = scaler, ladder
        self.record = DegradationRecord(region=UNIT)
        self.changes: list[tuple[float, str, str]] = []  # (t, APPLY/RESTORE, step)
        self.short_s = 0

    def tick(self, now: float, sim: Sim) -> None:
        rec = self.scaler.memory
        if rec is None or rec.per_replica_rps is None:
            return
        broke = rec.budget is not None and rec.budget.short > 0
        self.short_s += broke and now >= 0.0  # measured seconds only
        mode = mode_for(RegionState.NORMAL, short_of_headroom=broke)
        bears = rec.per_replica_rps * rec.active
        signals = with_headroom({LOAD_SIGNAL: sim.load_rps(now)}, bears)
        action = next_ladder_action(self.ladder, self.record, signals, mode, now)
        if action.change is not None:
            self.changes.append((now, action.kind.value, action.step or ""))
        self.record = action.record
        assert isinstance(sim, SheddingSim)
        sim.shedding = SHED_STEP in self.record.applied


class PoolPublisher(Controller):
    """The agent's ``pools/<unit>`` as the leader's tick reads it, once a second before
    the scaler: the budget the scaler sizes against holds what the pool holds now."""

    interval_s = 1.0

    def __init__(self, scaler: Tectonic, budget: Budget) -> None:
        self.scaler, self.budget = scaler, budget

    def tick(self, now: float, sim: Sim) -> None:
        live = [r for r in self.scaler.slots.values() if r is not None]
        n = Counter(r.state for r in live)
        # the agent's dwell check (regions/agent/warm_pool.py): WARM it may not stop yet
        kept = sum(r.state == WARM and now - r.since < self.scaler.dwell.warm_min_s for r in live)
        held = Held(
            active=n[ACTIVE] + n[WAKING],
            idle=n[IDLE],
            warm=n[WARM],
            launching=n[LOADING],
            warm_kept=kept,
        )
        self.scaler.budget = replace(self.budget, held=held)


# ---- one run ----------------------------------------------------------------------------


def _setup(o: Options) -> tuple[autoscale.Setup, int]:
    ao = autoscale.Options(
        quick=o.quick, seed=o.seed, slo_s=o.slo_s, preroll_s=o.preroll_s,
        warm_price=o.warm_price, standby_rps=o.standby_rps, max_replicas=o.max_replicas,
        capacity_requests=o.capacity_requests, no_check=True, quiet=o.quiet,
    )  # fmt: skip
    per_replica, _ = capacity_curve(
        autoscale.ENGINE, o.slo_s, requests=o.capacity_requests, seed=o.seed
    )
    s = autoscale.Setup(ao, autoscale.scenarios(ao)["policies"], per_replica, seed=o.seed)
    return s, max(s.need)


def _sim(s: autoscale.Setup, batch: np.ndarray) -> SheddingSim:
    sim = SheddingSim(
        autoscale.ENGINE, autoscale.LIFE, s.arrivals, start_s=s.start, end_s=s.scenario.end_s,
        launches=s.launches, hit_rate=s.scenario.hit,
    )  # fmt: skip
    sim.tag(batch)
    return sim


def one_run(
    s: autoscale.Setup, batch: np.ndarray, o: Options, prices: Prices, budget: float | None
) -> dict[str, object]:
    """Tectonic on the ramp, with the pool's budget and the ladder (``budget``: $/h),
    or with neither (None)."""
    cost = None
    if budget is not None:
        cost = CostPolicy(prices=prices, pool_budgets={UNIT: budget})
    sim = _sim(s, batch)
    pool_budget = None if cost is None else budget_for(cost, UNIT, {UNIT: "z"}, {})
    controllers = autoscale.tectonic(s, forecast=True, budget=pool_budget)(sim)
    scaler = controllers[0]
    assert isinstance(scaler, Tectonic)
    driver = None
    if pool_budget is not None:
        driver = LadderDriver(scaler, load_ladder())
        controllers = [PoolPublisher(scaler, pool_budget), *controllers, driver]
    sim.run(controllers)
    return figures(sim, o, prices, budget, scaler, driver)


def spend_per_second(
    sim: Sim, prices: Prices
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """$/h each second of [0, end) from the model's replica states (the truth)."""
    t = np.asarray(sim.timeline["t"])
    keep = (t > 0.0) & (t <= sim.end_s)  # the state during each second, at its end
    by = {st: np.asarray(sim.timeline[st])[keep] for st in STATES}
    spend = sum(by[st] * prices.active for st in GPU_HELD) + by[WARM] * prices.warm
    return t[keep], np.asarray(spend, dtype=float), by


def _r(x: float, digits: int = 4) -> float:
    return round(float(x), digits)


def figures(
    sim: SheddingSim,
    o: Options,
    prices: Prices,
    budget: float | None,
    scaler: Tectonic,
    driver: LadderDriver | None,
) -> dict[str, object]:
    m = sim.measured()
    ttft, batch, shed = sim.ttft[m], sim.batch[m], sim.shed[m]
    inter = ~batch
    served_batch = batch & ~shed
    t, spend, by = spend_per_second(sim, prices)
    worst = int(np.argmax(spend))
    out: dict[str, object] = {
        "requests": int(m.size),
        "interactive": int(inter.sum()),
        "batch": int(batch.sum()),
        "interactive_attainment": _r(np.mean(ttft[inter] <= o.slo_s)),
        "interactive_p99_s": _r(np.percentile(ttft[inter], 99)),
        "batch_shed_share": _r(shed[batch].sum() / max(1, batch.sum())),
        "batch_attainment_served": _r(np.mean(ttft[served_batch] <= o.slo_s))
        if served_batch.any()
        else None,
        "max_spend_per_hour": _r(spend.max(), 2),
        "mean_spend_per_hour": _r(spend.mean(), 2),
        "dollars": _r(spend.sum() / 3600.0, 2),
        "max_spend_at_s": float(t[worst]),
        "states_at_max_spend": {st: int(v[worst]) for st, v in by.items() if v[worst]},
        "peak_active": int(by[ACTIVE].max()),
    }
    if budget is not None:
        over = spend / budget
        out["budget_per_hour"] = _r(budget, 2)
        out["max_spend_over_budget"] = _r(over.max())
        out["seconds_over_budget"] = int((over > 1.0 + 1e-9).sum())
        out["scaler_target_changes"] = len(scaler.targets)
    if driver is not None:
        out["short_s"] = driver.short_s
        out["ladder_changes"] = [[c[0], c[1], c[2]] for c in driver.changes]
        on = [c[0] for c in driver.changes if c[2] == SHED_STEP and c[1] == "apply"]
        out["shed_batch_applied_at_s"] = on[0] if on else None
    return out


# ---- the bench ----------------------------------------------------------------------------


def settings(
    o: Options, s: autoscale.Setup, peak: int, prices: Prices, budget: float
) -> dict[str, object]:
    buys = int(budget / prices.active + 1e-9)
    top_rps = max(k[1] for k in s.scenario.knots)
    top_hit = max(k[2] for k in s.scenario.knots)
    return {
        "scenario": {"knots": s.scenario.knots, "end_s": s.scenario.end_s},
        "slo_s": o.slo_s,
        "preroll_s": o.preroll_s,
        "batch_share": o.batch_share,
        "prices_per_replica_hour": prices.model_dump(),
        "spend_states": {
            "active_price": list(GPU_HELD),
            "warm_price": [WARM],
            "note": "the truth: the model's replica states each second x the price sheet, "
            "not the scaler's record; a launch (LOADING) holds its GPU",
        },
        "oracle_peak_active": peak,
        "budget_per_hour": budget,
        "budget_rule": f"{o.budget_share:g} x the oracle's peak ACTIVE ({peak}) x "
        f"${prices.active:g}/h: binds at the peak",
        "budget_active": buys,
        "budget_capacity_rps_at_peak": round(buys * s.per_replica(top_hit), 1),
        "interactive_peak_rps": round((1.0 - o.batch_share) * top_rps, 1),
        "budget_note": "the ACTIVE the budget buys at the peak's hit rate against the "
        "interactive load there: under it, no controller can keep interactive's SLO",
        "scaler": "controlplane.core.scaler.size_pool with budget_for(CostPolicy(pool_budgets))"
        ", forecast on, standby_rps "
        f"{o.standby_rps:g}, the agent's warm-pool planner (bench/autoscale_policies.Tectonic)",
        "ladder": "the real executor (controlplane.core.ladder_executor.next_ladder_action) on "
        "runbooks/degradation.yaml, once a second after the scaler, on the model's clock; "
        "mode and signals as core/ladder_tick builds them: DEGRADING while the scaler's "
        "record has budget.short > 0, else RECOVERING (a NORMAL region); signals: load_rps "
        "against per_replica_rps x the record's ACTIVE (headroom, capacity utilisation); "
        "TTFT and error rates are not fed (the ladder file's 0.5 s TTFT baseline is a real "
        "deployment's, not this model's), so only the budget moves it",
        "shedding": "while shed-batch is applied, batch requests are refused at admission "
        "(the gateway's shed_low_priority, modelled: no gateway runs; the flag takes effect "
        "on the next arrival, no watch delay)",
        "failover_allowance": "no failover in this scenario: no second is excluded",
        "time": "event-driven, in the scenario's own seconds (no compression)",
    }


def run_bench(o: Options, say: Reporter) -> dict[str, object]:
    started = time.monotonic()
    say.progress("capacity at the SLO per hit rate (steady-state model of the engine)")
    s, peak = _setup(o)
    prices = Prices(active=o.active_price, warm=o.warm_price * o.active_price)
    budget = round(o.budget_share * peak * prices.active, 2)
    rng = np.random.default_rng(o.seed + 31)
    batch = rng.random(len(s.arrivals)) < o.batch_share
    say.progress(f"budget ${budget:g}/h ({o.budget_share:g} x {peak} ACTIVE x ${prices.active:g})")
    runs: dict[str, dict[str, object]] = {}
    for name, b in (("budget", budget), ("no_budget", None)):
        cpu = time.process_time()
        runs[name] = one_run(s, batch, o, prices, b)
        say.progress(
            f"{name}: max spend ${runs[name]['max_spend_per_hour']}/h, interactive attainment "
            f"{runs[name]['interactive_attainment']}, batch shed "
            f"{runs[name]['batch_shed_share']} ({time.process_time() - cpu:.1f} s)"
        )
        say.line({"run": name, **runs[name]})
    with_b, without = runs["budget"], runs["no_budget"]
    over = float(with_b["max_spend_over_budget"])  # type: ignore[arg-type]
    inter = float(with_b["interactive_attainment"])  # type: ignore[arg-type]
    out: dict[str, object] = {
        "bench": "cost",
        "max_spend_over_budget": over,
        "interactive_attainment": inter,
        "batch_shed_share": with_b["batch_shed_share"],
        "budget_per_hour": budget,
        "budget": with_b,
        "no_budget": {
            **without,
            "max_spend_over_budget": _r(float(without["max_spend_per_hour"]) / budget),  # type: ignore[arg-type]
        },
        "goals": asdict(GOALS),
        "met": {
            "max_spend_over_budget": over <= GOALS.max_spend_over_budget,
            "interactive_attainment": inter >= GOALS.interactive_attainment,
        },
        "settings": settings(o, s, peak, prices, budget),
        "wall_s": round(time.monotonic() - started, 1),
        "cores": os.cpu_count(),
    }
    return out


HELPS = {
    "quick": "shorter ramp (20 s base, 60 s at the peak, 20 s tail) and a smaller "
    "capacity model (what the test runs); the pre-roll stays (the planner's 300 s WARM "
    "dwell must pass for the seeded standby to settle to the budget)",
    "seed": "arrivals', launch times', prompts' and batch tags' seed",
    "slo_s": "first-token SLO, seconds (attainment counts first tokens within it)",
    "preroll_s": "seconds at the first load before the ramp (not measured, not paid)",
    "batch_share": "share of requests tagged batch (shed by the ladder's last step); the "
    "rest are interactive",
    "budget_share": "the pool's budget = this x the oracle's peak ACTIVE replicas x "
    "--active-price ($/h); under 1 it binds at the peak",
    "active_price": "$ per replica-hour of a replica holding a GPU (ACTIVE, IDLE, WAKING, "
    "LOADING, STOPPING)",
    "warm_price": "a WARM (asleep) replica-hour's price, as a share of --active-price",
    "standby_rps": "Tectonic's ScalingPolicy.standby_rps: the burst its WARM plans for",
    "max_replicas": "Tectonic's max_active (and twice it: the pool's slots)",
    "capacity_requests": "requests per steady-state run of the capacity model",
    "quiet": "print only the final JSON line (no progress, no per-run lines)",
}


EPILOG = (
    "Prints one JSON line per run (budget, no_budget) and the headline last: "
    "max_spend_over_budget (goal <= 1.0), interactive_attainment (goal >= 0.99), "
    "batch_shed_share, goals, met, settings. Progress on stderr. Exit codes: 0 done, "
    "1 failed, 2 bad options, 130 interrupted. No etcd, no processes. See "
    "bench/results/cost.md."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    d = Options()
    for f in fields(Options):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(d, f.name)
        text = HELPS[f.name].replace("%", "%%")
        if isinstance(default, bool):
            p.add_argument(flag, action="store_true", help=text)
        else:
            p.add_argument(
                flag, type=type(default), default=default, help=f"{text} (default {default})"
            )


def run(args: argparse.Namespace) -> int:
    o = Options(**{f.name: getattr(args, f.name) for f in fields(Options)})
    if o.quick:
        quick = {
            "capacity_requests": min(o.capacity_requests, 20_000),
        }
        o = Options(**{**asdict(o), **quick})
    if not 0.0 <= o.batch_share <= 1.0 or o.budget_share <= 0 or o.active_price <= 0:
        print(
            "error: --batch-share in [0, 1], --budget-share and --active-price > 0", file=sys.stderr
        )
        return 2
    try:  # no etcd: like the autoscale bench
        with terminate_as_interrupt():
            result = run_bench(o, Reporter(o.quiet))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (BenchError, RuntimeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0
