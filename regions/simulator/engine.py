"""The simulated engine: a scheduler with a waiting queue and a latency model.

- At most ``max_num_seqs`` requests run; the rest wait in FIFO order (vLLM's
  ``num_requests_running`` / ``num_requests_waiting``). A sleeping engine admits
  nothing, like vLLM's paused scheduler.
- On admission the prefix cache is queried; prefill takes
  ``uncached_tokens / prefill_tokens_per_s`` (plus any injected latency), then
  each output token takes ``1 / decode_tokens_per_s``.
- Full blocks are cached after prefill (prompt) and at the end (prompt + output).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from regions.simulator.metrics import EngineStats, Snapshot, render_metrics
from regions.simulator.prefix_cache import PrefixCache, block_hashes
from regions.simulator.tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineConfig:
    model: str = "tiny"
    block_size: int = 16
    num_blocks: int = 4096
    max_num_seqs: int = 8
    max_model_len: int = 4096
    prefill_tokens_per_s: float = 20_000.0
    decode_tokens_per_s: float = 200.0
    enable_prefix_caching: bool = True
    seed: int = 0


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    finish_reason: str  # what ends the output when all max_tokens are produced
    cache_salt: str | None = None
    extra_prefill_s: float = 0.0  # injected latency before the first token


@dataclass(frozen=True)
class Token:
    text: str
    token_id: int
    finish_reason: str | None  # set on the last token
    cached_tokens: int  # prefix-cache hit tokens of this request's prompt


@dataclass
class _Running:
    tokens: int


@dataclass
class Engine:
    config: EngineConfig
    tokenizer: Tokenizer = field(default_factory=Tokenizer)
    stats: EngineStats = field(default_factory=EngineStats)
    sleep_level: int = 0

    def __post_init__(self) -> None:
        self.cache = PrefixCache(
            self.config.block_size, self.config.num_blocks,
            enabled=self.config.enable_prefix_caching,
        )
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._running: dict[int, _Running] = {}
        self._tickets = itertools.count()

    # -- admin ---------------------------------------------------------------
    def sleep(self, level: int) -> None:
        self.sleep_level = max(1, min(level, 2))
        self.cache.reset()

    def wake_up(self) -> None:
        self.sleep_level = 0
        self._dispatch()

    def reset_prefix_cache(self) -> None:
        self.cache.reset()

    # -- observation ---------------------------------------------------------
    def snapshot(self) -> Snapshot:
        used = sum(math.ceil(r.tokens / self.config.block_size) for r in self._running.values())
        c = self.config
        info = {
            "block_size": str(c.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(c.enable_prefix_caching),
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(c.num_blocks),
            "prefix_caching_hash_algo": "sha256",
        }
        return Snapshot(
            running=len(self._running), waiting=len(self._waiters),
            kv_cache_usage=min(used / c.num_blocks, 1.0),
            prefix_queries=self.cache.queries, prefix_hits=self.cache.hits,
            sleep_level=self.sleep_level, cache_info=info,
        )

    def metrics_text(self) -> str:
        return render_metrics(self.config.model, self.stats, self.snapshot())

    # -- generation ----------------------------------------------------------
    def _dispatch(self) -> None:
        """Admit waiting requests in FIFO order while there is room and we are awake."""
        while (
            self.sleep_level == 0
            and self._waiters
            and len(self._running) < self.config.max_num_seqs
        ):
            ticket, fut = self._waiters.popleft()
            if not fut.done():
                self._running[ticket] = _Running(0)
                fut.set_result(None)

    async def _admit(self, ticket: int) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((ticket, fut))
        self._dispatch()
        try:
            await fut
        except BaseException:
            if (ticket, fut) in self._waiters:
                self._waiters.remove((ticket, fut))
            self._release(ticket)
            raise

    def _release(self, ticket: int) -> None:
        self._running.pop(ticket, None)
        self._dispatch()

    async def generate(self, req: GenRequest) -> AsyncGenerator[Token]:
        """Yield the request's output tokens with the simulated timing."""
        c = self.config
        arrival = time.monotonic()
        ticket = next(self._tickets)
        await self._admit(ticket)
        finished = "abort"
        try:
            self.stats.queue_time.observe(time.monotonic() - arrival)
            prompt = req.prompt_ids
            running = self._running[ticket]
            running.tokens = len(prompt)
            hit = self.cache.lookup(prompt, cache_salt=req.cache_salt)
            await asyncio.sleep(
                (len(prompt) - hit.hit_tokens) / c.prefill_tokens_per_s + req.extra_prefill_s
            )
            self.cache.insert(hit.hashes)
            self.stats.prompt_tokens += len(prompt)
            pieces = self.tokenizer.generate(prompt, req.max_tokens, seed=c.seed)
            ids = self.tokenizer.piece_ids(pieces)
            for i, (piece, tid) in enumerate(zip(pieces, ids, strict=True)):
                if i == 0:
                    self.stats.ttft.observe(time.monotonic() - arrival)
                else:
                    await asyncio.sleep(1.0 / c.decode_tokens_per_s)
                running.tokens += 1
                self.stats.generation_tokens += 1
                last = i == len(pieces) - 1
                if last:
                    finished = req.finish_reason
                    self._cache_sequence(prompt, ids, req.cache_salt)
                yield Token(piece, tid, req.finish_reason if last else None, hit.hit_tokens)
        finally:
            self.stats.finished[finished] = self.stats.finished.get(finished, 0) + 1
            self.stats.e2e.observe(time.monotonic() - arrival)
            self._release(ticket)

    def _cache_sequence(
        self, prompt: Sequence[int], output: Sequence[int], salt: str | None
    ) -> None:
        self.cache.insert(block_hashes([*prompt, *output], self.config.block_size, cache_salt=salt))
