"""What a probe's requests say (pure): a step's figures (a screening step's, a
sustained step's), the saturation throughput, the overload recovery time, the
wasted-work share. The bench feeds the same functions a model's requests.

Workload errors (a request refused as too long for the model's context) are the
probe's fault, not the replica's: they are left out of every figure here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from chaos.capacity.results import Outcome, RequestResult, loaded
from controlplane.kernel.capacity.bearing import CapacitySLO, Step


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); ``q`` in [0, 100]."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def uncached_tokens(r: RequestResult) -> int:
    """The prompt tokens a request's prefill computed (its cache hit left out)."""
    return max(0, r.prompt_tokens - (r.cached_tokens or 0))


@dataclass(frozen=True, slots=True)
class UnloadedTtft:
    """A request's first-token time on an idle replica: a fixed cost plus its prefill,
    linear in its uncached prompt tokens; fitted (least squares) on the requests of a
    probe's lowest step, where nothing queues."""

    fixed_s: float
    per_token_s: float

    def of(self, r: RequestResult) -> float:
        return self.fixed_s + self.per_token_s * uncached_tokens(r)

    def p99(self, results: Sequence[RequestResult]) -> float | None:
        """The first-token p99 ``results`` would have had unloaded (over those that got a
        first token, as the step's own p99 is); None: none did."""
        times = [self.of(r) for r in results if r.ttft_s is not None]
        return percentile(times, 99) if times else None


def fit_unloaded(results: Sequence[RequestResult], min_points: int = 10) -> UnloadedTtft | None:
    """The line through the (uncached tokens, first-token time) of ``results``; None with
    fewer than ``min_points`` first tokens. A slope below 0 (noise on prompts of one
    length) is taken as 0: then every request counts alike."""
    points = [(uncached_tokens(r), t) for r in loaded(results) if (t := r.ttft_s) is not None]
    if len(points) < min_points:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (t - mean_t) for x, t in points) / var if var > 0 else 0.0
    slope = max(0.0, slope)
    return UnloadedTtft(max(0.0, mean_t - slope * mean_x), slope)


@dataclass(frozen=True, slots=True)
class StepFigures:
    """A step as the model reads it, and how well the generator kept to its plan."""

    step: Step
    requests: int
    lag_p99_s: float
    lag_max_s: float


def step_figures(
    results: Sequence[RequestResult],
    offered_rps: float,
    duration_s: float,
    timeout_s: float,
    unloaded: UnloadedTtft | None = None,
) -> StepFigures:
    """A screening step's figures (every request of a step from an empty queue): its
    first-token p99 (over the requests that got a first token; the timeout when none
    did), error rate (errors and timeouts over requests sent), throughput (requests
    completed within the step over its duration) and timeouts; with ``unloaded``, the
    p99 its requests would have had on an idle replica."""
    results = loaded(results)
    if not results:  # a rate so low that no arrival fell in the step: nothing failed
        return StepFigures(Step(offered_rps, 0.0, 0.0, 0.0), 0, 0.0, 0.0)
    p99, errors, timeouts = _sla_figures(results, timeout_s)
    done = sum(r.ok and r.done_s <= duration_s for r in results)
    lags = [max(0.0, r.lag_s) for r in results]
    idle_p99 = unloaded.p99(results) if unloaded is not None else None
    return StepFigures(
        Step(offered_rps, p99, errors, done / duration_s, timeouts, unloaded_p99_s=idle_p99),
        len(results),
        percentile(lags, 99),
        max(lags),
    )


def _sla_figures(results: Sequence[RequestResult], timeout_s: float) -> tuple[float, float, int]:
    """First-token p99 (the timeout when nothing came), error rate, timeouts."""
    ttfts = [t for r in results if (t := r.ttft_s) is not None]
    p99 = percentile(ttfts, 99) if ttfts else timeout_s
    errors = sum(r.overload_error for r in results) / len(results)
    timeouts = sum(r.outcome is Outcome.TIMEOUT for r in results)
    return p99, errors, timeouts


def inflight_at(results: Sequence[RequestResult], t: float) -> int:
    """Requests sent and not yet done at ``t`` (the backlog the replica holds)."""
    return sum(r.sent_s <= t < r.done_s for r in results)


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


@dataclass(frozen=True, slots=True)
class SustainedFigures:
    """A sustained step as judged over its window, and its mean in-flight there."""

    figures: StepFigures
    mean_inflight: float  # requests held at once on average in the window (all replicas)


def sustained_figures(
    results: Sequence[RequestResult],
    offered_rps: float,
    warmup_s: float,
    measure_s: float,
    timeout_s: float,
    samples: int = 60,
    unloaded: UnloadedTtft | None = None,
) -> SustainedFigures:
    """A sustained step judged over its window ``[warmup_s, warmup_s + measure_s)``:
    p99 and errors over the requests that arrived in it; the **served ratio**,
    completions in the window over arrivals in it; the **backlog growth**, the
    least-squares trend of the in-flight count (``samples`` points across the window)
    times the window, over its arrivals; the throughput, completions in the window over
    its length; the mean in-flight there (Little's law's L, for admission's bound)."""
    results = loaded(results)
    start, end = warmup_s, warmup_s + measure_s
    judged = [r for r in results if start <= r.planned_s < end]
    lags = [max(0.0, r.lag_s) for r in results] or [0.0]
    if not judged:
        figs = StepFigures(Step(offered_rps, 0.0, 0.0, 0.0, 0, 1.0, 0.0), 0, 0.0, 0.0)
        return SustainedFigures(figs, 0.0)
    p99, errors, timeouts = _sla_figures(judged, timeout_s)
    completed = sum(start <= r.done_s < end for r in results)
    times = [start + measure_s * (i + 0.5) / samples for i in range(samples)]
    held = [float(inflight_at(results, t)) for t in times]
    growth = _slope(times, held) * measure_s / len(judged)
    step = Step(
        offered_rps,
        p99,
        errors,
        completed / measure_s,
        timeouts,
        served_ratio=completed / len(judged),
        backlog_growth=growth,
        judged=len(judged),
        mean_inflight=sum(held) / len(held),
        unloaded_p99_s=unloaded.p99(judged) if unloaded is not None else None,
    )
    figs = StepFigures(step, len(judged), percentile(lags, 99), max(lags))
    return SustainedFigures(figs, step.mean_inflight)


def saturation_rps(results: Sequence[RequestResult]) -> float | None:
    """What a replica completes per second when it cannot keep up: from a step offered
    far more than it serves, the completions between the 10th and the 90th percentile
    of completion times (the backlog there keeps every slot busy; the ramp up and the
    last stragglers are left out). None with fewer than 10 completions."""
    done = sorted(r.done_s for r in loaded(results) if r.ok)
    if len(done) < 10:
        return None
    lo, hi = int(0.1 * len(done)), int(0.9 * len(done))
    span = done[hi] - done[lo]
    return (hi - lo) / span if span > 0 else None


def recovery_time(
    results: Sequence[RequestResult],
    from_s: float,
    until_s: float,
    window_s: float,
    slo: CapacitySLO,
) -> float | None:
    """How long after ``from_s`` (the load dropped back to the allowed rate) requests
    are within the SLA again: windows of ``window_s`` of send time, one starting at
    each request sent from ``from_s`` on and ending by ``until_s``; the time is where
    the window after the last one that missed the SLA (p99 over the SLO, errors over
    its limit, a timeout) starts. 0: none missed; None: the last one still missed."""
    sent = sorted((r for r in results if from_s <= r.planned_s < until_s), key=lambda r: r.sent_s)
    starts = [r.sent_s for r in sent if r.sent_s + window_s <= until_s]
    if not starts:
        raise ValueError("the recovery phase is shorter than one window")
    last_bad: int | None = None
    for i, u in enumerate(starts):
        window = [r for r in sent if u <= r.sent_s < u + window_s]
        if not _window_ok(window, slo):
            last_bad = i
    if last_bad is None:
        return 0.0
    if last_bad == len(starts) - 1:
        return None
    return max(0.0, starts[last_bad + 1] - from_s)


def _window_ok(window: Sequence[RequestResult], slo: CapacitySLO) -> bool:
    if any(r.outcome is Outcome.TIMEOUT for r in window):
        return False
    errors = sum(r.overload_error for r in window) / len(window)
    ttfts = [t for r in window if (t := r.ttft_s) is not None]
    return errors <= slo.error_rate and bool(ttfts) and percentile(ttfts, 99) <= slo.ttft_p99_s


def wasted_share(results: Sequence[RequestResult]) -> float | None:
    """Prompt and generated tokens spent on requests that failed or were cut, over all
    tokens spent (None when nothing was spent)."""
    spent = sum(r.prompt_tokens + r.generated_tokens for r in results)
    if spent == 0:
        return None
    wasted = sum(r.prompt_tokens + r.generated_tokens for r in results if not r.ok)
    return wasted / spent
