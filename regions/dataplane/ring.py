"""The consistent-hash ring that says which replica of a region owns a prompt prefix.

The gateways route by it and the region agent pre-warms by it: both must build the
same ring from the same replicas and hash the same characters (``prefixes.routing_chars``
in the topology), or a pre-warm warms a replica the traffic never reaches.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

DEFAULT_PREFIX_CHARS = 256  # ~64 tokens: long enough to tell prompts apart, short
# enough that conversations sharing a system prompt share a replica.
DEFAULT_VNODES = 100  # virtual nodes per replica: load spread within a few percent


def hash64(data: bytes) -> int:
    """A stable 64-bit hash (not Python's ``hash``, which is salted per process, so two
    gateways would disagree on where a prefix lives)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def prefix_key(prefix: str, chars: int = DEFAULT_PREFIX_CHARS) -> int:
    """The ring key of a prompt: a hash of its first ``chars`` characters."""
    return hash64(prefix[:chars].encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class HashRing:
    """A ring of ``vnodes`` points per replica; a key is owned by the first point at or
    after it (wrapping)."""

    replicas: tuple[str, ...]
    points: tuple[int, ...]
    owners: tuple[str, ...]

    @classmethod
    def build(cls, replicas: Sequence[str], vnodes: int = DEFAULT_VNODES) -> HashRing:
        if vnodes < 1:
            raise ValueError(f"vnodes must be at least 1, got {vnodes}")
        unique = tuple(dict.fromkeys(replicas))
        ring = sorted((hash64(f"{r}#{i}".encode()), r) for r in unique for i in range(vnodes))
        return cls(unique, tuple(p for p, _ in ring), tuple(r for _, r in ring))

    def walk(self, key: int) -> Iterator[str]:
        """Every replica once, in ring order from ``key``'s owner onwards."""
        n = len(self.points)
        if n == 0:
            return
        start = bisect.bisect_left(self.points, key)
        seen: set[str] = set()
        for i in range(n):
            owner = self.owners[(start + i) % n]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self.replicas):
                    return

    def owner(self, key: int) -> str | None:
        return next(self.walk(key), None)
