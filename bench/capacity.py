"""``python -m bench capacity``: does the capacity probe find what a replica bears?

One simulator (two with ``--pair``) whose latency model fixes the truth: at most
``--slots`` requests run, the rest wait FIFO; a request's prefill takes its uncached
prompt tokens / ``--prefill-rate``, then each further output token 1 /
``--decode-rate`` (``regions/simulator/engine.py``). The probe
(``chaos.capacity.probe``) runs against it as against any replica: a cold probe,
a warm probe (``--shared-share`` of the prompts start with one of ``--prefixes``
shared prefixes of ``--prefix-tokens``), T_recover, and with ``--pair`` the scaling
efficiency of two replicas.

**The truth** is a discrete-event simulation of the simulator's scheduler in this
process (:func:`simulate`: c slots, FIFO, the same service times) fed the very
requests and Poisson arrivals the probe sent (the probe's steps are seeded: request
``i`` and arrival ``i`` are the same at every rate). Token counts and prefix hits come
from the simulator's own tokenizer and block rule, with the shared prefixes warm. A
fine sweep of the model (0.5 % apart, from the probe's lowest rate up) is analysed
by the same ``analyze`` as the probe's steps: the true knee and ultimate of a step
test of the same step length. The true beta is the configuration's: the share of a
cold request's service time that its prefill is (what a full hit saves), averaged
over the workload's requests; with R(h) = R_base / (1 - beta h) and h the token hit
rate, service capacity follows it exactly. The fit of R(h) over the model's own
ultimates (``beta_fit_of_truth``) shows how far the SLO's queueing bends it.

One JSON object per step on stdout, then the headline (see bench/README.md);
progress on stderr. Exit codes: 0 done, 1 failed, 130 interrupted (no etcd needed).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields

import aiohttp

from bench._common import BenchError, Reporter, goals_and_met, kill_all, terminate_as_interrupt
from chaos.capacity.probe import ProbeConfig, probe_capacity, recovery_offsets
from chaos.capacity.results import Outcome, RequestResult
from chaos.capacity.stats import percentile, recovery_time
from chaos.capacity.verdicts import Phase, ProbeAborted, StepReport
from chaos.capacity.workload import Workload, arrivals, prefix_words, requests
from chaos.lab.procs import Proc, start_simulators
from controlplane.kernel.capacity import CapacitySLO, Curve, Step, analyze, fit_hit_effect
from controlplane.kernel.capacity_record import CapacityRecord, HitProbe, WorkloadProfile
from regions.simulator.tokenizer import Tokenizer, render_chat

SWEEP_STEP = 1.005  # the model's sweep: rates 0.5 % apart


@dataclass(frozen=True)
class Goals:
    knee_error: float = 0.10  # |measured - true| / true, the worse probe
    ultimate_error: float = 0.10
    beta_error: float = 0.10  # absolute


GOALS = Goals()


@dataclass(frozen=True)
class Options:
    step_s: float = 5.0
    slots: int = 16
    prefill_rate: float = 500.0
    decode_rate: float = 25.0
    block_size: int = 16
    kv_blocks: int = 65_536
    prompt_p50: int = 200
    prompt_p90: int = 200  # one length: the model's variance is the arrivals' alone
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
    seed: int = 1
    pair: bool = False
    quiet: bool = False

    def workload(self) -> Workload:
        profile = WorkloadProfile(
            prompt_tokens_p50=self.prompt_p50,
            prompt_tokens_p90=self.prompt_p90,
            output_tokens=self.output_tokens,
            shared_prefix_share=self.shared_share,
            source="bench",
        )
        return Workload(profile, prefix_tokens=self.prefix_tokens, prefixes=self.prefixes)

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
            seed=self.seed,
            prober="bench",
        )


# ---- the model: the simulator's scheduler as a discrete-event simulation ---------------


@dataclass(frozen=True, slots=True)
class Service:
    """One request as the simulator serves it."""

    prompt_tokens: int
    hit_tokens: int  # prefix-cache hit (the shared prefix warm)
    prefill_s: float
    decode_s: float  # after the first token


def services(o: Options, workload: Workload, count: int, *, warm: bool, tag: str) -> list[Service]:
    """The probe's first ``count`` requests as the simulator sees them: its tokenizer
    and chat template, hits in full blocks of the shared prefix (never the last token,
    as vLLM), the output as long as asked (every prompt fits the context here)."""
    tok = Tokenizer()
    bs = o.block_size
    prefix_ids: dict[int, list[int]] = {}
    out = []
    for r in requests(workload, count, warm=warm, seed=o.seed, tag=tag):
        ids = tok.encode(render_chat([("user", r.content)]))
        hit = 0
        if r.prefix is not None:
            if r.prefix not in prefix_ids:
                text = " ".join(prefix_words(r.prefix, o.seed, workload.prefix_tokens))
                prefix_ids[r.prefix] = tok.encode(f"<|user|>\n{text}")
            shared = prefix_ids[r.prefix]
            common = next(
                (i for i, (a, b) in enumerate(zip(ids, shared, strict=False)) if a != b),
                min(len(ids), len(shared)),
            )
            hit = min(common // bs, (len(ids) - 1) // bs) * bs
        out.append(
            Service(
                prompt_tokens=len(ids),
                hit_tokens=hit,
                prefill_s=(len(ids) - hit) / o.prefill_rate,
                decode_s=(r.max_tokens - 1) / o.decode_rate,
            )
        )
    return out


def simulate(
    at: Sequence[float], served: Sequence[Service], slots: int
) -> list[tuple[float, float]]:
    """(first token, done) of each request arriving at ``at`` (ascending): ``slots``
    run at once, the rest wait in FIFO order; the head of the queue takes the first
    slot that frees."""
    if len(served) < len(at):
        raise BenchError(f"the model has {len(served)} requests for {len(at)} arrivals")
    free = [0.0] * slots
    out = []
    for t, s in zip(at, served[: len(at)], strict=True):
        start = max(t, heapq.heappop(free))
        first = start + s.prefill_s
        done = first + s.decode_s
        heapq.heappush(free, done)
        out.append((first, done))
    return out


def model_results(
    at: Sequence[float], served: Sequence[Service], slots: int
) -> list[RequestResult]:
    """The model's requests as the probe's statistics read them."""
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


def model_step(o: Options, served: Sequence[Service], rate: float) -> Step:
    at = arrivals(rate, o.step_s, o.seed)
    timed = simulate(at, served, o.slots)
    if not timed:
        return Step(rate, 0.0, 0.0, 0.0)
    ttfts = [first - t for t, (first, _) in zip(at, timed, strict=False)]
    span = max(o.step_s, *(done for _, done in timed))
    return Step(rate, percentile(ttfts, 99), 0.0, len(timed) / span)


def model_curve(o: Options, served: Sequence[Service], lowest_rps: float) -> Curve:
    """The true curve: a fine sweep of the model from the probe's lowest rate until the
    p99 is three times the SLO (the ultimate is well behind)."""
    steps = []
    rate = lowest_rps
    while True:
        step = model_step(o, served, rate)
        steps.append(step)
        if step.p99_ttft_s > 3 * o.slo_s and len(steps) > 10:
            return analyze(steps, CapacitySLO(ttft_p99_s=o.slo_s))
        rate *= SWEEP_STEP


def true_beta(served: Sequence[Service]) -> float:
    """The share of a cold request's service time that a full hit saves (its prefill),
    over the workload: sum of prefill times over sum of service times."""
    prefill = sum(s.prefill_s for s in served)
    return prefill / (prefill + sum(s.decode_s for s in served))


def hit_share(served: Sequence[Service]) -> float:
    return sum(s.hit_tokens for s in served) / sum(s.prompt_tokens for s in served)


# ---- the run ----------------------------------------------------------------------------


def _error(measured: float | None, truth: float | None) -> float | None:
    if measured is None or truth is None or truth == 0:
        return None
    return abs(measured - truth) / truth


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _probe_figures(o: Options, probe: HitProbe, served: Sequence[Service]) -> dict[str, object]:
    lowest = min(s.offered_rps for s in probe.steps)
    truth = model_curve(o, served, lowest)
    # how much later the simulator's first tokens came than the model's, step by step:
    # its own CPU (HTTP, tokenizing, timers on a busy loop) and the machine's
    excess = [s.p99_ttft_s - model_step(o, served, s.offered_rps).p99_ttft_s for s in probe.steps]
    return {
        "hit_rate": _round(probe.hit_rate),
        "hit_rate_model": _round(hit_share(served)),
        "baseline_p99_s": _round(probe.baseline_p99_s),
        "baseline_true_p99_s": _round(truth.baseline_p99_s),
        "knee_rps": _round(probe.knee_rps, 3),
        "knee_true_rps": _round(truth.knee_rps, 3),
        "knee_error": _round(_error(probe.knee_rps, truth.knee_rps)),
        "ultimate_rps": _round(probe.ultimate_rps, 3),
        "ultimate_true_rps": _round(truth.ultimate_rps, 3),
        "ultimate_error": _round(_error(probe.ultimate_rps, truth.ultimate_rps)),
        "ultimate_bounded": probe.ultimate_bounded,
        "steps": len(probe.steps),
        "p99_over_model_ms": {
            "median": round(1000 * percentile(excess, 50), 1),
            "max": round(1000 * max(excess), 1),
        },
    }


def _worst(values: Sequence[object]) -> float | None:
    nums = [v for v in values if isinstance(v, float | int)]
    return None if len(nums) < len(values) else float(max(nums))


def headline(
    o: Options, record: CapacityRecord, reports: Sequence[StepReport], wall_s: float
) -> dict[str, object]:
    workload = o.workload()
    cfg = o.probe_config()
    over, after = recovery_offsets(cfg, record.probes[0].ultimate_rps)
    at = [*over, *after]
    # enough requests for the sweeps (they stop near 1.5-2 x the true ultimate, which a
    # disturbed probe may find at half that) and T_recover
    top = max(p.ultimate_rps for p in record.probes)
    count = max(len(at), round(8 * top * o.step_s)) + 64
    cold = services(o, workload, count, warm=False, tag="model")
    warm = services(o, workload, count, warm=True, tag="model")
    probes = {
        "cold": _probe_figures(o, record.probes[0], cold),
        "warm": _probe_figures(o, record.probes[1], warm),
    }
    beta = true_beta(cold)
    truth_points = [
        (hit_share(cold), float(probes["cold"]["ultimate_true_rps"])),  # type: ignore[arg-type]
        (hit_share(warm), float(probes["warm"]["ultimate_true_rps"])),  # type: ignore[arg-type]
    ]
    t_true = recovery_time(
        model_results(at, cold, o.slots),
        o.step_s,
        o.step_s + o.recover_s,
        o.recover_window_s,
        cfg.slo,
    )
    figures: dict[str, float | None] = {
        "knee_error": _worst([p["knee_error"] for p in probes.values()]),
        "ultimate_error": _worst([p["ultimate_error"] for p in probes.values()]),
        "beta_error": _round(abs(record.beta - beta)),
    }
    behind = [r for r in reports if r.generator_behind]
    return {
        "bench": "capacity",
        **figures,
        "probe_s": round(record.probe_s, 1),
        "t_recover_s": _round(record.t_recover_s, 3),
        "t_recover_true_s": _round(t_true, 3),
        "beta": _round(record.beta),
        "beta_true": _round(beta),
        "beta_fit_of_truth": _round(fit_hit_effect(truth_points).beta),
        "r_base_rps": _round(record.r_base_rps, 3),
        "allowed_cold_rps": _round(record.allowed_rps(0.0, 1), 3),
        "wasted_work_share": record.wasted_work_share,
        "scaling_efficiency": record.scaling_efficiency,
        "scaling_measured": record.scaling_measured,
        "engine_version": record.engine_version,
        "probes": probes,
        "steps": len(reports),
        "generator_lag_p99_max_s": _round(max(r.lag_p99_s for r in reports)),
        "steps_generator_behind": len(behind),
        "steps_rerun": sum(r.attempt > 0 for r in reports),
        "truth": "discrete-event simulation of the simulator's scheduler, fed the probe's "
        f"requests and arrivals; sweep {SWEEP_STEP - 1:.1%} apart",
        "settings": {k: v for k, v in asdict(o).items() if k != "quiet"},
        "wall_s": round(wall_s, 1),
        "cores": os.cpu_count(),
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
        **goals_and_met(GOALS, figures),
    }


def _report_line(say: Reporter, reports: list[StepReport]) -> Callable[[StepReport], None]:
    def on_step(r: StepReport) -> None:
        reports.append(r)
        behind = "  (generator behind)" if r.generator_behind else ""
        if r.attempt:
            behind += f"  (attempt {r.attempt + 1})"
        say.progress(
            f"{r.phase.value:8} {r.offered_rps:7.2f} rps  p99 {r.p99_ttft_s * 1000:6.0f} ms  "
            f"errors {r.error_rate:6.1%}  served {r.throughput_rps:6.2f}/s  {r.verdict.value}"
            f"{behind}"
        )
        line = {k: (v.value if isinstance(v, Phase) else v) for k, v in asdict(r).items()}
        say.line({"step": {**line, "verdict": r.verdict.value}})

    return on_step


def run_bench(o: Options, say: Reporter) -> dict[str, object]:
    started = time.monotonic()
    extra = [
        "--max-num-seqs", str(o.slots),
        "--prefill-tokens-per-s", str(o.prefill_rate),
        "--decode-tokens-per-s", str(o.decode_rate),
        "--num-gpu-blocks-override", str(o.kv_blocks),
        "--log-level", "WARNING",
    ]  # fmt: skip
    n = 2 if o.pair else 1
    say.progress(
        f"starting {n} simulator(s): {o.slots} slots, prefill {o.prefill_rate:g} tokens/s, "
        f"decode {o.decode_rate:g} tokens/s"
    )
    procs: list[Proc] = start_simulators(n, block_size=o.block_size, extra_args=extra)
    reports: list[StepReport] = []
    try:
        record = asyncio.run(
            probe_capacity(
                procs[0].url,
                o.probe_config(),
                o.workload(),
                pair_url=procs[1].url if o.pair else None,
                progress=_report_line(say, reports),
            )
        )
    finally:
        kill_all(procs)
    return headline(o, record, reports, time.monotonic() - started)


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
    ("--seed", int, "the workload's and the arrivals' seed"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Options()
    for flag, kind, text in _ARGS:
        default = getattr(d, flag[2:].replace("-", "_"))
        p.add_argument(flag, type=kind, default=default, help=f"{text} (default {default:g})")
    p.add_argument(
        "--pair", action="store_true", help="also probe two replicas at once (scaling efficiency)"
    )
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def run(args: argparse.Namespace) -> int:
    o = Options(**{f.name: getattr(args, f.name) for f in fields(Options)})
    try:  # like bench._common.main, without its etcd check: this bench needs none
        with terminate_as_interrupt():
            result = run_bench(o, Reporter(o.quiet))
    except KeyboardInterrupt:
        print("interrupted; every process was stopped", file=sys.stderr)
        return 130
    except (BenchError, ProbeAborted, RuntimeError, ValueError, aiohttp.ClientError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0
