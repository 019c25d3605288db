"""What a request costs on a replica, from the replica's own cumulative counters: how
long it holds a slot, and how much first-token time a prefix hit there saves.

The replica balancer (``replicas.py``) weighs these two when a request's prefix owner
is full and another replica has a free slot: waiting for the owner's next free slot
costs about the rest of its oldest request's hold; spilling costs the prefill the
owner's cache would have saved. Both come from vLLM's ``/metrics`` (the simulator
writes the same families), read every poll by ``replica_load.py``:

* hold = mean ``e2e_request_latency`` less ``request_queue_time`` of the requests
  that ended since the last poll (the time in a slot, not in the engine's queue);
* prefill seconds per computed token = (``time_to_first_token`` - ``request_queue_time``)
  / (prompt tokens queried - tokens hit), over the same requests;
* hit saving = tokens hit per request there x seconds per token: what a request that
  lands where its prefix lives is seen to save (a spilled request is taken to miss,
  as the ring keeps each prefix on its owner);
* hit share = tokens hit / tokens queried over the same requests (not smoothed): what
  ``replica_cache.py`` learns the cache's capacity from.

"Since the last poll" is a window: it closes at the first poll at which at least
``MIN_REQUESTS`` requests ended and had their first token, and until then the counts
add up (a replica ending two requests a second, polled every second, would otherwise
never say anything). Each window's figures are smoothed (EWMA); pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.kernel.vllm.metrics import PREFIX_HITS, PREFIX_QUERIES

E2E = "vllm:e2e_request_latency_seconds"
QUEUE = "vllm:request_queue_time_seconds"
TTFT = "vllm:time_to_first_token_seconds"
COST_METRICS = frozenset(
    {
        PREFIX_HITS,
        PREFIX_QUERIES,
        f"{E2E}_sum",
        f"{E2E}_count",
        f"{QUEUE}_sum",
        f"{TTFT}_sum",
        f"{TTFT}_count",
    }
)
MIN_REQUESTS = 4  # ended in one window: fewer say too little about a mean
MIN_COMPUTED_TOKENS = 256  # computed in one window: fewer, and fixed costs dominate
SMOOTHING = 0.3  # EWMA weight of the newest window


@dataclass(frozen=True)
class Costs:
    hold_s: float  # how long a request holds its slot
    hit_saving_s: float  # first-token time a request saves where its prefix is cached
    # prompt tokens hit over the window that just closed; None: none closed, or none asked
    hit_share: float | None = None


class CostEstimator:
    """One replica's costs, fed its counters poll by poll (``update``)."""

    def __init__(self) -> None:
        self._since: dict[str, float] | None = None  # the counters the window opened at
        self._hold: float | None = None
        self._per_token: float | None = None
        self._hits_per_request: float | None = None

    def update(self, counters: dict[str, float]) -> Costs | None:
        """The costs as of these cumulative ``counters`` (``COST_METRICS``); None until
        both are known. A counter that went back (a restart) opens a new window."""
        since = self._since
        if since is None:
            self._since = counters
            return self.costs()
        d = {k: counters.get(k, 0.0) - since.get(k, 0.0) for k in COST_METRICS}
        if any(v < 0 for v in d.values()):  # restarted: its counters began again
            self._since = counters
            return self.costs()
        ended, firsts = d[f"{E2E}_count"], d[f"{TTFT}_count"]
        if ended < MIN_REQUESTS or firsts < MIN_REQUESTS:
            return self.costs()  # the window stays open: its counts add up
        self._since = counters
        held = max(0.0, d[f"{E2E}_sum"] - d[f"{QUEUE}_sum"])
        self._hold = _ewma(self._hold, held / ended)
        self._hits_per_request = _ewma(self._hits_per_request, d[PREFIX_HITS] / firsts)
        computed = d[PREFIX_QUERIES] - d[PREFIX_HITS]
        if computed >= MIN_COMPUTED_TOKENS:
            prefill = max(0.0, d[f"{TTFT}_sum"] - d[f"{QUEUE}_sum"])
            self._per_token = _ewma(self._per_token, prefill / computed)
        share = d[PREFIX_HITS] / d[PREFIX_QUERIES] if d[PREFIX_QUERIES] > 0 else None
        return self.costs(share)

    def costs(self, hit_share: float | None = None) -> Costs | None:
        """The smoothed costs, with ``hit_share`` of the latest poll."""
        if self._hold is None or self._per_token is None or self._hits_per_request is None:
            return None
        return Costs(self._hold, self._hits_per_request * self._per_token, hit_share)


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
