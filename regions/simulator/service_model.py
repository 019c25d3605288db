"""The simulated engine's service time, per request, without a clock. PURE.

What :mod:`regions.simulator.engine` spends a request's simulated time on, as numbers
that a discrete-event model can use without running the engine (``bench/autoscale_sim.py``
does; so do the engine's own naps):

- **prefill**: the prompt's uncached tokens at ``prefill_tokens_per_s`` (one request's
  own rate: requests running together do not slow each other), plus any injected
  latency; it ends with the first token;
- **decode**: each further output token takes ``1 / decode_tokens_per_s``;
- **the hit effect**: a prefix-cache hit saves its tokens' prefill. vLLM caches full
  blocks only and always computes the prompt's last token
  (:mod:`regions.simulator.prefix_cache`), so a prompt of ``n`` tokens hits at most
  ``(n - 1) // block_size`` blocks; :func:`hit_tokens` is the hit a prompt gets when a
  share ``hit_rate`` of its tokens is a cached prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def prefill_s(uncached_tokens: int, prefill_tokens_per_s: float, extra_s: float = 0.0) -> float:
    """Seconds from admission to the first token: the uncached prompt tokens' prefill
    plus ``extra_s`` (injected latency)."""
    return uncached_tokens / prefill_tokens_per_s + extra_s


def decode_step_s(decode_tokens_per_s: float) -> float:
    """Seconds per output token after the first."""
    return 1.0 / decode_tokens_per_s


def decode_s(output_tokens: int, decode_tokens_per_s: float) -> float:
    """Seconds from the first token to the last of ``output_tokens``."""
    return max(0, output_tokens - 1) * decode_step_s(decode_tokens_per_s)


def hit_tokens(prompt_tokens: int, hit_rate: float, block_size: int) -> int:
    """The prefix-cache hit of a prompt whose leading ``hit_rate`` share is cached: whole
    blocks only, never the last token."""
    wanted = math.floor(max(0.0, min(1.0, hit_rate)) * prompt_tokens / block_size)
    limit = max(prompt_tokens - 1, 0) // block_size
    return min(wanted, limit) * block_size


@dataclass(frozen=True, slots=True)
class ServiceTime:
    """One request's time on the engine once admitted."""

    prefill_s: float  # admission -> first token
    decode_s: float  # first token -> last

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


def service_time(
    prompt_tokens: int,
    cached_tokens: int,
    output_tokens: int,
    *,
    prefill_tokens_per_s: float,
    decode_tokens_per_s: float,
) -> ServiceTime:
    """A request's prefill and decode time on an engine of these rates."""
    return ServiceTime(
        prefill_s=prefill_s(prompt_tokens - cached_tokens, prefill_tokens_per_s),
        decode_s=decode_s(output_tokens, decode_tokens_per_s),
    )
