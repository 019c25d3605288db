"""A small online forecaster for the scaler: a local-linear-trend Kalman filter of the
served requests/s and, beside it, a local level with a long memory, one update per
agent report each, O(1) to predict, never refitted (docs/scaling.md). PURE.

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

**The flat model.** A trend filter quick enough for a ramp is noisy on a flat load: at
a flat 240 requests/s its point 30 s ahead wandered 215-290 (the trend's error times
22 s) and the scaler kept 17-18 replicas where 15 serve. So a local level runs beside
it (random-walk variance ``rate / MEMORY_S^2`` per second: a memory of about
``MEMORY_S`` reports, a level's error of 2 requests/s at 240) and is believed while
the load is flat (``flat``): its point is its level, its band its own variance plus
the walk to the horizon (240 -> 243 at P90). It gives way to the trend filter when its
own CUSUM (``FLAT_H``) trips *and* the trend filter leans (its trend over ``ENTER_Z``
standard deviations; a trip alone re-seeds the level at the trend filter's, as sure of
it as the two agree: its variance plus their gap squared). The level runs on
meanwhile, and the trend filter hands back once its trend has been neither
significant (``EXIT_Z``) nor material (projected 30 s, under ``MATERIAL`` x the rate's
Poisson deviation) for ``STILL`` reports in a row: at its own level where the two
differ by over ``APART_Z`` deviations (after a ramp the level lags it by far more),
else at the level's. A ramp is believed as soon as before (the trend filter's
evidence decides); a flat load leaves the level 0.2-0.6 times an hour. Reports
noisier than Poisson (batching clients) are learned as ``dispersion`` (a mean of the
level's squared innovations over Poisson's, at least 1) and scale both filters' report
noise, so that they are not read as drifts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

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
# the flat model: its memory in reports (seconds at one a second), its CUSUM's threshold
# (a flat Poisson load trips it 0.2-0.6 times an hour; at 5, 2-4), the trend filter's
# lean that a trip needs to hand over (in its trend's standard deviations) and what
# hands back (STILL reports in a row of a trend neither over EXIT_Z deviations nor,
# projected 30 s, over MATERIAL x the rate's Poisson deviation)
MEMORY_S = 60.0
FLAT_H = 7.0
ENTER_Z = 1.0
EXIT_Z = 2.0
MATERIAL = 1.0
STILL = 10
DISPERSION_WEIGHT = 1 / 60  # of the newest report in the noise's dispersion
# a hand-back takes the trend filter's level when the two are this many deviations
# apart (after a ramp's knee the level lags by far more); at 2, a trend filter a noise
# run had taken 22 rps over a flat 223 was handed back as the level, and the scaler
# went back up 171 s after going down (the flap property, window 300 s)
APART_Z = 3.0


@dataclass(frozen=True, slots=True)
class Forecast:
    point: float  # expected rate at the horizon
    upper: float  # its upper band (P90 at z = 1.2816)


def start(y: float, at: float) -> ForecastState:
    y = max(0.0, y)
    scale = max(y, RATE_FLOOR)
    return ForecastState(
        level=y, p_ll=scale, p_tt=(0.002 * scale) ** 2, observed_at=at, flat_level=y, flat_var=scale
    )


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
    noise = state.dispersion * max(float(x[0]), 1.0) / interval
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
    flat = _flat(state, max(0.0, y), dt, interval, float(x[0]), float(x[1]), p)
    return ForecastState(
        flat=flat.flat,
        flat_level=flat.level,
        flat_var=flat.var,
        flat_up=flat.up,
        flat_down=flat.down,
        still=flat.still,
        dispersion=flat.dispersion,
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


@dataclass(frozen=True, slots=True)
class _Flat:
    """The flat model's part of the state after one report."""

    flat: bool
    level: float
    var: float
    up: float
    down: float
    still: int
    dispersion: float


def _flat(
    state: ForecastState,
    y: float,
    dt: float,
    interval: float,
    level: float,
    trend: float,
    p: np.ndarray,
) -> _Flat:
    """The flat model after the report ``y``, and which model is believed; ``level``,
    ``trend`` and ``p``: the trend filter's, with ``y`` folded in."""
    trend_sd = math.sqrt(max(float(p[1, 1]), 0.0))
    disp = state.dispersion
    seeded = _Flat(False, level, max(float(p[0, 0]), 0.0), 0.0, 0.0, 0, disp)
    was = state.level if state.flat_level is None else state.flat_level
    predicted = state.flat_var + max(was, RATE_FLOOR) / MEMORY_S**2 * dt
    poisson = max(was, 1.0) / interval
    noise = disp * poisson
    miss = y - was
    gain = predicted / (predicted + noise)
    own = _Flat(False, was + gain * miss, (1 - gain) * predicted, 0.0, 0.0, 0, disp)
    if not state.flat:  # the level runs on (the rate surely there is the lower of both)
        material = abs(trend) * _reach(30.0) > MATERIAL * math.sqrt(max(level, RATE_FLOOR))
        leaning = abs(trend) > EXIT_Z * trend_sd or material
        still = 0 if leaning else state.still + 1
        if still >= STILL:  # handed back: at the trend filter's level where the two differ
            apart = abs(own.level - seeded.level) > APART_Z * math.sqrt(own.var + seeded.var)
            return replace(seeded if apart else own, flat=True)
        return replace(own, still=still)
    z = miss / math.sqrt(predicted + noise)
    up = max(0.0, state.flat_up + z - DRIFT_K)
    down = max(0.0, state.flat_down - z - DRIFT_K)
    if max(up, down) > FLAT_H:  # it drifted: to the trend filter if that leans, else re-seeded
        if abs(trend) > ENTER_Z * trend_sd:
            return own
        # re-seeded at the trend filter's level, as sure of it as the two agree: a trip
        # can be a noise run that took the trend filter with it, and the scaler's
        # just-down rule trusts the level's lower band
        gap = seeded.level - own.level
        return replace(seeded, flat=True, var=seeded.var + gap * gap)
    dispersion = (1 - DISPERSION_WEIGHT) * disp + DISPERSION_WEIGHT * (
        miss**2 - predicted
    ) / poisson
    return replace(own, flat=True, up=up, down=down, dispersion=max(1.0, dispersion))


def basis(state: ForecastState) -> str:
    """Which model the forecast is, for the scaler's reasons."""
    return "flat" if state.flat else f"trend {state.trend:+.2g} rps/s"


def surely(state: ForecastState, z: float) -> float:
    """The rate surely there now, ``z`` deviations under the level: the flat model's
    while it is believed, else the lower of both models' (the trend filter's level
    jumps with one surprising report, the long memory's does not)."""
    trend = state.level - z * math.sqrt(state.p_ll)
    if state.flat_level is None:
        return trend
    flat = state.flat_level - z * math.sqrt(state.flat_var)
    return flat if state.flat else min(flat, trend)


def falling(state: ForecastState, z: float) -> bool:
    """Whether the load is falling for sure: the trend filter is believed (not the flat
    model) and its trend is more than ``z`` standard deviations under 0."""
    return not state.flat and state.trend < -z * math.sqrt(max(state.p_tt, 0.0))


def predict(state: ForecastState, horizon_s: float, z: float) -> Forecast:
    """The rate ``horizon_s`` seconds after the last report (the flat model's level while
    it is believed, else the trend damped), and its upper band; never below 0."""
    if state.flat and state.flat_level is not None:  # the level, and its walk to then
        level = state.flat_level
        var = state.flat_var + max(level, RATE_FLOOR) / MEMORY_S**2 * horizon_s
        return Forecast(point=max(0.0, level), upper=max(0.0, level + z * math.sqrt(var)))
    reach = _reach(horizon_s)
    f = _transition(reach)
    x = f @ np.array([state.level, state.trend])
    p = f @ _cov(state) @ f.T + _process(state.level, reach)
    point = float(x[0])
    upper = point + z * math.sqrt(max(0.0, float(p[0, 0])))
    return Forecast(point=max(0.0, point), upper=max(0.0, upper))


def _reach(horizon_s: float) -> float:
    """The seconds of trend a prediction ``horizon_s`` ahead counts (damped)."""
    return float(DAMPING * (1 - DAMPING**horizon_s) / (1 - DAMPING))


def _cov(state: ForecastState) -> np.ndarray:
    return np.array([[state.p_ll, state.p_lt], [state.p_lt, state.p_tt]])
