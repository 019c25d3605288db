"""The recovery bench's setting and workload: its regions and options, one record per
request, and the load: tenants' long system prompts, Poisson session arrivals through
the gateway (``Load``), and the direct warm-up of replicas (``touch``).

The bench itself (deployment, phases, command line) is bench/recovery.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from bench._common import BenchError
from bench._stream import streamed_completion

HOME, TARGET = "us-east", "us-west"
MODEL = "tiny"


@dataclass(frozen=True)
class Options:
    rounds: int = 3
    tenants: int = 200
    zipf: float = 1.0
    prompt_tokens: int = 2000
    sessions_per_s: float = 12.0
    turns: int = 3
    think_s: float = 0.5
    max_tokens: int = 4
    replicas: int = 2  # per region
    engine_seqs: int = 2
    prefill_rate: float = 20_000.0
    decode_rate: float = 1_000.0
    kv_blocks: int = 32_768
    step_percent: int = 10
    step_interval: float = 10.0  # the control plane's default
    steady_s: float = 10.0
    failover_s: float = 4.0
    seed: int = 1
    prewarm: str = "catalog"  # before the graduated recovery: catalog | all | none
    cold_arm: bool = False
    warm_first: bool = True  # the gateway's (regions/gateway/warmth.py)
    quiet: bool = False

    @property
    def steps(self) -> int:
        return math.ceil(100 / self.step_percent)

    @property
    def window_s(self) -> float:
        return self.steps * self.step_interval


@dataclass(frozen=True)
class Rec:
    sent: float  # monotonic
    ttft_s: float | None  # None: failed
    region: str
    cold: bool  # fewer than half the prompt's tokens hit the prefix cache
    tenant: int = -1


# ---- the workload -----------------------------------------------------------------------


def system_prompt(i: int, words: int, seed: int) -> str:
    """Tenant ``i``'s system prompt: distinct from its first characters (so tenants spread
    over the gateway's ring), words of 1-4 letters (one simulator token each)."""
    rng = random.Random(seed * 1_000_003 + i)
    body = " ".join(
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 4))) for _ in range(words)
    )
    return f"{i:05d} tenant system prompt: {body}"


def body_for(prompt: str, o: Options) -> dict[str, object]:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": o.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def completion(
    http: aiohttp.ClientSession, url: str, body: dict[str, object], headers: dict[str, str]
) -> tuple[float, str, int, int]:
    """(TTFT, serving region, prompt tokens, cached tokens) of one streaming completion."""
    got = await streamed_completion(http, url, body, headers)
    return got.ttft_s, got.region, got.prompt_tokens, got.cached_tokens


@dataclass
class Load:
    """Poisson session arrivals through the gateway, until ``stop``; every request kept."""

    http: aiohttp.ClientSession
    gateway: str
    prompts: Sequence[str]
    o: Options
    rng: random.Random
    records: list[Rec] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    starts: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, tenant)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        weights = [1 / (i + 1) ** self.o.zipf for i in range(len(self.prompts))]
        n = 0
        while not stop.is_set():
            tenant = self.rng.choices(range(len(self.prompts)), weights)[0]
            self.starts.append((time.monotonic(), tenant))
            task = asyncio.create_task(self._session(f"s{self.o.seed}-{n}", tenant))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            n += 1
            with contextlib.suppress(TimeoutError):
                gap = self.rng.expovariate(self.o.sessions_per_s)
                await asyncio.wait_for(stop.wait(), gap)
        if self._tasks:
            await asyncio.wait(self._tasks)

    async def _session(self, sid: str, tenant: int) -> None:
        headers = {"x-session-id": sid}
        for turn in range(self.o.turns):
            if turn:
                await asyncio.sleep(self.o.think_s)
            prompt = f"{self.prompts[tenant]}\nUser {sid} turn {turn}: which rule applies here?"
            sent = time.monotonic()
            try:
                ttft, region, tokens, cached = await completion(
                    self.http, self.gateway, body_for(prompt, self.o), headers
                )
            except (BenchError, aiohttp.ClientError, TimeoutError) as e:
                self.failures.append(str(e)[:200])
                self.records.append(Rec(sent, None, "", False, tenant))
                continue
            self.records.append(Rec(sent, ttft, region, cached < tokens / 2, tenant))


async def touch(
    http: aiohttp.ClientSession, urls: Sequence[str], prompts: Sequence[str], o: Options
) -> None:
    """Every tenant's prompt once on each replica, directly (not recorded): warm caches,
    as a pre-warm or a long steady state leaves them."""

    async def one(url: str, mine: Sequence[str]) -> None:
        for p in mine:
            await completion(http, url, body_for(p + "\nwarm-up", o), {})

    k = o.engine_seqs  # as many at once per replica as it runs
    await asyncio.gather(*(one(u, prompts[i::k]) for u in urls for i in range(k)))
