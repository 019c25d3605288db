"""``python -m bench capacity``: does the capacity probe find what a replica sustains?

For each configuration (``--configs``, named presets run one after the other), one
simulator whose latency model fixes the truth: at most ``slots`` requests run, the
rest wait FIFO; a request's prefill takes its uncached prompt tokens / the prefill
rate, then each further output token 1 / the decode rate
(``regions/simulator/engine.py``). The probe (``chaos.capacity.probe``) runs against
it as against any replica: a cold probe, a warm probe (a share of the prompts start
with one of a few shared prefixes), T_recover, and with ``--pair`` the scaling
efficiency of two replicas.

**The truth** is what the replica sustains: the simulator's engine model in steady
state (``bench/capacity_truth.py``: a long run of Poisson arrivals of the workload's
request mix, its start discarded), computed in this process before the simulator
starts. True ultimate: the rate where the steady-state first-token p99 equals the SLO;
true knee: where it passes ``knee_factor`` x its value at the probe's lowest rate; true
allowed: ultimate / factor of safety; true saturation: slots / mean service time. The
true beta is the configuration's: the share of a cold request's service time that its
prefill is (what a full hit saves).

**The truth check**: after the probe, one steady run of the real simulator at the true
cold ultimate (``check_s`` of Poisson load, open loop, its first ``check_warmup_s``
discarded), its first-token p99 against the model fed the very same arrivals and
requests from the same empty start. The model is trusted when they agree within
``check_tolerance``; the run's p99 against the SLO is reported too, but is no test: a
minute at 0.9 of saturation reads anywhere from half the long-run p99 to all of it
(``model_window_p99_s``: that spread, from the model).

One JSON object per step on stdout, then the headline (see bench/README.md);
progress on stderr. Exit codes: 0 done, 1 failed, 130 interrupted (no etcd needed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace

import aiohttp
import numpy as np

from bench._common import BenchError, Reporter, goals_and_met, kill_all, terminate_as_interrupt
from bench.capacity_truth import (
    POOL,
    WARMUP_SHARE,
    EngineModel,
    Service,
    SteadyState,
    Truth,
    hit_share,
    simulate,
    true_beta,
    truth,
)
from bench.capacity_truth import services as engine_services
from chaos.capacity.load import LoadGenerator, Planned
from chaos.capacity.probe import probe_capacity
from chaos.capacity.probe_config import ProbeConfig, recovery_offsets
from chaos.capacity.results import Outcome, RequestResult
from chaos.capacity.stats import percentile, recovery_time
from chaos.capacity.verdicts import Phase, ProbeAborted, StepReport
from chaos.capacity.workload import Workload, arrivals, requests
from chaos.lab.procs import Proc, start_simulators
from controlplane.kernel.capacity.bearing import CapacitySLO, fit_hit_effect
from controlplane.kernel.capacity.record import CapacityRecord, HitProbe, WorkloadProfile

MAX_MODEL_LEN = 16_384  # every prompt the workloads make fits, with its output


@dataclass(frozen=True)
class Goals:
    knee_error: float = 0.10  # |measured - true| / true, the worst probe and configuration
    ultimate_error: float = 0.10
    allowed_error: float = 0.10
    max_overstatement: float = 0.05  # (measured - true) / true, the largest
    beta_error: float = 0.10  # absolute


GOALS = Goals()


@dataclass(frozen=True)
class Options:
    """One configuration: the simulator, the workload, the probe's settings, the truth's."""

    step_s: float = 5.0
    slots: int = 16
    prefill_rate: float = 500.0
    decode_rate: float = 25.0
    block_size: int = 16
    kv_blocks: int = 65_536
    prompt_p50: int = 200
    prompt_p90: int = 200
    output_tokens: int = 4
    shared_share: float = 0.9
    prefix_tokens: int = 150
    prefixes: int = 4
    slo_s: float = 2.0
    factor_of_safety: float = 2.0
    start_rps: float = 8.0
    growth: float = 1.5
    precision: float = 0.05
    recover_s: float = 15.0
    recover_window_s: float = 1.0
    behind_retries: int = 3  # a shared machine's stalls pass; a quiet one never reruns
    min_requests: int = 400  # the probe's sustained steps: arrivals judged per step
    max_warmup_s: float = 120.0
    max_measure_s: float = 120.0
    seed: int = 1
    truth_requests: int = 500_000  # per steady-state run of the model
    check_s: float = 60.0  # the truth check's run of the real simulator
    check_warmup_s: float = 10.0  # of it discarded
    check_tolerance: float = 0.25  # its p99 against the model's of the same run, relative

    def workload(self) -> Workload:
        profile = WorkloadProfile(
            prompt_tokens_p50=self.prompt_p50,
            prompt_tokens_p90=self.prompt_p90,
            output_tokens=self.output_tokens,
            shared_prefix_share=self.shared_share,
            source="bench",
        )
        return Workload(profile, prefix_tokens=self.prefix_tokens, prefixes=self.prefixes)

    def engine(self) -> EngineModel:
        return EngineModel(self.slots, self.prefill_rate, self.decode_rate, self.block_size)

    def probe_config(self) -> ProbeConfig:
        return ProbeConfig(
            region="bench",
            slo=CapacitySLO(ttft_p99_s=self.slo_s),
            factor_of_safety=self.factor_of_safety,
            step_s=self.step_s,
            start_rps=self.start_rps,
            growth=self.growth,
            precision=self.precision,
            request_timeout_s=max(10.0, 20 * self.slo_s),
            recover_s=self.recover_s,
            recover_window_s=self.recover_window_s,
            behind_retries=self.behind_retries,
            min_requests=self.min_requests,
            max_warmup_s=self.max_warmup_s,
            max_measure_s=self.max_measure_s,
            seed=self.seed,
            prober="bench",
        )


# The presets. Each puts its true ultimate at 0.87-0.90 of saturation: service times
# of half the SLO or more, so that the SLO binds where a queue builds but has not run
# away; and each keeps the rates about 20/s at most (two shared cores drive the probe's
# load and the simulator).
PRESETS: dict[str, Options] = {
    # chat: decode-bound (a 48-token answer at 40 tokens/s, 1.2 s), prompts log-normal
    # around 400 tokens with a long tail, most starting with one of 4 system prompts:
    # a hit saves little (beta ~0.07). Saturation ~9.5/s cold.
    "chat": Options(
        slots=12, prefill_rate=8_000.0, decode_rate=40.0,
        prompt_p50=400, prompt_p90=1_600, output_tokens=48,
        shared_share=0.9, prefix_tokens=300, prefixes=4, start_rps=2.0,
    ),
    # catalog: prefill-heavy prompts around 1,000 tokens, 80 % of them led by one of 8
    # shared 750-token prefixes (what a region's prefix catalog shows), short answers on
    # few slots: a hit saves about half a request (beta ~0.5). Saturation ~10/s cold,
    # ~13/s warm.
    "catalog": Options(
        slots=4, prefill_rate=6_000.0, decode_rate=150.0,
        prompt_p50=1_000, prompt_p90=2_000, output_tokens=32,
        shared_share=0.8, prefix_tokens=750, prefixes=8, start_rps=2.0,
    ),
    # custom: the flags alone (the bench's former single configuration by default)
    "custom": Options(),
}  # fmt: skip
DEFAULT_CONFIGS = ("chat", "catalog")


# ---- the truth -------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigTruth:
    cold: Truth
    warm: Truth
    cold_model: SteadyState  # for the truth check's expected spread
    beta: float
    hit_rate_cold: float
    hit_rate_warm: float
    seconds: float


def compute_truth(o: Options) -> ConfigTruth:
    """The configuration's truth, cold and warm, from the same random streams."""
    started = time.monotonic()
    workload, engine = o.workload(), o.engine()
    slo = CapacitySLO(ttft_p99_s=o.slo_s)

    def one(warm: bool) -> tuple[list[Service], Truth, SteadyState]:
        pool = engine_services(engine, workload, POOL, warm=warm, seed=o.seed, tag="model")
        found, model = truth(
            pool,
            o.slots,
            slo_s=o.slo_s,
            knee_factor=slo.knee_factor,
            lowest_rps=o.start_rps,
            factor_of_safety=o.factor_of_safety,
            requests=o.truth_requests,
            seed=o.seed,
        )
        return pool, found, model

    cold_pool, cold, cold_model = one(False)
    warm_pool, warm, _ = one(True)
    return ConfigTruth(
        cold=cold,
        warm=warm,
        cold_model=cold_model,
        beta=true_beta(cold_pool),
        hit_rate_cold=hit_share(cold_pool),
        hit_rate_warm=hit_share(warm_pool),
        seconds=time.monotonic() - started,
    )


def _truth_figures(t: Truth) -> dict[str, object]:
    return {
        "hit_rate": _round(t.hit_rate),
        "mean_service_s": _round(t.mean_service_s),
        "saturation_rps": _round(t.saturation_rps, 3),
        "baseline_p99_s": _round(t.baseline_p99_s),
        "knee_rps": _round(t.knee_rps, 3),
        "ultimate_rps": _round(t.ultimate_rps, 3),
        "allowed_rps": _round(t.allowed_rps, 3),
        "ultimate_over_saturation": _round(t.ultimate_rps / t.saturation_rps),
        "p99_halves_s": [_round(p) for p in t.p99_halves_s],
    }


def model_results(
    at: Sequence[float], served: Sequence[Service], slots: int
) -> list[RequestResult]:
    """The model's requests (from an empty engine) as the probe's statistics read them."""
    return [
        RequestResult(
            planned_s=t,
            sent_s=t,
            first_token_s=first,
            done_s=done,
            outcome=Outcome.OK,
            status=200,
            detail="",
            prompt_tokens=s.prompt_tokens,
            generated_tokens=1,
            cached_tokens=s.hit_tokens,
            url="model",
        )
        for t, s, (first, done) in zip(at, served, simulate(at, served, slots), strict=False)
    ]


def services(o: Options, workload: Workload, count: int, *, warm: bool, tag: str) -> list[Service]:
    """The workload's first ``count`` requests as ``o``'s simulator serves them."""
    return engine_services(o.engine(), workload, count, warm=warm, seed=o.seed, tag=tag)


# ---- the truth check: the real simulator, steady, at the true ultimate -------------------


async def _model_id(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/v1/models") as r:
        data = (await r.json(content_type=None)).get("data") or []
    if not data:
        raise BenchError(f"{url}/v1/models lists no model")
    return str(data[0]["id"])


async def truth_check(url: str, o: Options, t: ConfigTruth) -> dict[str, object]:
    """``check_s`` of cold Poisson load at the true ultimate on the simulator; its p99
    (past ``check_warmup_s``) against the model's of the very same run."""
    rate = t.cold.ultimate_rps
    workload = o.workload()
    offsets = arrivals(rate, o.check_s, o.seed + 1_000)
    tag = f"check:{secrets.token_hex(4)}"
    reqs = requests(workload, len(offsets), warm=False, seed=o.seed, tag=tag)
    async with LoadGenerator(max(10.0, 20 * o.slo_s)) as gen:
        model = await _model_id(gen.http, url)
        plan = [
            Planned(a, url, r.body(model), r.prompt_tokens)
            for a, r in zip(offsets, reqs, strict=True)
        ]
        results = await gen.run(plan)
    kept = [r for r in results if r.planned_s >= o.check_warmup_s]
    ttfts = [x for r in kept if (x := r.ttft_s) is not None]
    if not ttfts:
        raise BenchError(f"the truth check at {rate:.3g} rps got no first token")
    p99 = percentile(ttfts, 99)
    served = services(o, workload, len(offsets), warm=False, tag=tag)
    timed = simulate(offsets, served, o.slots)
    p99_model = percentile(
        [first - a for a, (first, _) in zip(offsets, timed, strict=True) if a >= o.check_warmup_s],
        99,
    )
    decode = [
        (r.done_s - r.first_token_s, s.decode_s)
        for r, s in zip(results, served, strict=True)
        if r.ok and r.first_token_s is not None
    ]
    windows = t.cold_model.window_p99(rate, o.check_s - o.check_warmup_s)
    agreement = abs(p99 - p99_model) / p99_model
    return {
        "rate_rps": _round(rate, 3),
        "seconds": o.check_s,
        "warmup_s": o.check_warmup_s,
        "requests": len(results),
        "p99_ttft_s": _round(p99),
        "p99_model_same_run_s": _round(p99_model),
        "p99_vs_model": _round(agreement),
        "tolerance": o.check_tolerance,
        "ok": agreement <= o.check_tolerance,
        "slo_s": o.slo_s,
        "p99_over_slo": _round(p99 / o.slo_s),
        "model_window_p99_s": [_round(float(x)) for x in np.percentile(windows, [10, 50, 90])],
        "served_ratio": _round(sum(r.ok for r in results) / len(results)),
        "decode_over_model": _round(
            sum(m for m, _ in decode) / sum(s for _, s in decode) if decode else None
        ),
        "lag_p99_s": _round(percentile([max(0.0, r.lag_s) for r in results], 99)),
    }


# ---- one configuration ------------------------------------------------------------------


def _error(measured: float | None, true: float | None) -> float | None:
    if measured is None or true is None or true == 0:
        return None
    return abs(measured - true) / true


def _over(measured: float | None, true: float | None) -> float | None:
    if measured is None or true is None or true == 0:
        return None
    return (measured - true) / true


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _worst(values: Sequence[object]) -> float | None:
    """The largest, or None when any is missing (a goal then is not met)."""
    nums = [v for v in values if isinstance(v, float | int) and not isinstance(v, bool)]
    return None if len(nums) < len(values) or not nums else float(max(nums))


def _probe_figures(
    record: CapacityRecord, probe: HitProbe, t: Truth, hit_rate_model: float
) -> dict[str, object]:
    allowed = record.effect.capacity(probe.hit_rate) / record.factor_of_safety
    pairs = {
        "knee": (probe.knee_rps, t.knee_rps),
        "ultimate": (probe.ultimate_rps, t.ultimate_rps),
        "allowed": (allowed, t.allowed_rps),
    }
    overs = [_over(m, x) for m, x in pairs.values()]
    return {
        "hit_rate": _round(probe.hit_rate),
        "hit_rate_model": _round(hit_rate_model),
        "baseline_p99_s": _round(probe.baseline_p99_s),
        "knee_rps": _round(probe.knee_rps, 3),
        "ultimate_rps": _round(probe.ultimate_rps, 3),
        "allowed_rps": _round(allowed, 3),
        "ultimate_bounded": probe.ultimate_bounded,
        "steps": len(probe.steps),
        **{f"{k}_error": _round(_error(m, x)) for k, (m, x) in pairs.items()},
        "overstatement": _round(_worst(overs)),
    }


def config_figures(
    o: Options,
    record: CapacityRecord,
    reports: Sequence[StepReport],
    t: ConfigTruth,
    check: dict[str, object],
    probe_wall_s: float,
) -> dict[str, object]:
    cfg = o.probe_config()
    probes = {
        "cold": _probe_figures(record, record.probes[0], t.cold, t.hit_rate_cold),
        "warm": _probe_figures(record, record.probes[1], t.warm, t.hit_rate_warm),
    }
    # the model's T_recover: the probe's own recovery arrivals and requests, from empty
    over, after = recovery_offsets(cfg, record.probes[0].ultimate_rps)
    at = [*over, *after]
    cold = services(o, o.workload(), len(at), warm=False, tag="model")
    t_true = recovery_time(
        model_results(at, cold, o.slots),
        o.step_s,
        o.step_s + o.recover_s,
        o.recover_window_s,
        cfg.slo,
    )
    fit = fit_hit_effect(
        [(t.hit_rate_cold, t.cold.ultimate_rps), (t.hit_rate_warm, t.warm.ultimate_rps)]
    )
    behind = [r for r in reports if r.generator_behind]
    return {
        "probes": probes,
        "truth": {
            "cold": _truth_figures(t.cold),
            "warm": _truth_figures(t.warm),
            "beta": _round(t.beta),
            "beta_fit": _round(fit.beta),
            "requests": o.truth_requests,
            "warmup_requests": int(WARMUP_SHARE * o.truth_requests),
            "seconds": round(t.seconds, 1),
        },
        "truth_check": check,
        "beta": _round(record.beta),
        "beta_error": _round(abs(record.beta - t.beta)),
        "r_base_rps": _round(record.r_base_rps, 3),
        "probe_s": round(record.probe_s, 1),
        "t_recover_s": _round(record.t_recover_s, 3),
        "t_recover_true_s": _round(t_true, 3),
        "wasted_work_share": record.wasted_work_share,
        "scaling_efficiency": record.scaling_efficiency,
        "scaling_measured": record.scaling_measured,
        "engine_version": record.engine_version,
        "steps": len(reports),
        "generator_lag_p99_max_s": _round(max(r.lag_p99_s for r in reports)),
        "steps_generator_behind": len(behind),
        "steps_rerun": sum(r.attempt > 0 for r in reports),
        "wall_s": round(probe_wall_s, 1),
        "settings": asdict(o),
    }


def _report_line(
    say: Reporter, name: str, reports: list[StepReport]
) -> Callable[[StepReport], None]:
    def on_step(r: StepReport) -> None:
        reports.append(r)
        behind = "  (generator behind)" if r.generator_behind else ""
        if r.attempt:
            behind += f"  (attempt {r.attempt + 1})"
        say.progress(
            f"{name:8} {r.phase.value:8} {r.offered_rps:7.2f} rps  p99 {r.p99_ttft_s * 1000:6.0f}"
            f" ms  errors {r.error_rate:6.1%}  served {r.throughput_rps:6.2f}/s  "
            f"{r.verdict.value}{behind}"
        )
        line = {k: (v.value if isinstance(v, Phase) else v) for k, v in asdict(r).items()}
        say.line({"step": {**line, "verdict": r.verdict.value, "config": name}})

    return on_step


def run_config(name: str, o: Options, say: Reporter, *, pair: bool = False) -> dict[str, object]:
    """One configuration: its truth (before anything runs), then a simulator, the probe
    and the truth check on it."""
    say.progress(f"{name}: the truth (steady-state model, {o.truth_requests:,} requests a run)")
    t = compute_truth(o)
    say.progress(
        f"{name}: true saturation {t.cold.saturation_rps:.2f} / {t.warm.saturation_rps:.2f} rps, "
        f"ultimate {t.cold.ultimate_rps:.2f} / {t.warm.ultimate_rps:.2f} rps (cold / warm), "
        f"{t.seconds:.1f} s"
    )
    extra = [
        "--max-num-seqs", str(o.slots),
        "--prefill-tokens-per-s", str(o.prefill_rate),
        "--decode-tokens-per-s", str(o.decode_rate),
        "--num-gpu-blocks-override", str(o.kv_blocks),
        "--max-model-len", str(MAX_MODEL_LEN),
        "--log-level", "WARNING",
    ]  # fmt: skip
    n = 2 if pair else 1
    say.progress(
        f"{name}: starting {n} simulator(s): {o.slots} slots, prefill {o.prefill_rate:g} "
        f"tokens/s, decode {o.decode_rate:g} tokens/s"
    )
    started = time.monotonic()
    procs: list[Proc] = start_simulators(n, block_size=o.block_size, extra_args=extra)
    reports: list[StepReport] = []
    try:
        record = asyncio.run(
            probe_capacity(
                procs[0].url,
                o.probe_config(),
                o.workload(),
                pair_url=procs[1].url if n == 2 else None,
                progress=_report_line(say, name, reports),
            )
        )
        say.progress(
            f"{name}: truth check, {o.check_s:g} s at {t.cold.ultimate_rps:.2f} rps (cold)"
        )
        check = asyncio.run(truth_check(procs[0].url, o, t))
    finally:
        kill_all(procs)
    say.progress(
        f"{name}: check p99 {check['p99_ttft_s']} s, the model's of the same run "
        f"{check['p99_model_same_run_s']} s"
    )
    return config_figures(o, record, reports, t, check, time.monotonic() - started)


# ---- the run ----------------------------------------------------------------------------


def headline(configs: dict[str, dict[str, object]], wall_s: float) -> dict[str, object]:
    """The headline over every configuration (each figure its worst)."""
    probes = [p for c in configs.values() for p in c["probes"].values()]  # type: ignore[attr-defined]
    figures: dict[str, float | None] = {
        "knee_error": _worst([p["knee_error"] for p in probes]),
        "ultimate_error": _worst([p["ultimate_error"] for p in probes]),
        "allowed_error": _worst([p["allowed_error"] for p in probes]),
        "beta_error": _worst([c["beta_error"] for c in configs.values()]),
    }
    over = _worst([p["overstatement"] for p in probes])
    recover = [c["t_recover_s"] for c in configs.values()]
    checks = {n: c["truth_check"] for n, c in configs.items()}
    return {
        "bench": "capacity",
        **figures,
        "overstatement": over,
        "probe_s": max(float(c["probe_s"]) for c in configs.values()),  # type: ignore[arg-type]
        "t_recover_s": _worst(recover),
        "saturation_true_rps": {
            n: {k: c["truth"][k]["saturation_rps"] for k in ("cold", "warm")}  # type: ignore[index]
            for n, c in configs.items()
        },
        "truth_check_ok": all(ch["ok"] for ch in checks.values()),  # type: ignore[index]
        "configs": configs,
        "truth": "the simulator's engine model (c slots, FIFO) in steady state: Poisson "
        "arrivals of the workload's request mix, 10 % of each run discarded; the ultimate "
        "where its first-token p99 is the SLO",
        "steps": sum(int(c["steps"]) for c in configs.values()),  # type: ignore[call-overload]
        "wall_s": round(wall_s, 1),
        "cores": os.cpu_count(),
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
        **goals_and_met(GOALS, {**figures, "max_overstatement": over}),
    }


def run_bench(
    configs: Sequence[tuple[str, Options]], say: Reporter, *, pair: bool = False
) -> dict[str, object]:
    started = time.monotonic()
    out = {name: run_config(name, o, say, pair=pair) for name, o in configs}
    return headline(out, time.monotonic() - started)


_ARGS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("--step-s", float, "seconds per probe step"),
    ("--slots", int, "the simulator's max running requests"),
    ("--prefill-rate", float, "the simulator's prefill tokens/s per request"),
    ("--decode-rate", float, "the simulator's decode tokens/s per request"),
    ("--block-size", int, "prefix-cache block size"),
    ("--kv-blocks", int, "the simulator's KV-cache blocks"),
    ("--prompt-p50", int, "prompt tokens, median"),
    ("--prompt-p90", int, "prompt tokens, 90th percentile"),
    ("--output-tokens", int, "output tokens per request"),
    ("--shared-share", float, "share of the warm workload's prompts with a shared prefix"),
    ("--prefix-tokens", int, "tokens of each shared prefix"),
    ("--prefixes", int, "shared prefixes"),
    ("--slo-s", float, "first-token p99 SLO, seconds"),
    ("--factor-of-safety", float, "allowed = ultimate / this"),
    ("--start-rps", float, "the probe's lowest step"),
    ("--growth", float, "the probe's climb per step"),
    ("--precision", float, "the probe's bracket, relative"),
    ("--recover-s", float, "seconds of allowed load after the overload step"),
    ("--recover-window-s", float, "T_recover's sliding window, seconds"),
    ("--behind-retries", int, "reruns of a step whose load generator fell behind"),
    ("--min-requests", int, "arrivals judged per sustained step of the probe"),
    ("--max-warmup-s", float, "a sustained step's warm-up at most, seconds"),
    ("--max-measure-s", float, "a sustained step's judged window at most, seconds"),
    ("--seed", int, "the workload's and the arrivals' seed"),
    ("--truth-requests", int, "requests per steady-state run of the model"),
    ("--check-s", float, "seconds of the truth check's run of the simulator"),
    ("--check-warmup-s", float, "of which the first are discarded"),
    ("--check-tolerance", float, "the check's p99 against the model's, relative"),
)


def _configs(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in PRESETS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown configuration(s) {', '.join(unknown) or '(none)'}; "
            f"the presets: {', '.join(PRESETS)}"
        )
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--configs",
        type=_configs,
        default=DEFAULT_CONFIGS,
        help=f"presets to run, one after the other: {', '.join(PRESETS)} (default "
        f"{','.join(DEFAULT_CONFIGS)}; custom: the flags below alone)",
    )
    d = Options()
    for flag, kind, text in _ARGS:
        default = getattr(d, flag[2:].replace("-", "_"))
        p.add_argument(
            flag,
            type=kind,
            default=None,
            help=f"{text} (overrides every preset; custom's default {default:g})",
        )
    p.add_argument(
        "--pair", action="store_true", help="also probe two replicas at once (scaling efficiency)"
    )
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def configurations(args: argparse.Namespace) -> list[tuple[str, Options]]:
    """The presets named by ``--configs``, each with the flags given on top."""
    given = {
        f.name: getattr(args, f.name)
        for f in fields(Options)
        if getattr(args, f.name, None) is not None
    }
    return [(name, replace(PRESETS[name], **given)) for name in args.configs]


def run(args: argparse.Namespace) -> int:
    try:  # like bench._common.main, without its etcd check: this bench needs none
        configs = configurations(args)
        with terminate_as_interrupt():
            result = run_bench(configs, Reporter(args.quiet), pair=args.pair)
    except KeyboardInterrupt:
        print("interrupted; every process was stopped", file=sys.stderr)
        return 130
    except (BenchError, ProbeAborted, RuntimeError, ValueError, aiohttp.ClientError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0
