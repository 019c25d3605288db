"""A small online forecaster for the scaler: a local-linear-trend Kalman filter of the
served requests/s, one update per agent report, O(1) to predict, never refitted
(docs/scaling.md). PURE.

State: the rate ``l`` and its trend ``t`` per second. Between two reports ``dt`` apart
the rate moves by ``t dt`` and a random acceleration (white noise, density
``(ACCEL x rate)^2``: proportional, so one setting serves 5 and 5,000 requests/s). A
report is a count over the agent's round: its noise variance is ``rate / dt``
(Poisson). The band at the horizon is the state's projected variance alone, without
that noise: the scaler sizes for the *rate* then, not for one round's count.

A prediction damps the trend (``DAMPING`` per second): the further ahead, the less of
it counts, as in damped Holt.

A surprise widens the covariance before the update, so that the report moves the
level and trend at once: one report past ``JUMP`` (a step), or a drift, where the
normalised innovations of consecutive reports lean the same way (a two-sided CUSUM,
``DRIFT_K`` per report, past ``DRIFT_H``; in the state, so a new leader continues it).
A ramp from 12 requests/s is believed within 5-15 reports, while a flat noisy load
keeps its band: an earlier rule widened on any report past 2 normalised squares, one
in six on a flat load, and the band's top swung 20-40 % above the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controlplane.kernel.pool.scale import ForecastState

ACCEL = 0.0005  # the random acceleration's scale, per second, relative to the rate
RATE_FLOOR = 5.0  # requests/s: the acceleration of a near-idle pool is at least this one's
SURPRISE = 2.0  # a surprise's evidence (a square) widens the covariance by it / this
JUMP = 16.0  # one report this many normalised squares off (4 sigma): a step
DRIFT_K = 0.5  # the CUSUM's allowance per report, in sigmas (a shift of 1 sigma is seen)
DRIFT_H = 4.0  # its threshold: a flat load trips a widening once per ~200-400 reports
# the trend's share kept per second of a prediction (damped Holt): a ramp is believed,
# not extrapolated for ever; 30 s ahead counts 22.3 s of trend, 60 s ahead 34.4 s (at
# a ramp's knee an undamped trend asked for twice the replicas the top needs)
DAMPING = 0.98
INTERVAL_WEIGHT = 0.2  # of the newest interval between reports in their mean


@dataclass(frozen=True, slots=True)
class Forecast:
    point: float  # expected rate at the horizon
    upper: float  # its upper band (P90 at z = 1.2816)


def start(y: float, at: float) -> ForecastState:
    y = max(0.0, y)
    scale = max(y, RATE_FLOOR)
    return ForecastState(level=y, p_ll=scale, p_tt=(0.002 * scale) ** 2, observed_at=at)


def _process(level: float, dt: float) -> np.ndarray:
    q = (ACCEL * max(level, RATE_FLOOR)) ** 2
    return q * np.array([[dt**3 / 3, dt**2 / 2], [dt**2 / 2, dt]])


def _transition(dt: float) -> np.ndarray:
    return np.array([[1.0, dt], [0.0, 1.0]])


def update(state: ForecastState | None, y: float, at: float) -> ForecastState:
    """``state`` with the report ``y`` (requests/s over the round) made at ``at``
    folded in; a report no newer than the last folded in changes nothing."""
    if state is None:
        return start(y, at)
    if at <= state.observed_at:
        return state
    dt = at - state.observed_at
    f = _transition(dt)
    x = f @ np.array([state.level, state.trend])
    p = f @ _cov(state) @ f.T + _process(state.level, dt)
    interval = (
        dt
        if state.observations == 1
        else (1 - INTERVAL_WEIGHT) * state.interval_s + INTERVAL_WEIGHT * dt
    )
    noise = max(float(x[0]), 1.0) / interval
    innovation = max(0.0, y) - float(x[0])
    expected = float(p[0, 0]) + noise
    z = innovation / math.sqrt(expected)
    up = max(0.0, state.drift_up + z - DRIFT_K)
    down = max(0.0, state.drift_down - z - DRIFT_K)
    evidence = z * z if z * z > JUMP else max(up, down) ** 2 if max(up, down) > DRIFT_H else 0.0
    if evidence:
        p = p * (evidence / SURPRISE)
        expected = float(p[0, 0]) + noise
        up = down = 0.0
    gain = p[:, 0] / expected
    x = x + gain * innovation
    p = p - np.outer(gain, p[0, :])
    return ForecastState(
        level=float(x[0]),
        trend=float(x[1]),
        p_ll=max(0.0, float(p[0, 0])),
        p_lt=float(p[0, 1]),
        p_tt=max(0.0, float(p[1, 1])),
        interval_s=interval,
        observed_at=at,
        observations=state.observations + 1,
        drift_up=up,
        drift_down=down,
    )


def predict(state: ForecastState, horizon_s: float, z: float) -> Forecast:
    """The rate ``horizon_s`` seconds after the last report (the trend damped), and its
    upper band; never below 0 (a load is not negative)."""
    reach = DAMPING * (1 - DAMPING**horizon_s) / (1 - DAMPING)  # seconds of trend
    f = _transition(reach)
    x = f @ np.array([state.level, state.trend])
    p = f @ _cov(state) @ f.T + _process(state.level, reach)
    point = float(x[0])
    upper = point + z * math.sqrt(max(0.0, float(p[0, 0])))
    return Forecast(point=max(0.0, point), upper=max(0.0, upper))


def _cov(state: ForecastState) -> np.ndarray:
    return np.array([[state.p_ll, state.p_lt], [state.p_lt, state.p_tt]])
