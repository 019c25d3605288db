"""What a probe's requests say (pure): a step's figures, the overload recovery time,
the wasted-work share. The bench feeds the same functions a model's requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from chaos.capacity.results import Outcome, RequestResult
from controlplane.kernel.capacity import CapacitySLO, Step


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); ``q`` in [0, 100]."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class StepFigures:
    """A step as the model reads it, and how well the generator kept to its plan."""

    step: Step
    requests: int
    lag_p99_s: float
    lag_max_s: float


def step_figures(
    results: Sequence[RequestResult], offered_rps: float, duration_s: float, timeout_s: float
) -> StepFigures:
    """The step's first-token p99 (over the requests that got a first token; the
    timeout when none did), error rate (errors and timeouts over requests sent),
    throughput (requests served over the time it took to serve them, at least the
    step's duration) and timeouts."""
    if not results:  # a rate so low that no arrival fell in the step: nothing failed
        return StepFigures(Step(offered_rps, 0.0, 0.0, 0.0), 0, 0.0, 0.0)
    ttfts = [t for r in results if (t := r.ttft_s) is not None]
    p99 = percentile(ttfts, 99) if ttfts else timeout_s
    failed = sum(not r.ok for r in results)
    timeouts = sum(r.outcome is Outcome.TIMEOUT for r in results)
    served = [r.done_s for r in results if r.ok]
    span = max([duration_s, *served])
    lags = [max(0.0, r.lag_s) for r in results]
    return StepFigures(
        Step(offered_rps, p99, failed / len(results), len(served) / span, timeouts),
        len(results),
        percentile(lags, 99),
        max(lags),
    )


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
    errors = sum(not r.ok for r in window) / len(window)
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
