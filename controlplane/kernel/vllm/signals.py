"""Window figures from vLLM's cumulative counters (pure: no I/O, no clock).

A probe reads cumulative figures from a replica's ``/metrics``
(:class:`ReplicaMetrics`); the figures for the time between two probes come from
their differences (:func:`replica_window`), and a region's figures from the sum of its
replicas' differences (:func:`fold_windows`): histograms are merged bucket by bucket
before a quantile is taken (a mean of p99s is no p99), rates are ratios of summed
deltas. A counter that went backwards, or a changed ``_created`` stamp, means the
replica restarted: its current values are then the deltas, as Prometheus' ``rate()``
assumes.

A figure that cannot be known (no previous probe, no requests in the window, a metric
the server does not expose) is ``None``, never 0: the caller omits it.

**Served load** (``served_rate``, the agent's ``load_rps``) counts the requests that got
their first token: the ``_count`` of ``vllm:time_to_first_token_seconds``, which vLLM
observes once per inference request (completions, chat) and never for anything else.
``http_requests_total`` (``request_rate``) is no served load: vLLM's instrumentator
counts every API answer but its own probe endpoints, so the warm pool's ``GET
/is_sleeping`` every reconcile tick, ``/wake_up``, ``/reset_prefix_cache``, ``/tokenize``
and 4xx refusals are in it (an idle pool member read 1 request/s). A request queued and
not started yet is counted when it starts: under overload this is what the region
serves, not what is offered. :class:`LoadWindow` smooths it over
:data:`LOAD_WINDOW_S` for planning and CBU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, model_validator

TTFT_QUANTILE = 0.99
# The served load, smoothed (``ladder.LOAD_SIGNAL``, "load_rps") over LOAD_WINDOW_S, is
# what the planner, CBU and the degradation ladder read; this round's own window (one
# probe interval, ~1 s) goes out as LOAD_RAW_SIGNAL for the live view.
LOAD_RAW_SIGNAL = "load_rps_raw"
# 30 s: the decisions that read the load act on 10 s to minutes (a ladder step every
# 10 s by default, an ACTIVE replica kept 120 s, a failover moving a region's load), and
# a 1 s window is noise: at a constant 7.5 requests/s it read 3 to 12. Thirty 1 s
# windows cut Poisson noise by sqrt(30) (1 sigma: +-37 % -> +-6.7 % at 7.5/s), and a
# step change in load is fully seen after 30 s, three ladder steps; 60 s (Prometheus'
# usual rate window) would halve that noise again but take a minute to follow a surge.
LOAD_WINDOW_S = 30.0


class Histogram(BaseModel):
    """A Prometheus histogram: cumulative counts at ascending upper bounds, the last
    of which is ``+Inf`` (so ``counts[-1]`` is the number of observations)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total: float = 0.0  # the ``_sum`` series

    @model_validator(mode="after")
    def _shape(self) -> Histogram:
        if len(self.bounds) != len(self.counts) or not self.bounds:
            raise ValueError("a histogram needs one cumulative count per bound")
        if self.bounds[-1] != math.inf:
            raise ValueError("the last bucket of a histogram must be +Inf")
        if any(a >= b for a, b in zip(self.bounds, self.bounds[1:], strict=False)):
            raise ValueError("histogram bounds must ascend")
        return self

    @property
    def count(self) -> float:
        return self.counts[-1]


class ReplicaMetrics(BaseModel):
    """The cumulative figures of one ``/metrics`` scrape (``None``: not exposed)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    at: float  # monotonic seconds at the scrape (the adapter's clock, not wall time)
    since: float | None = None  # the counters' ``_created`` stamp; changes on a restart
    ttft: Histogram | None = None  # vllm:time_to_first_token_seconds
    prefix_queries: float | None = None  # vllm:prefix_cache_queries_total (tokens)
    prefix_hits: float | None = None  # vllm:prefix_cache_hits_total (tokens)
    requests: float | None = None  # http_requests_total, all API handlers and statuses
    server_errors: float | None = None  # http_requests_total{status="5xx"}
    kv_usage: float | None = None  # vllm:kv_cache_usage_perc, a gauge (1.0 = full)


class ReplicaWindow(BaseModel):
    """What happened at one replica between two probes (deltas; ``None``: unknown)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    seconds: float | None = None  # window length; None on a first probe
    at: float | None = None  # when it ended (the later scrape's ``at``)
    restarted: bool = False
    ttft: Histogram | None = None  # bucket deltas, still cumulative across buckets
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    requests: float | None = None
    server_errors: float | None = None
    kv_usage: float | None = None  # the gauge at the end of the window

    @property
    def ttft_p99_s(self) -> float | None:
        return None if self.ttft is None else histogram_quantile(TTFT_QUANTILE, self.ttft)

    @property
    def request_rate(self) -> float | None:
        if self.requests is None or not self.seconds:
            return None
        return self.requests / self.seconds

    @property
    def served(self) -> float | None:
        """Inference requests that got their first token in the window (see the module
        docstring); None when the replica exposes no first-token histogram."""
        return None if self.ttft is None else max(0.0, self.ttft.count)

    @property
    def served_rate(self) -> float | None:
        served = self.served
        if served is None or not self.seconds:
            return None
        return served / self.seconds

    @property
    def error_rate(self) -> float | None:
        return _ratio(self.server_errors, self.requests)

    @property
    def prefix_hit_rate(self) -> float | None:
        return _ratio(self.prefix_hits, self.prefix_queries)


class RegionSignals(BaseModel):
    """A region's window figures, folded over its replicas' windows."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_p99_s: float | None = None
    # every API answer per second (pool probes, admin calls, 4xx included): no load
    request_rate: float | None = None
    served_rate: float | None = None  # inference requests started per second: the load
    error_rate: float | None = None  # 5xx answers / all answers, 0..1
    prefix_hit_rate: float | None = None  # hit tokens / queried tokens, 0..1
    kv_usage_max: float | None = None
    kv_usage_mean: float | None = None

    def as_signals(self) -> dict[str, float]:
        """The known figures under their signal names; unknown ones are left out."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


def _ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or whole is None or whole <= 0:
        return None
    return part / whole


def histogram_quantile(q: float, h: Histogram) -> float | None:
    """Prometheus' ``histogram_quantile``: find the bucket holding rank ``q * count``
    and interpolate linearly inside it (the first bucket starts at 0; a rank in the
    ``+Inf`` bucket answers the highest finite bound). ``None`` without observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not within [0, 1]")
    counts = list(h.counts)
    for i in range(1, len(counts)):  # sums of deltas may wobble; counts never fall
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if total <= 0 or len(h.bounds) < 2:
        return None
    rank = q * total
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(counts) - 1:
        return h.bounds[-2]
    end = h.bounds[b]
    if b == 0:
        start, below = (0.0, 0.0) if end > 0 else (end, 0.0)
    else:
        start, below = h.bounds[b - 1], counts[b - 1]
    inside = counts[b] - below
    if inside <= 0:
        return end
    return start + (end - start) * (rank - below) / inside


def _delta(prev: float | None, cur: float | None, restarted: bool) -> float | None:
    if cur is None:
        return None
    if restarted:
        return cur
    return None if prev is None else cur - prev


def _went_back(prev: float | None, cur: float | None) -> bool:
    return prev is not None and cur is not None and cur < prev


def _restarted(prev: ReplicaMetrics, cur: ReplicaMetrics) -> bool:
    if prev.since is not None and cur.since is not None and prev.since != cur.since:
        return True
    pairs = [
        (prev.prefix_queries, cur.prefix_queries),
        (prev.prefix_hits, cur.prefix_hits),
        (prev.requests, cur.requests),
        (prev.server_errors, cur.server_errors),
    ]
    if prev.ttft is not None and cur.ttft is not None and prev.ttft.bounds == cur.ttft.bounds:
        pairs += zip(prev.ttft.counts, cur.ttft.counts, strict=True)
    return any(_went_back(p, c) for p, c in pairs)


def _histogram_delta(
    prev: Histogram | None, cur: Histogram | None, restarted: bool
) -> Histogram | None:
    if cur is None:
        return None
    if restarted:
        return cur
    if prev is None or prev.bounds != cur.bounds:
        return None  # nothing to subtract: these buckets cannot be compared
    return Histogram(
        bounds=cur.bounds,
        counts=tuple(c - p for p, c in zip(prev.counts, cur.counts, strict=True)),
        total=cur.total - prev.total,
    )


def replica_window(prev: ReplicaMetrics | None, cur: ReplicaMetrics) -> ReplicaWindow:
    """The window between two scrapes of one replica. Without ``prev`` (a first probe)
    only the gauge is known."""
    if prev is None:
        return ReplicaWindow(kv_usage=cur.kv_usage)
    restarted = _restarted(prev, cur)
    seconds = cur.at - prev.at
    return ReplicaWindow(
        seconds=seconds if seconds > 0 else None,
        at=cur.at,
        restarted=restarted,
        ttft=_histogram_delta(prev.ttft, cur.ttft, restarted),
        prefix_queries=_delta(prev.prefix_queries, cur.prefix_queries, restarted),
        prefix_hits=_delta(prev.prefix_hits, cur.prefix_hits, restarted),
        requests=_delta(prev.requests, cur.requests, restarted),
        server_errors=_delta(prev.server_errors, cur.server_errors, restarted),
        kv_usage=cur.kv_usage,
    )


def merge_histograms(hists: Sequence[Histogram]) -> Histogram | None:
    """Sum histograms bucket by bucket. Only the bounds they all share are kept: a
    cumulative count is exact at each of a histogram's own bounds and unknown between
    them (``+Inf`` is always shared)."""
    if not hists:
        return None
    shared = set(hists[0].bounds).intersection(*(h.bounds for h in hists[1:]))
    bounds = tuple(sorted(shared))
    counts = [0.0] * len(bounds)
    for h in hists:
        at = dict(zip(h.bounds, h.counts, strict=True))
        for i, bound in enumerate(bounds):
            counts[i] += at[bound]
    return Histogram(bounds=bounds, counts=tuple(counts), total=sum(h.total for h in hists))


def _sum_pairs(pairs: Sequence[tuple[float | None, float | None]]) -> tuple[float, float] | None:
    """Sum (part, whole) over the replicas that know both; None when none does."""
    known = [(p, w) for p, w in pairs if p is not None and w is not None]
    if not known:
        return None
    return sum(p for p, _ in known), sum(w for _, w in known)


def fold_windows(windows: Sequence[ReplicaWindow]) -> RegionSignals:
    """A region's figures from its replicas' windows over (about) the same interval."""
    merged = merge_histograms([w.ttft for w in windows if w.ttft is not None])
    rates = [r for w in windows if (r := w.request_rate) is not None]
    served = [r for w in windows if (r := w.served_rate) is not None]
    errors = _sum_pairs([(w.server_errors, w.requests) for w in windows])
    hits = _sum_pairs([(w.prefix_hits, w.prefix_queries) for w in windows])
    kv = [w.kv_usage for w in windows if w.kv_usage is not None]
    return RegionSignals(
        ttft_p99_s=None if merged is None else histogram_quantile(TTFT_QUANTILE, merged),
        request_rate=sum(rates) if rates else None,
        served_rate=sum(served) if served else None,
        error_rate=None if errors is None else _ratio(*errors),
        prefix_hit_rate=None if hits is None else _ratio(*hits),
        kv_usage_max=max(kv) if kv else None,
        kv_usage_mean=sum(kv) / len(kv) if kv else None,
    )


# ---- the served load over a window -----------------------------------------------------


class LoadSample(BaseModel):
    """One probe round's served load: ``count`` requests in the ``seconds`` ending at
    ``at`` (monotonic seconds, the probes' clock)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    at: float
    seconds: float
    count: float


class LoadWindow(BaseModel):
    """A sliding-window rate of the served load: requests over seconds, summed over the
    rounds that ended within the last ``window_s`` (pure: the caller's times, no clock).

    A round with no window (the agent's first, every replica new or down) adds nothing:
    the rate is then the rounds still in the window, so a region whose replicas all
    went down keeps its last served load for up to ``window_s``, which is what a
    failover must move. Until ``window_s`` has passed the rate is over what there is.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_s: float = LOAD_WINDOW_S
    samples: tuple[LoadSample, ...] = ()

    def add(self, at: float, seconds: float, count: float) -> LoadWindow:
        """With the round ``(at - seconds, at]`` added and rounds out of the window
        dropped. A round at or before the newest one (a clock that went back: a new
        process) starts the window again."""
        if seconds <= 0 or not math.isfinite(count):
            return self
        kept = self.samples
        if kept and at <= kept[-1].at:
            kept = ()
        sample = LoadSample(at=at, seconds=seconds, count=max(0.0, count))
        start = at - self.window_s
        return self.model_copy(update={"samples": (*(s for s in kept if s.at > start), sample)})

    @property
    def rate(self) -> float | None:
        """Requests per second over the window; None before the first round."""
        seconds = sum(s.seconds for s in self.samples)
        if seconds <= 0:
            return None
        return sum(s.count for s in self.samples) / seconds

    @property
    def span_s(self) -> float:
        """The seconds the rate is over (less than ``window_s`` while it fills)."""
        return sum(s.seconds for s in self.samples)
