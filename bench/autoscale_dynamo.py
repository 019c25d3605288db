"""NVIDIA Dynamo's load predictions for the autoscale bench, made out of process.

``ai-dynamo`` lives in its own venv (``.venv-dynamo``, scripts/setup_bench_dynamo.sh):
never in the product's. What its planner observes each throughput interval (the
requests the frontend received) does not depend on how the pool is sized, so the
whole series is known before a run: one call of ``bench/autoscale_dynamo_helper.py``
per scenario gives every predictor's one-interval-ahead prediction at each of the
planner's ticks, and the ``dynamo`` policy reads them as it ticks.
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.autoscale_sim import Arrivals, Scenario

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv-dynamo" / "bin" / "python"
HELPER = REPO / "bench" / "autoscale_dynamo_helper.py"
PREDICTORS = ("arima", "kalman", "prophet", "constant")  # arima: the planner's default
DEFAULT = "arima"
INTERVAL_S = 180.0  # throughput_adjustment_interval_seconds's default
WARM_INTERVALS = 10  # intervals of the starting load the predictors are warmed with


@dataclass(frozen=True, slots=True)
class Series:
    """Requests per interval: the warm-up history, then one per planner tick."""

    warm: list[float]
    ticks: list[float]
    counts: list[float]


@dataclass(slots=True)
class Predictions:
    by_predictor: dict[str, dict[float, float]] = field(default_factory=dict)  # tick -> req
    failed: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None  # why no predictor ran at all
    version: str | None = None


def series(
    scenario: Scenario, arrivals: Arrivals, *, start_s: float, seed: int, interval_s: float
) -> Series:
    """What the planner observes at each tick t (t a multiple of the interval, within
    the run): the requests of [t - interval, t); before the run starts, Poisson counts
    at the starting rate (as after hours at it)."""
    rng = np.random.default_rng(seed + 23)
    base = scenario.rate(start_s) * interval_s
    warm = [float(rng.poisson(base)) for _ in range(WARM_INTERVALS)]
    at = np.asarray(arrivals.at)
    first = math.ceil(start_s / interval_s) * interval_s
    ticks = [float(t) for t in np.arange(first, scenario.end_s, interval_s)]
    counts = []
    for t in ticks:
        lo = t - interval_s
        seen = int(np.count_nonzero((at >= max(lo, start_s)) & (at < t)))
        before = max(0.0, start_s - lo) * scenario.rate(start_s)
        counts.append(float(seen + (rng.poisson(before) if before > 0 else 0)))
    return Series(warm=warm, ticks=ticks, counts=counts)


def predict(s: Series, predictors: tuple[str, ...], *, timeout_s: float = 300.0) -> Predictions:
    """Each predictor's prediction at each tick, or why there is none."""
    out = Predictions()
    if not predictors:
        out.skipped = "no predictor asked for (--dynamo-predictors)"
        return out
    if not PYTHON.exists():
        out.skipped = (
            f"{PYTHON.relative_to(REPO)} not found: run scripts/setup_bench_dynamo.sh "
            "(ai-dynamo and its predictors' libraries in a bench-only venv)"
        )
        return out
    request = {"predictors": list(predictors), "warm": s.warm, "series": s.counts}
    try:
        done = subprocess.run(
            [str(PYTHON), str(HELPER)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        reply = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        out.skipped = f"the predictors' helper failed: {type(e).__name__}: {e}"[:400]
        return out
    if "error" in reply:
        out.skipped = f"ai-dynamo's predictors did not import: {reply['error']}"
        return out
    out.version = reply.get("version")
    out.failed = dict(reply.get("failed", {}))
    out.seconds = dict(reply.get("seconds", {}))
    for name, values in reply.get("predictions", {}).items():
        out.by_predictor[name] = dict(zip(s.ticks, map(float, values), strict=True))
    return out
