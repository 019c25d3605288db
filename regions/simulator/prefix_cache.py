"""Prefix cache with vLLM's semantics (automatic prefix caching, V1 engine).

- A prompt is cut into blocks of ``block_size`` tokens; only full blocks are cached.
- Block identity is a chain hash: ``hash(parent_hash, block_tokens, extra_keys)``,
  where the first block's extra keys carry ``cache_salt`` (and would carry a LoRA id).
- A lookup walks the chain from the first block and stops at the first miss. Like
  vLLM it never counts the prompt's last token as a hit (one token must always be
  computed), so at most ``(num_tokens - 1) // block_size`` blocks can hit.
- Stats are in tokens: ``queries`` += prompt tokens, ``hits`` += hit blocks * size.
- Cached blocks are evicted least-recently-used when the pool is over capacity.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


def block_hashes(
    tokens: Sequence[int], block_size: int, *, cache_salt: str | None = None
) -> list[bytes]:
    """Chain hashes of the full blocks of ``tokens``."""
    hashes: list[bytes] = []
    parent = b"\x00" * 16
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size : (i + 1) * block_size]
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(",".join(map(str, block)).encode())
        if i == 0 and cache_salt:
            h.update(b"|salt:" + cache_salt.encode())
        parent = h.digest()
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class Lookup:
    queried_tokens: int
    hit_tokens: int
    hashes: tuple[bytes, ...]


class PrefixCache:
    """LRU pool of cached blocks, keyed by chain hash."""

    def __init__(self, block_size: int, capacity_blocks: int, *, enabled: bool = True) -> None:
        if block_size < 1 or capacity_blocks < 1:
            raise ValueError("block_size and capacity_blocks must be positive")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.enabled = enabled
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.queries = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, tokens: Sequence[int], *, cache_salt: str | None = None) -> Lookup:
        """Find the cached prefix of a prompt and count the query, as the scheduler does."""
        hashes = block_hashes(tokens, self.block_size, cache_salt=cache_salt)
        hit_blocks = 0
        if self.enabled:
            limit = max(len(tokens) - 1, 0) // self.block_size
            for h in hashes[:limit]:
                if h not in self._blocks:
                    break
                self._blocks.move_to_end(h)
                hit_blocks += 1
            self.queries += len(tokens)
            self.hits += hit_blocks * self.block_size
        return Lookup(len(tokens), hit_blocks * self.block_size, tuple(hashes))

    def insert(self, hashes: Sequence[bytes]) -> None:
        """Cache computed full blocks (most recent last), evicting LRU blocks."""
        if not self.enabled:
            return
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def reset(self) -> None:
        """Drop every cached block (``/reset_prefix_cache``, sleep); counters stay."""
        self._blocks.clear()
