"""Whether a replica still holds a prefix in its cache, as far as the gateway can tell.

A replica's prefix cache evicts the least recently used blocks, so a prefix sent to it
is still cached while fewer than its cache's capacity of other prefixes went there
since: the prefix's *rank* (its LRU stack distance in what we sent). The capacity, in
prefixes, is not known to the gateway; the replica's hit rate shows it: if a share h of
its prompt tokens hit, about a share h of the requests sent there had a rank below the
capacity, so the capacity is the h-quantile of the ranks of the requests sent since its
last report (a prefix sent there for the first time has an infinite rank). Reports
with fewer than ``MIN_RANKS`` requests sent since add up: their ranks are kept and
their hit shares averaged, weighted by the requests each covered, until there are.

The replica balancer asks ``likely_cached`` before it lets a request wait for its full
owner: a wait for a replica that then computes the whole prompt anyway costs twice.
Pure, no I/O; bounded memory (``track`` prefixes per replica).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

TRACK = 1024  # prefixes remembered per replica (ranks past it count as never sent)
MIN_RANKS = 8  # requests to learn from: fewer say too little about the capacity
MAX_RANKS = 4096  # kept between two reports (none may come: no poller), the latest
SMOOTHING = 0.3  # EWMA weight of the newest estimate


class SentKeys:
    """The prefix keys sent to one replica, most recent last, and its cache capacity in
    prefixes as learned from its hit rate (``learn``)."""

    def __init__(self, track: int = TRACK) -> None:
        self._keys: OrderedDict[int, None] = OrderedDict()
        self._track = track
        # of the requests sent since the capacity was last learned
        self._ranks: deque[float] = deque(maxlen=MAX_RANKS)
        self._reported = 0  # of those ranks, how many reports' hit shares cover
        self._hits = 0.0  # sum over reports of hit share x the ranks it covers
        self.capacity: float | None = None

    def rank(self, key: int) -> float:
        """How many other prefixes were sent since ``key`` last was (inf: never, or too
        long ago to tell)."""
        for n, k in enumerate(reversed(self._keys)):
            if k == key:
                return float(n)
        return math.inf

    def sent(self, key: int) -> None:
        self._ranks.append(self.rank(key))
        self._keys[key] = None
        self._keys.move_to_end(key)
        if len(self._keys) > self._track:
            self._keys.popitem(last=False)

    def learn(self, hit_share: float) -> None:
        """The replica's prompt tokens hit at ``hit_share`` since its last report: its
        capacity is the rank below which that share of our requests there fell."""
        if not 0.0 <= hit_share <= 1.0:
            return
        covered = len(self._ranks) - self._reported  # sent since the last report
        self._hits += hit_share * max(0, covered)
        self._reported = len(self._ranks)
        if len(self._ranks) < MIN_RANKS:
            return  # too few yet: this report's requests and share wait for more
        ranks = sorted(self._ranks)
        share = min(1.0, self._hits / len(ranks))
        self._ranks.clear()
        self._reported, self._hits = 0, 0.0
        below = round(share * len(ranks))  # that many were hits
        if below == 0:
            estimate = 0.0
        else:
            top_hit = ranks[below - 1]
            if math.isinf(top_hit):  # more hits than prefixes we sent before: others'
                return
            estimate = top_hit + 1.0
        old = self.capacity
        self.capacity = estimate if old is None else old + SMOOTHING * (estimate - old)

    def likely_cached(self, key: int) -> bool:
        """``key`` was sent here, and fewer prefixes since than the cache holds."""
        return self.capacity is not None and self.rank(key) < self.capacity
