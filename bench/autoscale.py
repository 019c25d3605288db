"""``python -m bench autoscale``: the reference ramp and a hit-rate collapse against six
scaling policies, on a model of the simulator's engine checked against real simulators.

Scenarios (``--quick``: shorter phases, the same rates):

- **ramp** (the reference incident): 12 requests/s for 60 s, up to 240 in 90 s while
  the hit rate goes 0.65 -> 0.83, 7 minutes at the peak, back down in 90 s, 60 s more;
- **hit_collapse**: a flat ``--collapse-rps`` (120) for 120 s at hit rate 0.8, which
  falls to 0.2 within 10 s and stays there 470 s.

Policies, each its own decision code on the same arrivals (``bench/autoscale_policies.py``):
``hpa_cpu``, ``keda_queue``, ``dynamo`` (each of its predictors that installs),
``tectonic_reactive`` (forecast off), ``tectonic`` and ``oracle``. Every run starts
``--preroll-s`` before the scenario at its first load with the oracle's size there
(and Tectonic's WARM), so that each policy has settled; only [0, end) is measured.

The model (``bench/autoscale_sim.py``): the simulator's engine model
(``regions/simulator/service_model.py``) in discrete events, replicas COLD -> LOADING
(60-180 s) -> WARM -> WAKING (5 s, ``ScalingPolicy.activation_s``'s default: vLLM sleep
mode's wake p95) -> ACTIVE; no time compression (simulated seconds of the scenario).
``model_error`` comes from ``bench/autoscale_check.py``: the model against real
simulator processes on a small ramp in the same run.

Figures per policy: ``p99_over_steady`` (first-token p99 over the run / that of the same
arrivals on a pool held at the oracle's peak size throughout), ``slo_attainment``
(first token within ``--slo-s``), ``replica_s`` (replica-seconds held in any state but
COLD), ``cost_over_oracle`` (ACTIVE, IDLE, WAKING, LOADING at 1, WARM at ``--warm-price``;
``cost_over_oracle_gpu_held``: WARM at 1, a sleeping pod that keeps its GPU, as on
Kubernetes). One JSON line per scenario and policy, then the headline; progress on
stderr. Exit codes: 0 done, 1 failed, 130 interrupted (no etcd needed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import aiohttp

from bench._common import BenchError, Reporter, terminate_as_interrupt
from bench.autoscale_check import CheckOptions, check
from bench.autoscale_dynamo import DEFAULT, INTERVAL_S, PREDICTORS, Predictions, predict, series
from bench.autoscale_figures import goals_block as goals_of
from bench.autoscale_figures import relative, run_figures, timeline
from bench.autoscale_policies import (
    Dynamo,
    Hpa,
    HpaBehavior,
    Oracle,
    Tectonic,
    capacity_curve,
    needed,
)
from bench.autoscale_sim import (
    ACTIVE,
    Controller,
    EngineSpec,
    Lifecycle,
    Prices,
    Scenario,
    Sim,
    launch_times,
    make_arrivals,
)
from controlplane.core.scaler import Capacity, planned_standby, warm_wanted
from controlplane.core.spend import Budget
from controlplane.kernel.pool.scale import ScalingPolicy
from regions.pool.states import DwellPolicy

ENGINE = EngineSpec()
LIFE = Lifecycle()


@dataclass(frozen=True)
class Options:
    quick: bool = False
    seed: int = 1
    slo_s: float = 5.0
    preroll_s: float = 600.0
    warm_price: float = 0.6
    factor_of_safety: float = 1.0
    burst_warm: int = ScalingPolicy().burst_warm
    standby_rps: float = 240.0
    max_replicas: int = 64
    collapse_rps: float = 120.0
    capacity_requests: int = 100_000
    dynamo_predictors: str = ",".join(PREDICTORS)
    check_s: float = 40.0
    check_replicas: int = 2
    no_check: bool = False
    quiet: bool = False


def scenarios(o: Options) -> dict[str, Scenario]:
    """The reference ramp and the hit-rate collapse (``quick``: shorter phases)."""
    base, peak, tail = (20.0, 60.0, 20.0) if o.quick else (60.0, 420.0, 60.0)
    up = base + 90.0
    down = up + peak + 90.0
    ramp = (
        (0.0, 12.0, 0.65), (base, 12.0, 0.65), (up, 240.0, 0.83),
        (up + peak, 240.0, 0.83), (down, 12.0, 0.65), (down + tail, 12.0, 0.65),
    )  # fmt: skip
    before, after = (30.0, 120.0) if o.quick else (120.0, 470.0)
    r = o.collapse_rps
    fall = before + 10.0
    collapse = ((0.0, r, 0.8), (before, r, 0.8), (fall, r, 0.2), (fall + after, r, 0.2))
    return {
        "policies": Scenario("ramp", ramp, down + tail),
        "policies_hit_collapse": Scenario("hit_collapse", collapse, fall + after),
    }


# ---- one scenario ------------------------------------------------------------------------


@dataclass
class Setup:
    o: Options
    scenario: Scenario
    per_replica: Callable[[float], float]
    seed: int

    def __post_init__(self) -> None:
        self.start = -self.o.preroll_s
        self.arrivals = make_arrivals(self.scenario, ENGINE, start_s=self.start, seed=self.seed)
        self.launches = launch_times(LIFE, 8 * self.o.max_replicas, self.seed)
        seconds = range(int(self.start), math.ceil(self.scenario.end_s))
        self.need = [needed(self.scenario, self.per_replica, t) for t in seconds]

    def sim(self) -> Sim:
        return Sim(
            ENGINE, LIFE, self.arrivals, start_s=self.start, end_s=self.scenario.end_s,
            launches=self.launches, hit_rate=self.scenario.hit,
        )  # fmt: skip

    def run(self, seed_pool: Callable[[Sim], list[Controller]]) -> Sim:
        sim = self.sim()
        sim.run(seed_pool(sim))
        return sim


def _at(n: int) -> Callable[[Sim], list[Controller]]:
    """``n`` ACTIVE replicas at the start, and no policy (the steady pool)."""

    def place(sim: Sim) -> list[Controller]:
        for _ in range(n):
            sim.place(ACTIVE)
        return []

    return place


def tectonic(
    s: Setup, forecast: bool, budget: Budget | None = None
) -> Callable[[Sim], list[Controller]]:
    """Tectonic's scaler and planner (``budget``: the pool's, ``bench/cost.py``)."""
    o = s.o
    policy = ScalingPolicy(
        forecast=forecast,
        burst_warm=o.burst_warm,
        standby_rps=o.standby_rps,
        max_active=o.max_replicas,
    )
    fos = o.factor_of_safety
    why = f"engine model: first-token p99 at the SLO / {fos:g}"
    ctl = Tectonic(
        policy, Capacity(lambda h: s.per_replica(h) / fos, why), slo_s=o.slo_s,
        dwell=DwellPolicy(), slots=2 * o.max_replicas, budget=budget,
    )  # fmt: skip

    def seed(sim: Sim) -> list[Controller]:
        ctl.seed(sim, s.need[0], first_warm(s, policy))
        return [ctl]

    return seed


def first_warm(s: Setup, policy: ScalingPolicy) -> int:
    """The WARM Tectonic's first decision keeps on a flat start, already asleep (the
    scaler's own rule, at the start's hit rate, with nothing forecast beyond it)."""
    per = s.per_replica(s.scenario.hit(s.start)) / s.o.factor_of_safety
    return warm_wanted(policy, 0, planned_standby(policy, s.need[0], per, per))


def kube(s: Setup, metric: str, target: float) -> Callable[[Sim], list[Controller]]:
    def seed(sim: Sim) -> list[Controller]:
        _at(s.need[0])(sim)
        return [Hpa(HpaBehavior(max_replicas=s.o.max_replicas), metric, target)]

    return seed


def dynamo(s: Setup, predicted: dict[float, float]) -> Callable[[Sim], list[Controller]]:
    def seed(sim: Sim) -> list[Controller]:
        _at(s.need[0])(sim)
        return [Dynamo(predicted, s.per_replica, max_replicas=s.o.max_replicas)]

    return seed


def oracle(s: Setup) -> Callable[[Sim], list[Controller]]:
    ctl = Oracle(s.need, int(s.start), s.launches, LIFE.wake_s, LIFE.wake_rate)

    def seed(sim: Sim) -> list[Controller]:
        ctl.seed(sim)
        return [ctl]

    return seed


def run_scenario(
    key: str, s: Setup, predictions: Predictions, say: Reporter
) -> tuple[dict[str, dict[str, object]], float]:
    """Every policy on one scenario: headline entries per policy, and the steady p99."""
    o = s.o
    prices, held = Prices(warm=o.warm_price), Prices(warm=1.0)
    steady = s.run(_at(max(s.need)))
    steady_p99 = float(run_figures(steady, o.slo_s, prices, held)["p99_s"])  # type: ignore[arg-type]
    plans: dict[str, Callable[[Sim], list[Controller]]] = {
        "oracle": oracle(s),
        "hpa_cpu": kube(s, "utilization", 0.7),
        "keda_queue": kube(s, "queue", 5.0),
        "tectonic_reactive": tectonic(s, forecast=False),
        "tectonic": tectonic(s, forecast=True),
    }
    for name, predicted in predictions.by_predictor.items():
        plans[f"dynamo[{name}]"] = dynamo(s, predicted)
    raw: dict[str, dict[str, object]] = {}
    for name, seed_pool in plans.items():
        started = time.process_time()
        sim = s.run(seed_pool)
        raw[name] = run_figures(sim, o.slo_s, prices, held)
        say.progress(
            f"{s.scenario.name}: {name}: p99 {raw[name]['p99_s']} s, attainment "
            f"{raw[name]['slo_attainment']}, {raw[name]['replica_s']} replica-s "
            f"({time.process_time() - started:.1f} s)"
        )
        say.line(
            {"scenario": s.scenario.name, "policy": name, **raw[name], "timeline": timeline(sim)}
        )
    rel = relative(raw, steady_p99)
    oracle_cost = float(raw["oracle"]["cost"])  # type: ignore[arg-type]
    rel["oracle"]["causal_floor_cost_over_oracle"] = causal_floor(s, oracle_cost)
    rel["oracle"]["causal_floor_drawn_launches"] = causal_floor(s, oracle_cost, drawn=True)
    return _with_dynamo(rel, predictions), steady_p99


def causal_floor(s: Setup, oracle_cost: float, *, drawn: bool = False) -> float:
    """The least a policy without foresight pays to hold the burst planned for, over the
    oracle's cost. Each second it needs the oracle's ACTIVE replicas and, beyond what
    they bear, WARM for ``standby_rps`` at the pool's usual hit rate (the scenario's,
    averaged over ``standby_hit_window_s`` as the scaler does), at the WARM price. It
    starts with the pre-roll's replicas (unpaid, as every policy does); a replica the
    plan needs beyond the most it has held is launched once the need shows (it cannot
    launch ahead of what it does not foresee) and loads for at least ``launch_min_s`` at
    the LOADING price, not the WARM one, or was kept WARM since the start, whichever
    costs less. Wakes, IDLE replicas and the rounding of a forecast's band are not
    counted, so no policy that holds the plan pays less.

    (The oracle's own launches are not counted: a policy with the standby wakes it
    instead. Until 2026-12 the floor was the oracle's cost plus the standby, which
    counted them, and a policy that held the plan could cost less than it.)

    ``drawn``: each launch loads for as long as the run draws for it (the k-th launch
    of a run takes ``s.launches[k]``, 60-180 s) instead of the least, as for a policy
    that launches nothing but these: the floor of what the scenario's launches cost
    where the plain one is the floor of what any launch can cost."""
    o, prices = s.o, Prices(warm=s.o.warm_price)
    keep = math.exp(-1.0 / ScalingPolicy().standby_hit_window_s)
    usual = s.scenario.hit(s.start)
    end = math.ceil(s.scenario.end_s)
    cost, held = 0.0, None  # held: the most replicas the plan has needed so far
    launched = 0
    for i, t in enumerate(range(int(s.start), end)):
        usual = keep * usual + (1 - keep) * s.scenario.hit(t)
        beyond = o.standby_rps - s.need[i] * s.per_replica(s.scenario.hit(t))
        warm = max(0, math.ceil(beyond / s.per_replica(usual) - 1e-9))
        fleet = s.need[i] + warm
        if held is not None and t >= 0:
            for _ in range(fleet - held):  # none when the fleet did not grow past it
                load_s = s.launches[launched % len(s.launches)] if drawn else LIFE.launch_min_s
                launched += 1
                launch = (prices.loading - prices.warm) * min(load_s, end - t)
                cost += min(launch, prices.warm * t)
        held = fleet if held is None else max(held, fleet)
        if t >= 0:
            cost += s.need[i] + prices.warm * warm
    return round(cost / oracle_cost, 4)


def _with_dynamo(
    rel: dict[str, dict[str, object]], predictions: Predictions
) -> dict[str, dict[str, object]]:
    """``dynamo``: its default predictor's figures (else the first that ran), each
    predictor's under ``by_predictor``, and those that did not run with why."""
    ran = {k[len("dynamo[") : -1]: rel.pop(k) for k in list(rel) if k.startswith("dynamo[")}
    out = {k: v for k, v in rel.items() if k != "oracle"}
    if not ran:
        out["dynamo"] = {
            "skipped": predictions.skipped or f"no predictor ran: {predictions.failed}"
        }
    else:
        main = DEFAULT if DEFAULT in ran else next(iter(ran))
        out["dynamo"] = {**ran[main], "predictor": main, "by_predictor": ran}
        if predictions.failed:
            out["dynamo"]["not_run"] = predictions.failed
    out["oracle"] = rel["oracle"]
    return out


# ---- the run ------------------------------------------------------------------------------


def settings(o: Options, points: dict[float, float], sc: dict[str, Scenario]) -> dict[str, object]:
    policy = ScalingPolicy(
        burst_warm=o.burst_warm, standby_rps=o.standby_rps, max_active=o.max_replicas
    )
    return {
        "slo_s": o.slo_s,
        "time_compression": 1.0,
        "time": "event-driven, in the scenario's own seconds (no compression); the model "
        "check runs real simulators in wall-clock time at the same engine settings",
        "launch_s": [LIFE.launch_min_s, LIFE.launch_max_s],
        "wake_s": LIFE.wake_s,
        "wake_source": "ScalingPolicy.activation_s's default: WARM -> ACTIVE p95, vLLM sleep "
        "mode's wake (docs/configuration.md)",
        "wakes_per_s": LIFE.wake_rate,
        "prices": {
            "ACTIVE": 1.0,
            "IDLE": 1.0,
            "WAKING": 1.0,
            "LOADING": 1.0,
            "WARM": o.warm_price,
            "COLD": 0.0,
        },
        "prices_gpu_held": {"WARM": 1.0, "note": "a sleeping pod keeps its GPU (Kubernetes)"},
        "engine": asdict(ENGINE),
        "capacity_rps_per_replica": {f"{h:g}": round(v, 3) for h, v in points.items()},
        "capacity": "the rate at which one replica's steady-state first-token p99 is the SLO "
        "(bench/capacity_truth.py's model of the engine, by hit rate); Tectonic's Capacity is "
        f"it / {o.factor_of_safety:g}, Dynamo's engine capacity and the oracle's it",
        "tectonic": policy.model_dump(
            include={
                "horizon_s",
                "burst_warm",
                "standby_rps",
                "stable_window_s",
                "guard_queue_per_replica",
                "max_active",
            }
        ),
        "dwell": DwellPolicy().model_dump(),
        "hpa": asdict(HpaBehavior(max_replicas=o.max_replicas)),
        "keda": {
            "metric": "sum of vllm:num_requests_waiting over ready pods",
            "threshold": 5,
            "polling_s": 15,
            "cooldown_s": 360,
            "cooldown_note": "KEDA's cooldown only "
            "applies to scaling to 0; min 1 here, so the HPA's 300 s window governs",
        },
        "dynamo": {
            "throughput_interval_s": INTERVAL_S,
            "max_delta": 8,
            "min_endpoint": 1,
            "load_scaling": False,
            "max_gpu_budget": o.max_replicas,
        },
        "scenarios": {v.name: {"knots": v.knots, "end_s": v.end_s} for v in sc.values()},
        "preroll_s": o.preroll_s,
    }


def run_bench(o: Options, say: Reporter) -> dict[str, object]:
    started = time.monotonic()
    say.progress("capacity at the SLO per hit rate (steady-state model of the engine)")
    per_replica, points = capacity_curve(ENGINE, o.slo_s, requests=o.capacity_requests, seed=o.seed)
    sc = scenarios(o)
    wanted = tuple(p for p in o.dynamo_predictors.split(",") if p)
    out: dict[str, object] = {"bench": "autoscale"}
    dyn: dict[str, object] = {}
    for i, (key, scenario) in enumerate(sc.items()):
        s = Setup(o, scenario, per_replica, seed=o.seed + 100 * i)
        obs = series(scenario, s.arrivals, start_s=s.start, seed=s.seed, interval_s=INTERVAL_S)
        say.progress(f"{scenario.name}: Dynamo's predictors ({', '.join(wanted) or 'none'})")
        predictions = predict(obs, wanted)
        dyn[scenario.name] = {
            "skipped": predictions.skipped,
            "failed": predictions.failed,
            "seconds": predictions.seconds,
            "version": predictions.version,
            "ticks_s": obs.ticks,
            "observed": obs.counts,
            "predicted": {
                k: [round(v[t], 1) if t in v else None for t in obs.ticks]
                for k, v in predictions.by_predictor.items()
            },
        }
        out[key], steady = run_scenario(key, s, predictions, say)
        out[f"steady_p99_s_{scenario.name}"] = round(steady, 4)
    model: dict[str, object] | None = None
    if not o.no_check:
        c = CheckOptions(replicas=o.check_replicas, seconds=o.check_s, seed=o.seed + 5)
        model = check(ENGINE, c, say)
        say.line({"model_check": model})
    error = None if model is None else float(model["model_error"])  # type: ignore[arg-type]
    out["model_error"] = error
    out["model_check"] = model
    out["dynamo_predictors"] = dyn
    out.update(goals_of(out["policies"], out["policies_hit_collapse"], error))  # type: ignore[arg-type]
    out["settings"] = settings(o, points, sc)
    out["wall_s"] = round(time.monotonic() - started, 1)
    out["cores"] = os.cpu_count()
    out["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Options()
    helps = {
        "quick": "shorter scenarios and model check (what the test runs)",
        "seed": "arrivals', launch times' and prompts' seed",
        "slo_s": "first-token SLO, seconds",
        "preroll_s": "seconds at the first load before the scenario (not measured)",
        "warm_price": "a WARM replica-second's cost, as a share of an ACTIVE one",
        "factor_of_safety": "Tectonic's capacity = the capacity at the SLO / this",
        "burst_warm": "Tectonic's ScalingPolicy.burst_warm",
        "standby_rps": "Tectonic's ScalingPolicy.standby_rps: the burst planned for (the "
        "incident's peak; 0: none)",
        "max_replicas": "the most replicas any policy may have",
        "collapse_rps": "the hit-rate collapse's flat load, requests/s",
        "capacity_requests": "requests per steady-state run of the capacity model",
        "dynamo_predictors": "Dynamo's predictors to run, comma-separated",
        "check_s": "seconds of the model check's ramp on real simulators",
        "check_replicas": "simulator processes in the model check",
        "no_check": "skip the model check (no model_error)",
        "quiet": "print only the final JSON line",
    }
    for f in fields(Options):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(d, f.name)
        if isinstance(default, bool):
            p.add_argument(flag, action="store_true", help=helps[f.name])
        else:
            kind = type(default)
            p.add_argument(
                flag, type=kind, default=default, help=f"{helps[f.name]} (default {default})"
            )


def run(args: argparse.Namespace) -> int:
    o = Options(**{f.name: getattr(args, f.name) for f in fields(Options)})
    if o.quick:
        quick = {"preroll_s": min(o.preroll_s, 120.0), "check_s": min(o.check_s, 15.0)}
        o = Options(**{**asdict(o), **quick, "capacity_requests": min(o.capacity_requests, 20_000)})
    try:  # like bench._common.main, without its etcd check: this bench needs none
        with terminate_as_interrupt():
            result = run_bench(o, Reporter(o.quiet))
    except KeyboardInterrupt:
        print("interrupted; every process was stopped", file=sys.stderr)
        return 130
    except (BenchError, RuntimeError, ValueError, aiohttp.ClientError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0
