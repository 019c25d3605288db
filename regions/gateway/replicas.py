"""Replica choice inside a region: prefix-aware consistent hashing with bounded load.

vLLM's prefix cache lives in each replica, so requests that share a prompt prefix
should land on the same replica (a hit saves the whole prefill). A consistent-hash
ring keyed by a hash of the prompt's first characters gives that, and adding or
removing a replica moves only about 1/n of the keys. Pure hashing alone would let
one hot prefix swamp a replica, so the choice is bounded (Mirrokni, Thorup and
Zadimoghaddam, "Consistent Hashing with Bounded Loads"): a replica takes a new
request only while its in-flight count is below ``ceil(c x (total + 1) / n)``;
otherwise the request spills to the next replica clockwise, so a prefix keeps its
replica unless that replica is overloaded, and then moves to a stable second choice.

Everything here is pure and synchronous (no I/O, no clock): the proxy tells the
balancer when a request starts and ends, and passes ``now`` for passive ejection.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from controlplane.kernel.ring import (
    DEFAULT_VNODES,
    HashRing,
)

DEFAULT_LOAD_FACTOR = 1.25


class ReplicaBalancer:
    """Bounded-load choice over one region's replicas, with in-flight counts and
    passive ejection of replicas that just failed to connect."""

    def __init__(
        self,
        replicas: Sequence[str],
        *,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        vnodes: int = DEFAULT_VNODES,
    ) -> None:
        if load_factor < 1.0:
            raise ValueError(f"load_factor must be at least 1, got {load_factor}")
        self.ring = HashRing.build(replicas, vnodes)
        self.load_factor = load_factor
        self._inflight = dict.fromkeys(self.ring.replicas, 0)
        self._total = 0
        self._down_until: dict[str, float] = {}

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.ring.replicas

    @property
    def inflight(self) -> Mapping[str, int]:
        return self._inflight

    def capacity(self) -> int:
        """The most in-flight requests a replica may hold when taking one more."""
        n = len(self._inflight)
        return math.ceil(self.load_factor * (self._total + 1) / n) if n else 0

    def choose(self, key: int, *, now: float = 0.0, exclude: Collection[str] = ()) -> str | None:
        """The replica for ``key``: the first in ring order under the load bound, skipping
        ``exclude`` and ejected replicas. If every eligible replica is at the bound (only
        possible when some are excluded), the least loaded eligible one; if all are
        ejected, ejection is ignored (a guess beats a refusal). None if none is left."""
        cap = self.capacity()
        down = self._down_until
        for r in self.ring.walk(key):  # the common case: the first candidate takes it
            if r not in exclude and self._inflight[r] < cap and down.get(r, 0.0) <= now:
                return r
        eligible = [r for r in self.ring.walk(key) if r not in exclude]
        live = [r for r in eligible if down.get(r, 0.0) <= now]
        if not live:  # every eligible replica is ejected: ignore ejection
            return next(
                (r for r in eligible if self._inflight[r] < cap),
                min(eligible, key=lambda r: self._inflight[r], default=None),
            )
        return min(live, key=lambda r: self._inflight[r])

    def acquire(self, replica: str) -> None:
        self._inflight[replica] += 1
        self._total += 1

    def release(self, replica: str) -> None:
        if self._inflight[replica] > 0:
            self._inflight[replica] -= 1
            self._total -= 1

    def eject(self, replica: str, until: float) -> None:
        """Skip ``replica`` until ``until`` (it refused a connection): the next requests
        go straight to the next replica instead of paying a failed connect each."""
        self._down_until[replica] = until

    def readmit(self, replica: str) -> None:
        self._down_until.pop(replica, None)
