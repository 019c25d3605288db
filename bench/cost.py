"""``python -m bench cost``: a pool budget that binds at the ramp's peak, and a failover
that may spend past it for its allowance only.

Two scenarios on the autoscale bench's discrete-event model of the simulator's engine
(``bench/autoscale_sim.py``), each request tagged interactive or batch
(``--batch-share``, seeded), the pool's budget ``--budget-share`` x the ramp oracle's
peak ACTIVE x ``--active-price`` in both:

- **ramp**: the reference ramp (12 -> 240 requests/s in 90 s, hit rate 0.65 -> 0.83,
  7 minutes at 240, back down; ``bench/autoscale.py``'s ``scenarios``), two runs on the
  same arrivals: **budget** (the guardrail and the ladder) and **no budget** (neither,
  for comparison);
- **failover** (``bench/cost_failover.py``): the pool serves ``--failover-own-rps`` at
  the ramp's peak hit rate; 60 s in (20 s with ``--quick``) a source region fails and
  its ``--failover-moved-rps`` is routed here (extra arrivals on the same model, the
  pre-warm verified), to the end of the run. The pool may spend past its budget for
  ``--allowance-s`` (the topology's ``cost.failover_allowance_s``) from the failover's
  start; then the budget binds again and the ladder sheds batch. ``--failover-after-s``
  more are measured after the allowance ends.

Real code in both (``bench/cost_model.py``): Tectonic's scaler
(:func:`controlplane.core.scaler.size_pool`) and the agent's warm-pool planner
(``bench/autoscale_policies.Tectonic``); the leader's view each second before the
scaler: a snapshot of the pool (``pools/<unit>`` from the planner's slots: ACTIVE with
WAKING, IDLE, WARM and of them those in their WARM dwell, launches) and of the failing
source (FAILING_OVER with its plan), on which ``core/scale_tick.moving_loads`` and
``core/scale_tick.pool_budget`` decide what the scaler is handed: the moving load, the
budget (``core/spend.budget_for`` with ``held``), exempt within the allowance, lapsed
after it; and the real degradation ladder
(:func:`controlplane.core.ladder_executor.next_ladder_action` on
``runbooks/degradation.yaml``, once a second after the scaler) fed as
``core/ladder_tick`` feeds it: DEGRADING while the budget holds the record short now
(``budget.short`` > 0) or will when the exemption ends within the ladder's lead
(``ladder_tick.budget_paid``), the load against what the budget pays for. While its
``shed-batch`` step is applied, batch requests are refused at admission (as the
gateway's ``shed_low_priority`` does). The planner is handed the record's
``budget.over`` as the agent hands it (``PoolTarget.over_budget``: WARM beyond the sizes
stops without its WARM dwell while the pool spends past its budget).

Truth (not the scaler's record): each second, the spend is the model's replicas in
each state times the price sheet: ACTIVE, IDLE, WAKING, LOADING and STOPPING hold a GPU
(``--active-price``), WARM is asleep (``--warm-price`` x it).
``max_spend_over_budget`` is the highest spend / budget over every second of both
scenarios outside the failover's allowance window (the ramp has none);
``max_spend_over_budget_in_allowance`` how far the allowance let it go;
``back_within_budget_s`` the seconds from the allowance's end until the spend is within
the budget for good (``failover.back_within_budget_after_cut_s``: from the exemption's
end, ``--wind-down-s`` before it). ``interactive_attainment`` and ``batch_shed_share``
are the ramp's; ``failover_interactive_attainment`` and ``failover_batch_shed_share`` those of the
requests arriving from the failover's start, ``after_allowance_interactive_attainment``
(goal >= 0.99) and ``after_allowance_batch_shed_share`` those arriving once the budget
binds again. The model's clock is not compressed: the
allowance lasts its configured seconds of the model (``--quick`` configures 300 s).
One JSON line per run (budget, no_budget, failover), then the headline; progress on
stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import numpy as np

from bench import autoscale
from bench._common import BenchError, Reporter, terminate_as_interrupt
from bench.autoscale_policies import capacity_curve
from bench.autoscale_sim import ACTIVE, WARM, Controller
from bench.cost_failover import Shape, run_failover
from bench.cost_failover import figures as failover_figures
from bench.cost_failover import settings as failover_settings
from bench.cost_model import (
    GPU_HELD,
    UNIT,
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
from controlplane.kernel.pool.cost import CostPolicy, Prices


@dataclass(frozen=True)
class Goals:
    max_spend_over_budget: float = 1.0  # at most
    interactive_attainment: float = 0.99  # at least
    # the "interactive kept >= 0.99 while batch is shed": once the budget binds
    # again after the allowance (from the failover's start it also counts the scale-up)
    after_allowance_interactive_attainment: float = 0.99  # at least


GOALS = Goals()
AT_MOST = ("max_spend_over_budget",)
QUICK_ALLOWANCE_S = 300.0  # past the longest launch (180 s): the scale-up lands within it
QUICK_AFTER_S = 360.0  # long enough for WARM let go inside its 300 s dwell to stop


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
    failover_own_rps: float = 80.0
    failover_moved_rps: float = 160.0
    allowance_s: float = 1800.0
    wind_down_s: float = 30.0
    failover_after_s: float = 600.0
    quiet: bool = False


@dataclass(frozen=True)
class Bench:
    """What both scenarios share: the capacity at the SLO, the prices and the budget."""

    o: Options
    per_replica: Callable[[float], float]
    prices: Prices
    budget: float
    peak: int  # the ramp oracle's peak ACTIVE

    def cost(self) -> CostPolicy:
        """The topology's ``cost:`` section: the pool's budget and the failover allowance."""
        return CostPolicy(
            prices=self.prices,
            pool_budgets={UNIT: self.budget},
            failover_allowance_s=self.o.allowance_s,
            failover_wind_down_s=self.o.wind_down_s,
        )


def _options(o: Options) -> autoscale.Options:
    return autoscale.Options(
        quick=o.quick, seed=o.seed, slo_s=o.slo_s, preroll_s=o.preroll_s,
        warm_price=o.warm_price, standby_rps=o.standby_rps, max_replicas=o.max_replicas,
        capacity_requests=o.capacity_requests, no_check=True, quiet=o.quiet,
    )  # fmt: skip


def _ramp(o: Options, per_replica: Callable[[float], float]) -> autoscale.Setup:
    ao = _options(o)
    return autoscale.Setup(ao, autoscale.scenarios(ao)["policies"], per_replica, seed=o.seed)


# ---- the ramp -----------------------------------------------------------------------------


def ramp_run(
    s: autoscale.Setup, batch: np.ndarray, b: Bench, *, with_budget: bool
) -> dict[str, object]:
    """Tectonic on the ramp, with the pool's budget and the ladder, or with neither."""
    sim = shedding_sim(s, batch)
    scaler = failover_target(s)
    seed_pool(s, scaler, sim)
    controllers: list[Controller] = [scaler]
    driver = None
    if with_budget:  # no failover on the ramp: the leader hands no moving load
        driver = LadderDriver(scaler, load_ladder())
        controllers = [Leader(scaler, b.cost(), None), scaler, driver]
    sim.run(controllers)
    return ramp_figures(sim, b, b.budget if with_budget else None, scaler, driver)


def ramp_figures(
    sim: SheddingSim,
    b: Bench,
    budget: float | None,
    scaler: FailoverTarget,
    driver: LadderDriver | None,
) -> dict[str, object]:
    m = sim.measured()
    ttft, batch, shed = sim.ttft[m], sim.batch[m], sim.shed[m]
    inter = ~batch
    served_batch = batch & ~shed
    t, spend, by = spend_per_second(sim, b.prices.active, b.prices.warm)
    worst = int(np.argmax(spend))
    slo = b.o.slo_s
    out: dict[str, object] = {
        "requests": int(m.size),
        "interactive": int(inter.sum()),
        "batch": int(batch.sum()),
        "interactive_attainment": r4(np.mean(ttft[inter] <= slo)),
        "interactive_p99_s": r4(np.percentile(ttft[inter], 99)),
        "batch_shed_share": r4(shed[batch].sum() / max(1, batch.sum())),
        "batch_attainment_served": r4(np.mean(ttft[served_batch] <= slo))
        if served_batch.any()
        else None,
        "max_spend_per_hour": r4(spend.max(), 2),
        "mean_spend_per_hour": r4(spend.mean(), 2),
        "dollars": r4(spend.sum() / 3600.0, 2),
        "max_spend_at_s": float(t[worst]),
        "states_at_max_spend": {st: int(v[worst]) for st, v in by.items() if v[worst]},
        "peak_active": int(by[ACTIVE].max()),
    }
    if budget is not None:
        over = spend / budget
        out["budget_per_hour"] = r4(budget, 2)
        out["max_spend_over_budget"] = r4(over.max())
        out["seconds_over_budget"] = int((over > 1.0 + 1e-9).sum())
        out["scaler_target_changes"] = len(scaler.targets)
    if driver is not None:
        out["short_s"] = driver.short_s()
        out["ladder_changes"] = [[c[0], c[1], c[2]] for c in driver.changes]
        on = driver.shed_on()
        out["shed_batch_applied_at_s"] = on[0] if on else None
    return out


# ---- the failover -------------------------------------------------------------------------


def shape_of(o: Options, s: autoscale.Setup) -> Shape:
    """The failover at the ramp's peak hit rate, 60 s into the run (20 s with --quick)."""
    return Shape(
        own_rps=o.failover_own_rps,
        moved_rps=o.failover_moved_rps,
        hit_rate=max(k[2] for k in s.scenario.knots),
        lead_s=20.0 if o.quick else 60.0,
        allowance_s=o.allowance_s,
        after_s=o.failover_after_s,
    )


def failover(b: Bench, shape: Shape) -> dict[str, object]:
    """The failover scenario on its own arrivals and batch tags."""
    o = b.o
    fs = autoscale.Setup(_options(o), shape.scenario(), b.per_replica, seed=o.seed + 101)
    batch = np.random.default_rng(o.seed + 37).random(len(fs.arrivals)) < o.batch_share
    cost = b.cost()
    run = run_failover(fs, shape, batch, cost)
    return failover_figures(run, shape, cost, b.budget, o.slo_s)


# ---- the bench ----------------------------------------------------------------------------


def settings(b: Bench, s: autoscale.Setup, shape: Shape) -> dict[str, object]:
    o, prices, budget, peak = b.o, b.prices, b.budget, b.peak
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
        "budget_capacity_rps_at_peak": round(buys * b.per_replica(top_hit), 1),
        "interactive_peak_rps": round((1.0 - o.batch_share) * top_rps, 1),
        "budget_note": "the ACTIVE the budget buys at the peak's hit rate against the "
        "interactive load there: under it, no controller can keep interactive's SLO",
        "scaler": "controlplane.core.scaler.size_pool, forecast on, standby_rps "
        f"{o.standby_rps:g}, the agent's warm-pool planner (bench/autoscale_policies.Tectonic; "
        "bench/cost_model.FailoverTarget passes the failover's moving load)",
        "leader": "each second before the scaler, controlplane.core.scale_tick.pool_budget "
        "(and moving_loads) on a snapshot of the pool as the agent publishes pools/<unit> "
        "(bench/cost_model.Leader): budget_for(CostPolicy(pool_budgets)) with held",
        "ladder": "the real executor (controlplane.core.ladder_executor.next_ladder_action) on "
        "runbooks/degradation.yaml, once a second after the scaler, on the model's clock; "
        "mode and signals as core/ladder_tick builds them: DEGRADING while the scaler's "
        "record has budget.short > 0, or budget.short_at_end > 0 with the exemption ending "
        "within ladder_tick.ladder_lead_s (40 s), else RECOVERING (a NORMAL region; the "
        "failover's plan is not headroom_short); signals: load_rps against per_replica_rps "
        "x the ACTIVE the budget pays for (ladder_tick.budget_paid), else the record's "
        "ACTIVE (headroom, capacity utilisation); TTFT and error rates are not fed (the "
        "ladder file's 0.5 s TTFT baseline is a real deployment's, not this model's), so "
        "only the budget moves it",
        "shedding": "while shed-batch is applied, batch requests are refused at admission "
        "(the gateway's shed_low_priority, modelled: no gateway runs; the flag takes effect "
        "on the next arrival, no watch delay)",
        "failover_allowance": "the ramp has no failover: no second is excluded; the "
        "failover scenario's allowance window is excluded from max_spend_over_budget",
        "failover": failover_settings(shape, b.cost()),
        "time": "event-driven, in the scenarios' own seconds (no compression)",
    }


def _num(x: object) -> float:
    assert isinstance(x, int | float), x
    return float(x)


def _met(value: object, goal: float, at_most: bool) -> bool:
    """A goal is met by a number on its side of it (None, a figure not measured: not)."""
    if not isinstance(value, int | float):
        return False
    return value <= goal if at_most else value >= goal


def headline(
    b: Bench, runs: dict[str, dict[str, object]], fo: dict[str, object]
) -> dict[str, object]:
    with_b, without = runs["budget"], runs["no_budget"]
    ramp_over, fo_over = _num(with_b["max_spend_over_budget"]), _num(fo["max_spend_over_budget"])
    phases = fo["phases"]
    assert isinstance(phases, dict)
    after = phases["after"]
    figures: dict[str, object] = {
        # outside the failover's allowance (the ramp has none): the budget's own goal
        "max_spend_over_budget": max(ramp_over, fo_over),
        "interactive_attainment": with_b["interactive_attainment"],
        "batch_shed_share": with_b["batch_shed_share"],
        "max_spend_over_budget_in_allowance": fo["max_spend_over_budget_in_allowance"],
        "allowance_s": fo["allowance_s"],
        "wind_down_s": fo["wind_down_s"],
        "back_within_budget_s": fo["back_within_budget_s"],
        "failover_interactive_attainment": fo["interactive_attainment"],
        "failover_batch_shed_share": fo["batch_shed_share"],
        "after_allowance_interactive_attainment": after["interactive_attainment"],
        "after_allowance_batch_shed_share": after["batch_shed_share"],
    }
    met = {k: _met(figures[k], g, k in AT_MOST) for k, g in asdict(GOALS).items()}
    no_budget_over = r4(_num(without["max_spend_per_hour"]) / b.budget)
    return {
        "bench": "cost",
        **figures,
        "max_spend_over_budget_by_scenario": {"ramp": ramp_over, "failover": fo_over},
        "budget_per_hour": b.budget,
        "budget": with_b,
        "no_budget": {**without, "max_spend_over_budget": no_budget_over},
        "failover": fo,
        "goals": asdict(GOALS),
        "met": met,
    }


def run_bench(o: Options, say: Reporter) -> dict[str, object]:
    started = time.monotonic()
    say.progress("capacity at the SLO per hit rate (steady-state model of the engine)")
    per_replica, _ = capacity_curve(
        autoscale.ENGINE, o.slo_s, requests=o.capacity_requests, seed=o.seed
    )
    s = _ramp(o, per_replica)
    prices = Prices(active=o.active_price, warm=o.warm_price * o.active_price)
    peak = max(s.need)
    b = Bench(o, per_replica, prices, round(o.budget_share * peak * prices.active, 2), peak)
    rng = np.random.default_rng(o.seed + 31)
    batch = rng.random(len(s.arrivals)) < o.batch_share
    say.progress(
        f"budget ${b.budget:g}/h ({o.budget_share:g} x {peak} ACTIVE x ${prices.active:g})"
    )
    runs: dict[str, dict[str, object]] = {}
    for name, with_budget in (("budget", True), ("no_budget", False)):
        cpu = time.process_time()
        runs[name] = r = ramp_run(s, batch, b, with_budget=with_budget)
        say.progress(
            f"ramp, {name}: max spend ${r['max_spend_per_hour']}/h, interactive attainment "
            f"{r['interactive_attainment']}, batch shed {r['batch_shed_share']} "
            f"({time.process_time() - cpu:.1f} s)"
        )
        say.line({"run": name, **r})
    cpu = time.process_time()
    shape = shape_of(o, s)
    fo = failover(b, shape)
    say.progress(
        f"failover: spend/budget {fo['max_spend_over_budget_in_allowance']} within the "
        f"{shape.allowance_s:g} s allowance, {fo['max_spend_over_budget']} outside, back "
        f"within {fo['back_within_budget_s']} s after it; interactive attainment "
        f"{fo['interactive_attainment']}, batch shed {fo['batch_shed_share']} "
        f"({time.process_time() - cpu:.1f} s)"
    )
    say.line({"run": "failover", **fo})
    return {
        **headline(b, runs, fo),
        "settings": settings(b, s, shape),
        "wall_s": round(time.monotonic() - started, 1),
        "cores": os.cpu_count(),
    }


HELPS = {
    "quick": "shorter ramp (20 s base, 60 s at the peak, 20 s tail), a smaller capacity "
    f"model, and a failover with a {QUICK_ALLOWANCE_S:g} s allowance and {QUICK_AFTER_S:g} s "
    "after it (what the test runs); the pre-roll stays (the planner's 300 s WARM dwell "
    "must pass for the seeded standby to settle to the budget)",
    "seed": "arrivals', launch times', prompts' and batch tags' seed",
    "slo_s": "first-token SLO, seconds (attainment counts first tokens within it)",
    "preroll_s": "seconds at the first load before each scenario (not measured, not paid)",
    "batch_share": "share of requests tagged batch (shed by the ladder's last step); the "
    "rest are interactive",
    "budget_share": "the pool's budget = this x the ramp oracle's peak ACTIVE replicas x "
    "--active-price ($/h); under 1 it binds at the peak (and after a failover's allowance)",
    "active_price": "$ per replica-hour of a replica holding a GPU (ACTIVE, IDLE, WAKING, "
    "LOADING, STOPPING)",
    "warm_price": "a WARM (asleep) replica-hour's price, as a share of --active-price",
    "standby_rps": "Tectonic's ScalingPolicy.standby_rps: the burst its WARM plans for",
    "max_replicas": "Tectonic's max_active (and twice it: the pool's slots)",
    "capacity_requests": "requests per steady-state run of the capacity model",
    "failover_own_rps": "failover scenario: the pool's own load, requests/s",
    "failover_moved_rps": "failover scenario: the failed source's load moved onto the pool, "
    "requests/s",
    "allowance_s": "the topology's cost.failover_allowance_s: how long after the failover's "
    "start the pool may spend past its budget (the model's seconds)",
    "wind_down_s": "the topology's cost.failover_wind_down_s: the allowance's last seconds, "
    "in which the budget binds again already so that the replicas it cuts are stopped by "
    "the allowance's end (0: the budget binds at the end)",
    "failover_after_s": "failover scenario: seconds measured after the allowance ends",
    "quiet": "print only the final JSON line (no progress, no per-run lines)",
}


EPILOG = (
    "Prints one JSON line per run (budget, no_budget, failover) and the headline last: "
    "max_spend_over_budget (goal <= 1.0; outside the failover's allowance), "
    "interactive_attainment (the ramp's; goal >= 0.99), batch_shed_share, "
    "max_spend_over_budget_in_allowance, allowance_s, wind_down_s, back_within_budget_s, "
    "failover_interactive_attainment, failover_batch_shed_share, "
    "after_allowance_interactive_attainment (goal >= 0.99), after_allowance_batch_shed_share, "
    "goals, met, settings. Progress on stderr. Exit codes: 0 done, 1 failed, 2 bad options, 130 "
    "interrupted. No etcd, no processes. See bench/results/cost.md."
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


def _quick(o: Options) -> Options:
    quick = {
        "capacity_requests": min(o.capacity_requests, 20_000),
        "allowance_s": min(o.allowance_s, QUICK_ALLOWANCE_S),
        "failover_after_s": min(o.failover_after_s, QUICK_AFTER_S),
    }
    return Options(**{**asdict(o), **quick})


def _bad(o: Options) -> str:
    if not 0.0 <= o.batch_share <= 1.0 or o.budget_share <= 0 or o.active_price <= 0:
        return "--batch-share in [0, 1], --budget-share and --active-price > 0"
    if min(o.failover_own_rps, o.failover_moved_rps, o.allowance_s, o.wind_down_s) < 0:
        return "--failover-own-rps, --failover-moved-rps, --allowance-s and --wind-down-s >= 0"
    if o.failover_after_s <= 0:
        return "--failover-after-s > 0"
    return ""


def run(args: argparse.Namespace) -> int:
    o = Options(**{f.name: getattr(args, f.name) for f in fields(Options)})
    if o.quick:
        o = _quick(o)
    if bad := _bad(o):
        print(f"error: {bad}", file=sys.stderr)
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
