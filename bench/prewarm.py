"""``python -m bench prewarm``: how fast pre-warm fills a region, and what it buys.

``--replicas`` simulator processes get a visible prefill rate (``--prefill-rate``
tokens/s per running sequence, at most ``--engine-seqs`` running: by default 1, so a
replica is compute-bound at that rate) and room for every prefix. ``--prefixes``
synthetic text prefixes of ~``--prefix-tokens`` tokens (distinct from their first
characters) are replayed by the agent's executor (``execute_prewarm``), every run
from cold caches. Each of ``--rounds`` rounds runs:

* a **budget cut**: ``--short-budget`` (default half of what all the prefixes need at
  the configured capacity), the agent's default concurrency: attainment must come out
  below 1, and no replay may be sent after the deadline (headers-sent times from an
  aiohttp trace); ``planned`` is what ``select_prewarm`` fits in that budget;
* the **sweep**: one run per ``--per-replica`` value within ``--budget``: ``warm_s``,
  ``attainment``, ``prefill_tokens_per_s`` (the replays' prompt tokens from vLLM's
  usage, over ``warm_s``) and ``prefill_efficiency`` (÷ the configured capacity).

Then the **first requests**: with every prefix warm, and again after
``/reset_prefix_cache`` (cold), one user request per ``--sample`` prefix (prefix plus
a unique question, streaming), one at a time, to the replica the gateway's balancer
picks: client-side time to the first content chunk, and the replica's
``vllm:prefix_cache_hits_total`` delta over the request's prompt tokens.

One JSON object per run and pass on stdout, then the headline (see bench/README.md);
progress on stderr. Exit codes: 0 done, 1 failed, 130 interrupted (no etcd needed).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import string
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from types import SimpleNamespace

import aiohttp

from bench._common import (
    BenchError,
    Reporter,
    at_least,
    goals_and_met,
    kill_all,
    percentile,
    terminate_as_interrupt,
)
from bench._stream import streamed_completion
from chaos.lab.procs import Proc, start_simulators
from controlplane.kernel.prefix.identity import FingerprintParams, PromptKind
from controlplane.kernel.prefix.prewarm import (
    Candidate,
    PrewarmLimits,
    ReplayPayload,
    Residency,
    select_prewarm,
)
from controlplane.kernel.prefix.sealing import Keyring, generate_key, open_payloads, seal_payload
from controlplane.kernel.vllm.metrics import parse_gauges
from regions.agent.prewarm_executor import cache_counters, execute_prewarm
from regions.agent.prewarm_plan import assign, routing_text
from regions.agent.service import PrewarmServiceConfig
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.ring import prefix_key

MODEL = "tiny"
AGENT_PER_REPLICA = PrewarmServiceConfig().per_replica_concurrency  # the agent's default
_BUSY = frozenset({"vllm:num_requests_running", "vllm:num_requests_waiting"})


@dataclass(frozen=True)
class Goals:
    attainment: float = 1.0  # at least: everything warm within --budget
    sent_after_deadline: float = 0.0  # at most: the budget cut sends nothing late
    ttft_ratio: float = 0.5  # warm p50 / cold p50
    hit_rate_warm: float = 0.9  # at least


GOALS = Goals()
AT_LEAST = ("attainment", "hit_rate_warm")


@dataclass(frozen=True)
class Options:
    replicas: int = 4
    prefixes: int = 200
    prefix_tokens: int = 1000
    block_size: int = 16
    prefill_rate: float = 20_000.0
    engine_seqs: int = 1
    kv_blocks: int = 32_768
    per_replica: tuple[int, ...] = (1, 2, 4)
    budget: float = 30.0
    rounds: int = 3
    short_budget: float | None = None  # None: half the ideal time at full capacity
    sample: int = 40
    seed: int = 1
    quiet: bool = False

    @property
    def capacity(self) -> float:
        """The replicas' configured prefill capacity, tokens/s."""
        return self.replicas * self.prefill_rate * self.engine_seqs


@dataclass(frozen=True)
class Sample:
    ttft_s: float
    prompt_tokens: int
    hits: int
    clean: bool  # the replica's query counter moved by exactly this request's tokens
    as_planned: bool  # the balancer chose the replica the pre-warm plan warmed


# ---- the workload -----------------------------------------------------------------------


def prefix_text(i: int, words: int, seed: int) -> str:
    """Prefix ``i``: distinct from its first characters; words of 1-4 letters, one
    simulator token each."""
    rng = random.Random(seed * 1_000_003 + i)
    body = " ".join(
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 4))) for _ in range(words)
    )
    return f"{i:05d} tenant system prompt: {body}"


async def build_payloads(http: aiohttp.ClientSession, url: str, o: Options) -> list[ReplayPayload]:
    """The payloads, most frequent first, each sized by the replica's ``/tokenize``."""
    out = []
    for i in range(o.prefixes):
        text = prefix_text(i, max(1, o.prefix_tokens - 8), o.seed)
        body = {"model": MODEL, "prompt": text}
        async with http.post(url + "/tokenize", json=body) as r:
            if r.status != 200:
                raise BenchError(f"/tokenize answered {r.status}: {(await r.text())[:200]}")
            count = int((await r.json())["count"])
        blocks = max(1, count // o.block_size)
        out.append(
            ReplayPayload(
                key=f"bench-{i:05d}",
                kind=PromptKind.TEXT,
                model=MODEL,
                prompt=text,
                blocks=blocks,
                block_size=o.block_size,
                tokens=blocks * o.block_size,
                tokens_exact=True,
            )
        )
    return out


def planned(payloads: Sequence[ReplayPayload], o: Options, budget_s: float) -> int:
    """How many replays the leader's choice fits in ``budget_s`` at full capacity."""
    n = len(payloads)
    cands = [
        Candidate(key=p.key, count=n - i, sessions=3, payload=p) for i, p in enumerate(payloads)
    ]
    limits = PrewarmLimits(
        budget_s=budget_s,
        prefill_tokens_per_s=o.capacity,
        kv_capacity_blocks=o.replicas * o.kv_blocks,
        block_size=o.block_size,
    )
    residency = Residency(min_sessions=1, source_zone="z", target_zone="z")
    return len(select_prewarm(cands, n, limits, residency).replay)


# ---- replica helpers --------------------------------------------------------------------


async def _busy(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as r:
        return sum(parse_gauges(await r.text(), _BUSY).values())


async def wait_idle(http: aiohttp.ClientSession, urls: Sequence[str], within: float = 60) -> None:
    deadline = time.monotonic() + within
    while any([await _busy(http, u) for u in urls]):
        if time.monotonic() > deadline:
            raise BenchError(f"replicas still busy {within} s after a run")
        await asyncio.sleep(0.05)


async def reset_caches(http: aiohttp.ClientSession, urls: Sequence[str]) -> None:
    await wait_idle(http, urls)
    for u in urls:
        async with http.post(u + "/reset_prefix_cache") as r:
            ok = r.status == 200 and bool((await r.json()).get("success"))
        if not ok:
            raise BenchError(f"{u}: /reset_prefix_cache refused while idle")


async def prefilled(http: aiohttp.ClientSession, urls: Sequence[str]) -> tuple[float, float]:
    """(queries, hits) summed over the replicas."""
    pairs = [await cache_counters(http, u) for u in urls]
    return sum(q for q, _ in pairs), sum(h for _, h in pairs)


def _trace(sends: list[float]) -> aiohttp.TraceConfig:
    """Record the loop time at which each replay's headers went out."""
    trace = aiohttp.TraceConfig()

    async def sent(
        session: aiohttp.ClientSession,
        ctx: SimpleNamespace,
        params: aiohttp.TraceRequestHeadersSentParams,
    ) -> None:
        if params.url.path.endswith("/completions"):
            sends.append(asyncio.get_running_loop().time())

    trace.on_request_headers_sent.append(sent)
    return trace


# ---- runs -------------------------------------------------------------------------------


async def warm_run(
    urls: Sequence[str],
    payloads: Sequence[ReplayPayload],
    o: Options,
    *,
    per_replica: int,
    budget_s: float,
    say: Reporter,
    ring: Keyring | None = None,
) -> dict[str, object]:
    """One pre-warm from cold caches; its figures. With ``ring`` the payloads are
    sealed and opened first, as an agent does, inside the timed run (``open_s``)."""
    sends: list[float] = []
    async with aiohttp.ClientSession(trace_configs=[_trace(sends)]) as http:
        await reset_caches(http, urls)
        _, h0 = await prefilled(http, urls)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        if ring is not None:
            payloads = open_payloads(payloads, ring)[0]
        open_s = loop.time() - t0
        out = await execute_prewarm(
            http, payloads, urls, budget_s=budget_s - open_s, per_replica=per_replica
        )
        out = out.model_copy(update={"elapsed_s": out.elapsed_s + open_s})
        returned = loop.time()
        q1, h1 = await prefilled(http, urls)  # as the executor returned
        await wait_idle(http, urls)
        q2, h2 = await prefilled(http, urls)  # once the replicas are idle
    deadline = t0 + budget_s
    rate = out.prompt_tokens / out.elapsed_s if out.elapsed_s else 0.0
    plan = assign(payloads, urls)
    tokens = [sum(payloads[i].tokens for i in idx) for idx in plan.values()]
    ideal_s = max(tokens) / (o.prefill_rate * min(per_replica, o.engine_seqs))
    fig: dict[str, object] = {
        "per_replica": per_replica,
        "budget_s": budget_s,
        "total": out.total,
        "warmed": out.warmed,
        "failed": out.failed,
        "warm_s": round(out.elapsed_s, 3),
        "attainment": round(out.attainment, 4),
        "prompt_tokens": out.prompt_tokens,
        "prefill_tokens_per_s": round(rate, 1),
        "prefill_efficiency": round(rate / o.capacity, 4),
        "ideal_warm_s": round(ideal_s, 3),  # busiest replica's tokens at its capacity
        "vs_ideal": round(ideal_s / out.elapsed_s, 4) if out.elapsed_s else None,
        "prefixes_per_replica": [len(idx) for idx in plan.values()],
        "plan_balance": round(sum(tokens) / (len(tokens) * max(tokens)), 4),
        "cache_hits_during": int(h1 - h0),  # expected 0: the prefixes share no block
        "sent": len(sends),
        "sent_after_deadline": sum(1 for t in sends if t > deadline),
        "last_send_s": round(max(sends) - t0, 3) if sends else None,
        "returned_after_deadline_ms": round((returned - deadline) * 1000, 1),
        "server_tokens_after_return": int((q2 - q1) - (h2 - h1)),
        "sealed": ring is not None,
        "open_s": round(open_s, 6),
    }
    if out.detail:
        fig["detail"] = out.detail[:300]
    say.progress(
        f"  per_replica {per_replica}, budget {budget_s:.2f} s: {out.warmed}/{out.total} "
        f"warm in {out.elapsed_s:.2f} s, {rate:,.0f} tokens/s"
    )
    return fig


async def first_request(http: aiohttp.ClientSession, url: str, prompt: str) -> tuple[float, int]:
    """Time to the first content chunk of a streaming completion; its prompt tokens."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    got = await streamed_completion(http, url, body)
    return got.ttft_s, got.prompt_tokens


async def first_requests(
    urls: Sequence[str], payloads: Sequence[ReplayPayload], picks: Sequence[int], tag: str
) -> list[Sample]:
    """One user request per picked prefix, one at a time, where the balancer sends it."""
    balancer = ReplicaBalancer(urls)
    plan = assign(payloads, urls)
    owner = {i: r for r, idx in plan.items() for i in idx}
    out = []
    async with aiohttp.ClientSession() as http:
        for i in picks:
            p = payloads[i]
            url = balancer.choose(prefix_key(routing_text(p)))
            if url is None:
                raise BenchError("the balancer chose no replica")
            question = f"\nUser {tag}-{i}: which of these rules applies to case {i}?"
            q0, h0 = await cache_counters(http, url)
            ttft, tokens = await first_request(http, url, (p.prompt or "") + question)
            q1, h1 = await cache_counters(http, url)
            out.append(Sample(ttft, tokens, int(h1 - h0), q1 - q0 == tokens, url == owner.get(i)))
    return out


def summary(samples: Sequence[Sample]) -> dict[str, float | int | None]:
    clean = [s for s in samples if s.clean]
    ttfts = [s.ttft_s for s in samples]
    tokens = sum(s.prompt_tokens for s in clean)
    p50, p99 = percentile(ttfts, 50), percentile(ttfts, 99)
    return {
        "samples": len(samples),
        "clean": len(clean),
        "ttft_p50_s": None if p50 is None else round(p50, 5),
        "ttft_p99_s": None if p99 is None else round(p99, 5),
        "hit_rate": round(sum(s.hits for s in clean) / tokens, 4) if tokens else None,
        "routed_as_planned": sum(s.as_planned for s in samples),  # of the samples
    }


# ---- the bench --------------------------------------------------------------------------


async def measure(urls: Sequence[str], o: Options, say: Reporter) -> dict[str, object]:
    async with aiohttp.ClientSession() as http:
        say.progress(f"building {o.prefixes} payloads (sized by /tokenize)")
        payloads = await build_payloads(http, urls[0], o)
    total_tokens = sum(p.tokens for p in payloads)
    short = o.short_budget or 0.5 * total_tokens / o.capacity
    cut_plan = planned(payloads, o, short)
    cuts: list[dict[str, object]] = []
    done: dict[int, list[dict[str, object]]] = {k: [] for k in o.per_replica}
    ring = Keyring(keys={"bench-1": base64.b64decode(generate_key())}, active="bench-1")
    params = FingerprintParams(block_size=o.block_size)
    sealed = [seal_payload(p, ring, params) for p in payloads]
    sealed_runs: list[dict[str, object]] = []
    for r in range(o.rounds):
        say.progress(f"round {r + 1}/{o.rounds}: budget cut ({short:.2f} s), then the sweep")
        cut = await warm_run(
            urls, payloads, o, per_replica=AGENT_PER_REPLICA, budget_s=short, say=say
        )
        cuts.append(cut)
        say.line({"phase": "budget_cut", "round": r + 1, "planned": cut_plan, **cut})
        # alternate the order, so that drift in the machine's load hits every setting
        for k in o.per_replica if r % 2 == 0 else reversed(o.per_replica):
            fig = await warm_run(urls, payloads, o, per_replica=k, budget_s=o.budget, say=say)
            done[k].append(fig)
            say.line({"phase": "warm", "round": r + 1, **fig})
        # the agent's own setting again, the payloads sealed as with prefixes.sealed_payloads
        fig = await warm_run(
            urls, sealed, o, per_replica=AGENT_PER_REPLICA, budget_s=o.budget, say=say, ring=ring
        )
        sealed_runs.append(fig)
        say.line({"phase": "warm_sealed", "round": r + 1, **fig})
    runs = {k: median_run(figs) for k, figs in done.items()}
    sealing = sealing_figures(payloads, ring, params, sealed_runs, runs.get(AGENT_PER_REPLICA))
    step = max(1, len(payloads) // max(1, o.sample))
    picks = list(range(0, len(payloads), step))[: o.sample]
    say.progress(f"first requests, warm ({len(picks)} prefixes)")
    warm = summary(await first_requests(urls, payloads, picks, "warm"))
    say.line({"phase": "first_requests", "state": "warm", **warm})
    async with aiohttp.ClientSession() as http:
        await reset_caches(http, urls)
    say.progress("first requests, cold (after /reset_prefix_cache)")
    cold = summary(await first_requests(urls, payloads, picks, "cold"))
    say.line({"phase": "first_requests", "state": "cold", **cold})
    return {**headline(o, payloads, cut_plan, cuts, runs, warm, cold), "sealed": sealing}


def sealing_figures(
    payloads: Sequence[ReplayPayload],
    ring: Keyring,
    params: FingerprintParams,
    runs: Sequence[dict[str, object]],
    clear: dict[str, object] | None,
) -> dict[str, object]:
    """What sealing costs (docs/residency.md): the sealed runs' median beside the clear
    one at the same setting, and sealing and opening timed alone over every payload."""
    t0 = time.perf_counter()
    sealed = [seal_payload(p, ring, params) for p in payloads]
    t1 = time.perf_counter()
    open_payloads(sealed, ring)
    t2 = time.perf_counter()
    median = median_run(runs)
    clear_s = _num(clear["warm_s"]) if clear else None
    sealed_s = _num(median["warm_s"])
    return {
        "warm_s": median["warm_s"],
        "warm_s_runs": median["warm_s_runs"],
        "attainment": median["attainment"],
        "warm_s_clear": clear_s,
        "warm_s_ratio": round(sealed_s / clear_s, 4) if sealed_s and clear_s else None,
        "seal_us_per_payload": round(1e6 * (t1 - t0) / len(payloads), 1),
        "open_us_per_payload": round(1e6 * (t2 - t1) / len(payloads), 1),
        "bytes_clear": sum(len(p.model_dump_json()) for p in payloads),
        "bytes_sealed": sum(len(p.model_dump_json()) for p in sealed),
    }


def median_run(figs: Sequence[dict[str, object]]) -> dict[str, object]:
    """The run with the median ``warm_s`` (the upper one of an even count), with every
    run's ``warm_s`` added."""
    ranked = sorted(figs, key=lambda f: _num(f["warm_s"]) or 0.0)
    return {**ranked[len(ranked) // 2], "warm_s_runs": [f["warm_s"] for f in figs]}


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) else None


def headline(
    o: Options,
    payloads: Sequence[ReplayPayload],
    cut_plan: int,
    cuts: Sequence[dict[str, object]],
    runs: dict[int, dict[str, object]],
    warm: dict[str, float | int | None],
    cold: dict[str, float | int | None],
) -> dict[str, object]:
    k = AGENT_PER_REPLICA if AGENT_PER_REPLICA in runs else o.per_replica[0]
    main_run = runs[k]
    w50, c50 = warm["ttft_p50_s"], cold["ttft_p50_s"]
    ratio = w50 / c50 if w50 is not None and c50 else None
    # a cut run proves something only if it cut: otherwise "nothing late" is vacuous
    cut_runs = [c for c in cuts if (_num(c["attainment"]) or 0.0) < 1]
    late = sum(_num(c["sent_after_deadline"]) or 0.0 for c in cut_runs) if cut_runs else None
    figures: dict[str, float | None] = {
        "attainment": _num(main_run["attainment"]),
        "sent_after_deadline": late,
        "ttft_ratio": ratio,
        "hit_rate_warm": _num(warm["hit_rate"]),
    }

    def each(name: str) -> list[object]:
        return [c[name] for c in cuts]

    return {
        "bench": "prewarm",
        "replicas": o.replicas,
        "prefixes": len(payloads),
        "prefix_tokens_mean": round(sum(p.tokens for p in payloads) / len(payloads), 1),
        "capacity_tokens_per_s": o.capacity,
        "plan_balance": main_run["plan_balance"],
        "budget_s": o.budget,
        "rounds": o.rounds,
        "per_replica": k,
        "warm_s": main_run["warm_s"],
        "attainment": main_run["attainment"],
        "prefill_tokens_per_s": main_run["prefill_tokens_per_s"],
        "prefill_efficiency": main_run["prefill_efficiency"],
        "sweep": {
            str(n): {
                f: r[f]
                for f in ("warm_s", "attainment", "prefill_efficiency", "vs_ideal", "warm_s_runs")
            }
            for n, r in runs.items()
        },
        "budget_cut": {
            "budget_s": cuts[0]["budget_s"],
            "planned": cut_plan,
            "total": len(payloads),
            "warmed": each("warmed"),
            "attainment": each("attainment"),
            "sent_after_deadline": each("sent_after_deadline"),
            "returned_after_deadline_ms": each("returned_after_deadline_ms"),
            "server_tokens_after_return": each("server_tokens_after_return"),
        },
        "sent_after_deadline": None if late is None else int(late),
        "ttft_p50_warm_s": w50,
        "ttft_p50_cold_s": c50,
        "ttft_p99_warm_s": warm["ttft_p99_s"],
        "ttft_p99_cold_s": cold["ttft_p99_s"],
        "ttft_ratio": None if ratio is None else round(ratio, 4),
        "hit_rate_warm": warm["hit_rate"],
        "hit_rate_cold": cold["hit_rate"],
        "samples": warm["samples"],
        "cores": os.cpu_count(),
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
        **goals_and_met(GOALS, figures, at_least=AT_LEAST),
    }


def run_bench(o: Options, say: Reporter) -> dict[str, object]:
    started = time.monotonic()
    say.progress(
        f"starting {o.replicas} simulators ({o.prefill_rate:,.0f} prefill tokens/s, "
        f"max {o.engine_seqs} running each)"
    )
    extra = [
        "--prefill-tokens-per-s",
        str(o.prefill_rate),
        "--max-num-seqs",
        str(o.engine_seqs),
        "--num-gpu-blocks-override",
        str(o.kv_blocks),
        "--max-model-len",
        str(max(4096, 2 * o.prefix_tokens + 256)),
        "--log-level",
        "WARNING",
    ]
    procs: list[Proc] = []
    try:
        procs = start_simulators(o.replicas, block_size=o.block_size, extra_args=extra, timeout=60)
        result = asyncio.run(measure([p.url for p in procs], o, say))
    finally:
        kill_all(procs)
    result["runtime_s"] = round(time.monotonic() - started, 1)
    return result


# ---- command line -----------------------------------------------------------------------


def _counts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"a comma-separated list of counts, got {text!r}") from e
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"counts of 1 or more, got {text!r}")
    return values


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


_seconds.__name__ = "number"  # argparse: "invalid number value: 'x'"


_COUNT = at_least(1, "count")
_ARGS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("--replicas", _COUNT, "simulator replicas in the target region"),
    ("--prefixes", _COUNT, "distinct prefixes to pre-warm"),
    ("--prefix-tokens", at_least(32, "count"), "about how many tokens each prefix has"),
    ("--block-size", _COUNT, "the replicas' KV block size, 16 like GPU vLLM"),
    ("--prefill-rate", _seconds, "prefill tokens/s of one running sequence"),
    (
        "--engine-seqs",
        _COUNT,
        "the simulators' --max-num-seqs: sequences prefilled at once, "
        "each at --prefill-rate; 1 makes a replica compute-bound at that rate",
    ),
    ("--kv-blocks", _COUNT, "KV blocks per replica, enough for every prefix"),
    (
        "--per-replica",
        _counts,
        "replays in flight per replica, one run each; the headline "
        f"is the agent's default ({AGENT_PER_REPLICA}) if listed, else the first",
    ),
    ("--budget", _seconds, "pre-warm budget of the sweep's runs, seconds"),
    (
        "--rounds",
        _COUNT,
        "rounds of (a budget cut, then one run per --per-replica value, "
        "in alternating order); the sweep reports each setting's median run",
    ),
    ("--short-budget", _seconds, "budget of the budget-cut runs, seconds"),
    ("--sample", _COUNT, "prefixes whose first user request is timed, warm and cold"),
    ("--seed", int, "seed of the prefixes' text"),
)


def _shown(value: object) -> str:
    if value is None:
        return "half of what all the prefixes need at the configured capacity"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return f"{value:,g}" if isinstance(value, float) else f"{value:,}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Options()
    for flag, kind, text in _ARGS:
        default = getattr(d, flag[2:].replace("-", "_"))
        metavar = "N[,N...]" if kind is _counts else None
        p.add_argument(
            flag,
            type=kind,
            default=default,
            metavar=metavar,
            help=f"{text} (default {_shown(default)})",
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
    except (BenchError, RuntimeError, aiohttp.ClientError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0
