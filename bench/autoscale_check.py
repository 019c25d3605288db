"""``model_error``: the autoscale bench's discrete-event model against real simulators.

A small ramp (``seconds`` long: the load from ``load_from`` to ``load_to`` of the
pool's saturation, the hit rate from ``hit_from`` to ``hit_to``, as in the reference
ramp) on ``replicas`` real simulator processes (``python -m regions.simulator``, the
bench's engine flags), and the model on the very same arrivals and settings:

- the model runs first, a pool of ``replicas`` ACTIVE, and routes each request (join
  the shortest queue); the real run sends each request to the process the model chose,
  so that the two differ only in what the model is meant to predict: the queues and
  the engine's timing;
- each request's prompt has the length the model drew and a leading shared part of
  exactly the hit the model counts (``service_model.hit_tokens``): words of one shared
  text, then words of its own; every process is first sent the whole shared text once
  (not measured), so that the shared part is cached as the model assumes;
- ``model_error`` = the larger of the relative errors of the first-token p99 (all
  requests) and of the throughput (requests done within the ramp's seconds).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import string
from dataclasses import dataclass

import numpy as np

from bench._common import BenchError, Reporter, kill_all, percentile
from bench.autoscale_sim import (
    ACTIVE,
    Arrivals,
    EngineSpec,
    Lifecycle,
    Scenario,
    Sim,
    make_arrivals,
)
from chaos.capacity.load import LoadGenerator, Planned
from chaos.lab.procs import Proc, start_simulators
from regions.simulator import service_model

TEMPLATE_TOKENS = 8  # BOS + the chat template around the content (tokenizer.py)
SHARED_LEAD = 3  # of them before the content: BOS, "<|us", "er|>"


@dataclass(frozen=True, slots=True)
class CheckOptions:
    replicas: int = 2
    seconds: float = 40.0
    load_from: float = 0.3  # of the pool's saturation at the hit rate then
    load_to: float = 0.85
    hit_from: float = 0.65
    hit_to: float = 0.83
    seed: int = 5


def saturation_rps(engine: EngineSpec, hit: float) -> float:
    """What one replica serves at most: slots / the mix's mean service time."""
    prompts = engine.prompts((np.arange(2048) + 0.5) / 2048)
    return engine.slots / float(np.mean([engine.service(p, hit).total_s for p in prompts]))


def ramp(engine: EngineSpec, o: CheckOptions) -> Scenario:
    n = o.replicas
    start = o.load_from * n * saturation_rps(engine, o.hit_from)
    end = o.load_to * n * saturation_rps(engine, o.hit_to)
    return Scenario("check", ((0.0, start, o.hit_from), (o.seconds, end, o.hit_to)), o.seconds)


def _word(i: int, lead: str) -> str:
    letters = string.ascii_lowercase
    return lead + letters[i // 676 % 26] + letters[i // 26 % 26] + letters[i % 26]


def contents(arr: Arrivals, engine: EngineSpec, seed: int) -> tuple[list[str], str]:
    """Each request's message (its prompt as long as the model drew, its leading hit
    tokens from the shared text) and the warm-up message (the whole shared text)."""
    rng = random.Random(seed)
    shared_words: list[int] = []
    for p, h in zip(arr.prompt, arr.hit, strict=True):
        hit = service_model.hit_tokens(p, h, engine.block_size)
        shared_words.append(min(p - TEMPLATE_TOKENS, max(0, hit - SHARED_LEAD)))
    longest = max(shared_words, default=0) + engine.block_size
    shared = [_word(i, "s") for i in range(longest)]
    out = []
    for p, s in zip(arr.prompt, shared_words, strict=True):
        own = [_word(rng.randrange(17_576), "t") for _ in range(p - TEMPLATE_TOKENS - s)]
        out.append(" ".join(shared[:s] + own))
    return out, " ".join(shared)


def _body(model: str, content: str, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


async def _real(
    urls: list[str], arr: Arrivals, routed: np.ndarray, engine: EngineSpec, seed: int
) -> list[tuple[float | None, float | None, int | None]]:
    """(first-token time, done time, cached tokens) of each request on the processes."""
    messages, warm = contents(arr, engine, seed)
    async with LoadGenerator(120.0) as gen:
        async with gen.http.get(urls[0] + "/v1/models") as r:
            model = str((await r.json(content_type=None))["data"][0]["id"])
        tag = secrets.token_hex(3)  # a fresh own part for the warm-up: never a hit
        warmup = [Planned(0.0, u, _body(model, f"{warm} w{tag}", 1), 0) for u in urls]
        if not all(x.ok for x in await gen.run(warmup)):
            raise BenchError("the model check's warm-up request failed")
        plan = [
            Planned(t, urls[int(k)], _body(model, m, engine.output_tokens), p)
            for t, k, m, p in zip(arr.at, routed, messages, arr.prompt, strict=True)
        ]
        results = await gen.run(plan)
    return [
        (r.ttft_s if r.ok else None, r.done_s if r.ok else None, r.cached_tokens) for r in results
    ]


def sim_flags(engine: EngineSpec) -> list[str]:
    return [
        "--max-num-seqs", str(engine.slots),
        "--prefill-tokens-per-s", str(engine.prefill_tokens_per_s),
        "--decode-tokens-per-s", str(engine.decode_tokens_per_s),
        "--num-gpu-blocks-override", "200000",
        "--max-model-len", str(engine.max_prompt + 4 * engine.output_tokens + 64),
        "--enable-prompt-tokens-details",
        "--log-level", "WARNING",
    ]  # fmt: skip


def check(engine: EngineSpec, o: CheckOptions, say: Reporter) -> dict[str, object]:
    """Run the model and the processes on the same small ramp; their figures."""
    scenario = ramp(engine, o)
    arr = make_arrivals(scenario, engine, start_s=0.0, seed=o.seed)
    sim = Sim(
        engine, Lifecycle(), arr, start_s=0.0, end_s=o.seconds, launches=[1.0],
        hit_rate=scenario.hit,
    )  # fmt: skip
    for _ in range(o.replicas):
        sim.place(ACTIVE)
    sim.run([])
    say.progress(
        f"model check: {o.replicas} simulators, {len(arr)} requests over {o.seconds:g} s "
        f"({scenario.rate(0):.1f} -> {scenario.rate(o.seconds):.1f} requests/s)"
    )
    procs: list[Proc] = start_simulators(
        o.replicas, block_size=engine.block_size, extra_args=sim_flags(engine)
    )
    try:
        real = asyncio.run(_real([p.url for p in procs], arr, sim.routed, engine, o.seed))
    finally:
        kill_all(procs)
    return figures(sim, arr, real, o, scenario)


def figures(
    sim: Sim,
    arr: Arrivals,
    real: list[tuple[float | None, float | None, int | None]],
    o: CheckOptions,
    scenario: Scenario,
) -> dict[str, object]:
    ttft_real = [t for t, _, _ in real if t is not None]
    if len(ttft_real) < 0.9 * len(real):
        raise BenchError(f"the model check served {len(ttft_real)} of {len(real)} requests")
    p99_real = percentile(ttft_real, 99) or 0.0
    p99_model = float(np.percentile(sim.ttft, 99))
    done_real = sum(1 for _, d, _ in real if d is not None and d <= o.seconds) / o.seconds
    done_model = float(np.count_nonzero(sim.done <= o.seconds)) / o.seconds
    cached = [c for _, _, c in real if c is not None]
    modelled = [
        service_model.hit_tokens(p, h, sim.engine.block_size)
        for p, h in zip(arr.prompt, arr.hit, strict=True)
    ]
    p99_error = abs(p99_real - p99_model) / p99_model
    rps_error = abs(done_real - done_model) / done_model
    return {
        "replicas": o.replicas,
        "seconds": o.seconds,
        "requests": len(real),
        "rate_rps": [round(scenario.rate(0), 2), round(scenario.rate(o.seconds), 2)],
        "hit_rate": [o.hit_from, o.hit_to],
        "ttft_p99_s": {"processes": round(p99_real, 4), "model": round(p99_model, 4)},
        "ttft_p50_s": {
            "processes": round(percentile(ttft_real, 50) or 0.0, 4),
            "model": round(float(np.percentile(sim.ttft, 50)), 4),
        },
        "throughput_rps": {"processes": round(done_real, 3), "model": round(done_model, 3)},
        "ttft_p99_error": round(p99_error, 4),
        "throughput_error": round(rps_error, 4),
        "cached_tokens_over_model": round(sum(cached) / max(1, sum(modelled)), 4),
        "served": round(len(ttft_real) / len(real), 4),
        "model_error": round(max(p99_error, rps_error), 4),
    }
