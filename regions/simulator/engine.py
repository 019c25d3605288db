"""The simulated engine: a scheduler with a waiting queue and a latency model.

- Admission, the waiting queue and pausing are the :class:`Scheduler`'s; a sleeping
  engine admits nothing, like vLLM's paused scheduler, and by default (``mode="abort"``)
  ends the requests it holds with ``finish_reason: "abort"``.
- On admission the prefix cache is queried; prefill takes
  ``uncached_tokens / prefill_tokens_per_s`` (plus any injected latency), then
  each output token takes ``1 / decode_tokens_per_s`` (the arithmetic is
  :mod:`regions.simulator.service_model`'s, which discrete-event models share).
- Full blocks are cached after prefill (prompt) and at the end (prompt + output).
- Sleep levels and wake-up tags follow vLLM: level 0 only pauses scheduling; levels 1
  and 2 also drop the prefix cache and put the ``weights`` and ``kv_cache`` tags to
  sleep; the engine is awake again once no tag sleeps.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass, field

from regions.simulator.metrics import EngineStats, Snapshot, render_metrics
from regions.simulator.prefix_cache import PrefixCache, block_hashes
from regions.simulator.scheduler import PauseMode, Scheduler
from regions.simulator.service_model import decode_step_s, prefill_s
from regions.simulator.tokenizer import Tokenizer

SLEEP_TAGS = frozenset({"weights", "kv_cache"})  # what sleep levels 1 and 2 offload


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
    prompt_ids: tuple[int, ...]  # what the prefix cache and the usage count
    prompt_text: str  # what the simulated model continues (see tokenizer.py)
    max_tokens: int
    finish_reason: str  # what ends the output when all max_tokens are produced
    cache_salt: str | None = None
    extra_prefill_s: float = 0.0  # injected latency before the first token


@dataclass(frozen=True)
class Token:
    text: str
    token_id: int | None  # None: no token, only the finish_reason (an abort)
    finish_reason: str | None  # set on the last token
    cached_tokens: int  # prefix-cache hit tokens of this request's prompt


def generated(tokens: Iterable[Token]) -> int:
    """How many output tokens ``tokens`` hold (an abort marker is none)."""
    return sum(t.token_id is not None for t in tokens)


@dataclass
class Engine:
    config: EngineConfig
    tokenizer: Tokenizer = field(default_factory=Tokenizer)
    stats: EngineStats = field(default_factory=EngineStats)
    sleep_level: int | None = None  # None while awake

    def __post_init__(self) -> None:
        self.cache = PrefixCache(
            self.config.block_size,
            self.config.num_blocks,
            enabled=self.config.enable_prefix_caching,
        )
        self.scheduler = Scheduler(self.config.max_num_seqs)
        self._asleep_tags: set[str] = set()

    # -- admin ---------------------------------------------------------------
    @property
    def sleeping(self) -> bool:
        return self.scheduler.paused

    async def sleep(self, level: int, mode: PauseMode = "abort") -> None:
        """vLLM's ``/sleep``: pause (handling running requests per ``mode``), then sleep."""
        self.scheduler.pause(mode)
        if mode == "wait":
            await self.scheduler.drained()
            if not self.scheduler.paused:
                return  # woken up while draining
        if level >= 1:
            self.cache.reset()
            self._asleep_tags = set(SLEEP_TAGS)
        self.sleep_level = level

    def wake_up(self, tags: Sequence[str] | None = None) -> bool:
        """Wake ``tags`` (all when None); True once fully awake and scheduling again."""
        if tags is None:
            self._asleep_tags.clear()
        else:
            self._asleep_tags.difference_update(tags)
        if self._asleep_tags:
            return False
        self.sleep_level = None
        self.scheduler.resume()
        return True

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Drop the cached blocks; like vLLM it fails while running requests hold blocks
        unless ``reset_running_requests`` (which vLLM preempts; here they run on)."""
        if self.scheduler.running and not reset_running_requests:
            return False
        self.cache.reset()
        return True

    # -- observation ---------------------------------------------------------
    def snapshot(self) -> Snapshot:
        c = self.config
        running = self.scheduler.running.values()
        used = sum(math.ceil(r.tokens / c.block_size) for r in running)
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
            running=len(running),
            waiting=self.scheduler.num_waiting,
            kv_cache_usage=min(used / c.num_blocks, 1.0),
            prefix_queries=self.cache.queries,
            prefix_hits=self.cache.hits,
            sleep_level=self.sleep_level,
            cache_info=info,
        )

    def metrics_text(self) -> str:
        return render_metrics(self.config.model, self.stats, self.snapshot())

    # -- generation ----------------------------------------------------------
    async def generate(self, req: GenRequest) -> AsyncGenerator[Token]:
        """Yield the request's output tokens with the simulated timing. An aborted
        request ends with a token-less ``Token`` whose finish_reason is "abort"."""
        c = self.config
        arrival = time.monotonic()
        seq = await self.scheduler.admit()
        finished = "abort"
        hit_tokens = 0
        try:
            if seq.aborted:
                yield Token("", None, "abort", 0)
                return
            self.stats.queue_time.observe(time.monotonic() - arrival)
            prompt = req.prompt_ids
            seq.tokens = len(prompt)
            hit = self.cache.lookup(prompt, cache_salt=req.cache_salt)
            hit_tokens = hit.hit_tokens
            prefill = prefill_s(
                len(prompt) - hit_tokens, c.prefill_tokens_per_s, req.extra_prefill_s
            )
            if not await self.scheduler.nap(seq, prefill):
                yield Token("", None, "abort", hit_tokens)
                return
            self.cache.insert(hit.hashes)
            self.stats.prompt_tokens += len(prompt)
            pieces = self.tokenizer.generate(req.prompt_text, req.max_tokens, seed=c.seed)
            ids = self.tokenizer.piece_ids(pieces)
            for i, (piece, tid) in enumerate(zip(pieces, ids, strict=True)):
                if i == 0:
                    self.stats.ttft.observe(time.monotonic() - arrival)
                elif not await self.scheduler.nap(seq, decode_step_s(c.decode_tokens_per_s)):
                    yield Token("", None, "abort", hit_tokens)
                    return
                seq.tokens += 1
                self.stats.generation_tokens += 1
                last = i == len(pieces) - 1
                if last:
                    finished = req.finish_reason
                    self._cache_sequence(prompt, ids, req.cache_salt)
                yield Token(piece, tid, req.finish_reason if last else None, hit_tokens)
        finally:
            self.stats.finished[finished] = self.stats.finished.get(finished, 0) + 1
            self.stats.e2e.observe(time.monotonic() - arrival)
            self.scheduler.release(seq)

    def _cache_sequence(
        self, prompt: Sequence[int], output: Sequence[int], salt: str | None
    ) -> None:
        self.cache.insert(block_hashes([*prompt, *output], self.config.block_size, cache_salt=salt))
