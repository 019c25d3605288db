"""How far the scaler's forecasts missed: the realised horizon error (issue 32, item 4;
``failoverctl doctor``'s question 4). PURE, bounded.

The forecaster (``core/forecast.py``) says, at each report, what the load will be one
horizon later; nothing else checks it. Here, a few times per horizon, the forecast is
remembered as ``(due_at, predicted)`` in ``ScaleRecord.forecast_due`` (at most
``PENDING_MAX``), and the first report at or after ``due_at`` scores it. ``observed`` is
the rate that report shows, the filter's level once it is folded in (the scaler passes
that): a forecast is of the rate, as the band is, and one round's count of a 5 rps pool
varies by a third from Poisson noise alone, which would read as a forecast error:
``|observed - predicted| / max(observed, RATE_FLOOR)``, folded into the EWMA
``forecast_error`` with ``forecast_error_samples`` counting the scores. It is kept in the
record, so a new leader continues it from the last checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

# forecasts remembered per horizon: with 30 s, one every 5 s (a report each agent round
# would be many more, and the error of neighbouring forecasts is nearly the same)
PER_HORIZON = 6
# the most remembered at once; a full memory skips new forecasts (not the oldest: those
# come due first, so with any horizon every remembered forecast is scored)
PENDING_MAX = 8
# a report this long after a forecast's due time is no longer "a horizon ahead" (a dark
# signal came between): the forecast is dropped, not scored
LATE_S = 10.0
ERROR_WEIGHT = 0.1  # of the newest score in the EWMA: about the last ten forecasts
# requests/s under which a miss is measured against this, not the load: a miss of 2 rps
# changes no pool's size, and a near-idle pool's rate wanders by its Poisson noise (at
# 5 rps the forecast 30 s ahead misses by ~26% of the load, ~13% of this floor)
RATE_FLOOR = 10.0


@dataclass(frozen=True, slots=True)
class Tracked:
    """The record's forecast-error fields after one report."""

    due: tuple[tuple[float, float], ...]  # (due_at, predicted rps), oldest first
    error: float | None  # EWMA of the relative miss; None: nothing scored yet
    samples: int  # forecasts scored


def miss(observed: float, predicted: float) -> float:
    """One forecast's relative miss; under ``RATE_FLOOR`` rps the denominator is the floor
    (a miss of 1 rps on a near-idle pool is not a 100% error)."""
    return abs(observed - predicted) / max(observed, RATE_FLOOR)


def track(
    last: Tracked, *, observed: float, seen: float, predicted: float, horizon: float
) -> Tracked:
    """``last`` after the report ``observed`` (rps) made at ``seen``, whose forecast one
    ``horizon`` ahead is ``predicted``. Idempotent for a report already seen (the
    leader ticks more often than agents report)."""
    error, samples = last.error, last.samples
    kept: list[tuple[float, float]] = []
    for due_at, was in last.due:
        if seen < due_at:
            kept.append((due_at, was))
        elif seen - due_at <= LATE_S:
            score = miss(observed, was)
            error = score if error is None else (1 - ERROR_WEIGHT) * error + ERROR_WEIGHT * score
            samples += 1
    due_at = seen + horizon
    spaced = not kept or due_at - kept[-1][0] >= horizon / PER_HORIZON
    if spaced and len(kept) < PENDING_MAX:
        kept.append((due_at, predicted))
    return Tracked(due=tuple(kept), error=error, samples=samples)
