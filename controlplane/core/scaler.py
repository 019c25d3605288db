"""A pool's size, one decision per tick: forecast, capacity at the hit rate, a reactive
guard, and a stable window before anything goes (docs/scaling.md). PURE.

``size_pool`` takes what the tick knows of one pool (``PoolSignals``, the per-replica
capacity at a hit rate, the last ``ScaleRecord``) and returns the next record and
whether it must be written (a size that changed is audited; the forecaster's state is
checkpointed every ``checkpoint_s`` so that a new leader continues from it).

- ACTIVE = ceil(upper band of the load ``horizon`` ahead / what one replica bears at
  the forecast hit rate), within ``min_active``..``max_active``;
- WARM = the larger of ``burst_warm`` + what the forecast's point asks beyond ACTIVE
  one horizon further (those must be asleep and ready by then, so their launch starts
  now) and what ``standby_rps`` asks beyond what ACTIVE bears (the burst planned for,
  which no forecast sees coming), at the pool's usual hit rate (an hour's mean: a
  burst is new traffic); ``burst_warm`` is the margin for a burst nobody sized, so a
  planned burst's standby holds it, not it and one more;
- the guard (queue per replica over ``guard_queue_per_replica``, or first-token p99
  over the SLO) asks for one replica more than serve now when the forecast missed, and
  forbids a scale-down; an episode that began while the pool was still waking to the
  forecast's ask is a step's backlog: once the replicas asked for serve, it adds none
  while they clear the queue within a horizon (``_drain_s``), and one horizon after it
  ends, the replicas it added beyond what the forecast asked go (not a stable window
  later);
- fewer replicas only after the forecast asked for fewer for ``stable_window_s`` without
  a break, and then to the most it asked for in that window; never back down to a size
  the guard found short right after a scale-down, at that load (``core/guard_lesson.py``);
  while it waits, a size the pool never reached is held at what serves (or the ask now,
  if more) once the ask has been lower for a horizon; a load
  falling for sure waits ``decline_window_s`` (one horizon), not the window, unless the
  pool went up within a window;
- no fresh agent report for ``dark_after_s``: the size holds (never scale down blind);
- a pool being failed over is not scaled down: it must be ready to come back;
- how far the forecasts missed a horizon later is kept in the record
  (``core/forecast_error.py``: ``forecast_error``, for ``failoverctl doctor``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from controlplane.core import forecast, forecast_error, guard_lesson, zero
from controlplane.core.spend import Budget
from controlplane.kernel.pool.scale import (
    Direction,
    ForecastState,
    Incoming,
    ScaleRecord,
    ScalingPolicy,
)

WARMUP = 5  # reports the forecaster folds in before its trend is used
HIT_WEIGHT = 0.3  # of the newest hit rate in the smoothed one
# the load "surely there" that takes a pool back up within a stable window of going
# down: 2 deviations under the level (P2.3), not the band's P10. A noise run that trips
# the level's CUSUM re-seeds it high, and four reports later its P10 was over what the
# pool went down to (184 rps with 12.5 % noise: down, then up 81 s later)
SURELY_Z = 2.0
# the trend (in its deviations) under which the load is falling for sure, and a
# scale-down waits ``decline_window_s`` (one horizon), not the stable window: on the
# flap property's noisy flat loads (up to 20 % noise) no trend leans this far down
DECLINE_Z = 4.0
_EPS = 1e-9  # so that 90 / 30 is 3 replicas, not 4, after float rounding


@dataclass(frozen=True, slots=True)
class PoolSignals:
    """The newest agent report of a pool: its served load, hit rate, queue and
    first-token p99 (None: not reported), when it was made, and how many replicas
    serve now."""

    observed_at: float | None  # None: no agent report at all
    load_rps: float | None
    hit_rate: float | None
    queue_depth: float | None
    ttft_p99_s: float | None
    active_now: int
    activation_p95_s: float | None = None  # the pool's last wakes, as its agent measured
    wake_at: float | None = None  # wake/<unit>: the newest request to wake it from zero
    # whether ``active_now`` was reported (pools/<region>), not a 0 for want of one
    serving_known: bool = True


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one replica bears, as a function of the hit rate, and where that comes from
    (for the reasons: measured, or the typed fallback)."""

    per_replica: Callable[[float], float]
    source: str
    measured_at: float | None = None  # when the record was measured (None: typed)


@dataclass(frozen=True, slots=True)
class Moving:
    """A running failover moving ``rps`` onto this pool, arriving at ``hit_rate`` (cold,
    or as the pre-warm's verified attainment says)."""

    source: str
    started_at: float
    rps: float
    hit_rate: float


@dataclass(frozen=True, slots=True)
class Sized:
    record: ScaleRecord
    changed: bool  # active or warm differ from the last record: audit it
    due: bool  # write it (changed, or the checkpoint is due, or there was none)


def size_pool(
    unit: str,
    stored: ScaleRecord | None,
    signals: PoolSignals,
    capacity: Capacity,
    policy: ScalingPolicy,
    *,
    now: float,
    ttft_slo_s: float | None,
    failing_over: bool = False,
    moving: Moving | None = None,
    memory: ScaleRecord | None = None,
    budget: Budget | None = None,
) -> Sized:
    """``stored``: ``scale/<unit>`` as etcd holds it; ``memory``: this leader's newer
    state since (the forecaster moves every tick, the record is written less often);
    ``budget``: what the pool may spend (core/spend.py), None: no ``cost:``."""
    base = restored(memory, stored) or _first(unit, signals.active_now, policy, now)
    seen, load = signals.observed_at, signals.load_rps
    if seen is None or now - seen > policy.dark_after_s or load is None:
        return _dark(base, stored, seen, now, policy)
    state = forecast.update(base.forecast, load, seen)
    hit = _smoothed_hit(base.hit_rate, signals.hit_rate, policy.max_hit_rate)
    usual = _usual_hit(base, hit, seen, policy)
    horizon = max(policy.horizon, signals.activation_p95_s or 0.0)
    near, far = _ahead(state, load, policy, horizon)
    lesson = guard_lesson.fresh(base.lesson, now, policy, capacity.measured_at)
    per = max(capacity.per_replica(hit), _EPS)
    need = _within(math.ceil(near.upper / per - _EPS), policy)
    longer = " (the measured wake p95)" if horizon > policy.horizon else ""
    basis = f", {forecast.basis(state)}" if _forecasting(state, policy) else ""
    reasons = [
        f"load {load:.3g} rps, forecast {near.point:.3g} (P90 {near.upper:.3g}{basis}) "
        f"in {horizon:g} s{longer} at hit rate {hit:.2f}: {per:.3g} rps per replica "
        f"({capacity.source}) -> {need} ACTIVE"
    ]
    if need > base.active and _just_down(base, now, policy):
        # back up within a stable window of going down: only for the load the filter is
        # sure of now (its lower band, SURELY_Z: not a trend, an upper band or one
        # outlier, which a noisy flat load swings); the guard adds at once when queues
        # build
        sure = forecast.surely(state, SURELY_Z)
        need = max(base.active, _within(math.ceil(sure / per - _EPS), policy))
        reasons.append(
            f"went down {now - _down_at(base):.0f} s ago: up only for the load surely "
            f"there now ({max(0.0, sure):.3g} rps)"
        )
    incoming = None
    if moving is not None:
        incoming, need = _with_incoming(
            base, moving, need, near.upper, per, capacity, policy, now, reasons
        )
    guard = _guard(signals, ttft_slo_s, policy)
    lesson = guard_lesson.learn(
        lesson,
        guard=guard,
        guarded=bool(base.guard),
        after_down=_went_down(base, now, policy),
        asked=need,
        serving=signals.active_now,
        sized_for=near.upper,
        hit_rate=hit,
        now=now,
        policy=policy,
    )
    asked = need  # the forecast's (and the failover's), before the guard
    serving = signals.active_now if signals.serving_known else None
    backlog = _backlog(base, guard, asked, serving, now=now, horizon=horizon)
    in_backlog = bool(guard) and backlog is not None
    drain = _drain_s(signals, ttft_slo_s, per, near.point) if in_backlog else None
    if drain is not None and drain <= horizon:
        # a step's backlog the replicas asked for, now up, clear within a horizon: one
        # more would drain it sooner and go a horizon later, paid for a minute
        reasons.append(
            f"guard: {guard}; the step's backlog drains in about {drain:.0f} s at the "
            f"{signals.active_now} serving -> {need} ACTIVE, no scale-down while it holds"
        )
    elif guard:
        # one more than serves now: replicas still waking are the guard's last answer
        # (one more per tick while they wake would ratchet the pool to its maximum)
        need = _within(max(need, signals.active_now + 1), policy)
        reasons.append(f"guard: {guard} -> {need} ACTIVE, no scale-down while it holds")
    # scale to zero (core/zero.py): demand in the idle window keeps one ACTIVE, none
    # for the window lets the pool sleep, a wake request wakes it
    to_zero = zero.decide(base, signals.wake_at, load, now, policy)
    if to_zero.floor:
        need = max(need, 1)
    if base.active == 0 or (to_zero.may_sleep and to_zero.reasons):
        reasons = [*to_zero.reasons, *reasons]  # what moves the pool says so first
    else:
        reasons.extend(to_zero.reasons)
    hold = bool(guard) or failing_over or moving is not None
    window_s = _window_s(base, state, policy, now, horizon, reasons)
    step = _next_active(
        base,
        need,
        now,
        window_s,
        hold_down=hold,
        backlog=backlog,
        serving=serving,
        horizon=horizon,
        min_active=policy.min_active,
        reasons=reasons,
    )
    active, lower_since, window = step.active, step.lower_since, step.window
    floor = guard_lesson.floor(lesson, near.upper)
    if lesson is not None and floor and active < base.active and active < floor:
        # the size the guard found missing at this load: not again (core/guard_lesson.py)
        held = min(base.active, floor)
        reasons.append(guard_lesson.reason(lesson, policy, wanted=active, held=held))
        active = held
    if to_zero.may_sleep and not hold:
        # no load for the idle window (the band of a series at zero is noise, not load);
        # the window was the step's stable window
        active, lower_since, window = 0, None, ()
    if failing_over and need < base.active:
        reasons.append("failed over: the pool keeps its size to come back")
    # WARM for the load expected two horizons ahead (its point: the band is ACTIVE's
    # margin; at a ramp's knee the band's top would launch replicas that arrive after
    # it, to sit WARM on the plateau)
    more = max(0, math.ceil(far.point / per - _EPS) - active)
    if more and moving is not None and not _settled(moving, now, policy):
        # a failover's arrival is a step, not a trend: ACTIVE is sized for it already,
        # and the forecast two horizons ahead would launch the step extrapolated
        reasons.append(
            f"no WARM for the forecast {2 * horizon:g} s ahead ({far.point:.3g} rps): "
            f"the failover from {moving.source} is still arriving"
        )
        more = 0
    # the planned burst beyond what ACTIVE bears now, as new traffic: at the usual hit
    # rate (a collapse of this minute's raises ACTIVE, not the standby with it)
    per_usual = max(capacity.per_replica(usual), _EPS)
    standby = planned_standby(policy, active, per, per_usual)
    warm = zero.warm_at_zero(
        active, min(policy.max_active, warm_wanted(policy, more, standby)), policy
    )
    if standby > policy.burst_warm + more:
        reasons.append(
            f"{standby} WARM to reach standby_rps {policy.standby_rps:g} at the usual hit "
            f"rate {usual:.2f} ({per_usual:.3g} rps per replica; burst_warm within it)"
        )
    elif more:
        reasons.append(f"{more} WARM for the forecast {2 * horizon:g} s ahead")
    # score the forecasts now due against the rate this report shows (the filtered level:
    # a forecast is of the rate, not of one round's count) and remember this one
    missed = forecast_error.track(
        forecast_error.Tracked(base.forecast_due, base.forecast_error, base.forecast_error_samples),
        observed=state.level,
        seen=seen,
        predicted=near.point,
        horizon=horizon,
    )
    note = None
    if budget is not None:  # a constraint equal to the SLO's: it caps, the ladder sheds
        floor = min(policy.max_active, policy.burst_warm + more)
        active, warm, note = budget.constrain(
            active=active,
            warm=warm,
            floor_warm=floor,
            base=base,
            min_active=policy.min_active,
            now=now,
            reasons=reasons,
        )
    return _settle(
        base,
        stored,
        active=active,
        warm=warm,
        now=now,
        policy=policy,
        reasons=tuple(reasons),
        # held at what serves lets no replica go: no scale-down (those below it are)
        not_down=step.held is not None and active >= step.held,
        update={
            "forecast": state,
            "hit_rate": hit,
            "standby_hit_rate": usual,
            "load_rps": signals.load_rps,
            "forecast_rps": near.point,
            "upper_rps": near.upper,
            "per_replica_rps": per,
            "capacity": capacity.source,
            "guard": guard,
            "guard_at": now if guard else base.guard_at,
            "backlog_asked": backlog if active >= base.active else None,
            "lower_since": lower_since,
            "window": window,
            "incoming": incoming,
            "demand_at": to_zero.demand_at,
            "woken_at": to_zero.woken_at,
            "budget": note,
            "forecast_due": missed.due,
            "forecast_error": missed.error,
            "forecast_error_samples": missed.samples,
            "lesson": lesson,
        },
    )


def _ahead(
    state: ForecastState, load: float, policy: ScalingPolicy, horizon: float
) -> tuple[forecast.Forecast, forecast.Forecast]:
    """The forecast one horizon ahead and two (WARM's); until the filter has seen
    ``WARMUP`` reports its trend is a guess: the load now, for both (and always with
    the forecast off)."""
    if not _forecasting(state, policy):
        now = forecast.Forecast(point=load, upper=load)
        return now, now
    return (
        forecast.predict(state, horizon, policy.band_z),
        forecast.predict(state, 2 * horizon, policy.band_z),
    )


def _forecasting(state: ForecastState, policy: ScalingPolicy) -> bool:
    return policy.forecast and state.observations >= WARMUP


def planned_standby(policy: ScalingPolicy, active: int, per: float, per_usual: float) -> int:
    """WARM replicas for the burst planned for (``standby_rps``) beyond what ``active``
    bear at ``per`` requests/s each, counted at ``per_usual`` (the usual hit rate's)."""
    beyond = max(0.0, policy.standby_rps - active * per)
    return math.ceil(beyond / max(per_usual, _EPS) - _EPS)


def warm_wanted(policy: ScalingPolicy, more: int, standby: int) -> int:
    """WARM the pool asks for: ``burst_warm`` and the ``more`` the forecast needs, or the
    planned burst's ``standby`` where that is larger. ``burst_warm`` is the margin for a
    burst nobody sized and the standby that burst sized, so they are not added (the sum
    kept one WARM beyond the plan always)."""
    return max(policy.burst_warm + more, standby)


def _window_s(
    base: ScaleRecord,
    state: ForecastState,
    policy: ScalingPolicy,
    now: float,
    horizon: float,
    reasons: list[str],
) -> float:
    """How long a scale-down waits: the stable window, or ``decline_window_s`` (one
    horizon unless set) while the load is falling for sure, unless the pool went up
    within a stable window (a noisy load can swing the trend filter up, then down: the
    way back down waits the whole window, so the size changes direction at most once
    per window whatever the filter does)."""
    if not _forecasting(state, policy) or not forecast.falling(state, DECLINE_Z):
        return policy.stable_window_s
    if base.direction is Direction.UP and now - base.changed_at < policy.stable_window_s:
        return policy.stable_window_s
    short = horizon if policy.decline_window_s is None else policy.decline_window_s
    short = min(short, policy.stable_window_s)
    if short < policy.stable_window_s:
        reasons.append(
            f"falling for sure (trend {state.trend:+.2g} rps/s, over {DECLINE_Z:g} "
            f"deviations): a scale-down waits {short:g} s, not {policy.stable_window_s:g}"
        )
    return short


def _backlog(
    base: ScaleRecord, guard: str, asked: int, serving: int | None, *, now: float, horizon: float
) -> int | None:
    """The most the forecast asked for during a guard episode that began while fewer
    replicas served than it asked for (the queue is the backlog of a step the pool was
    catching up to: at a hit-rate collapse, the minutes before the woken replicas serve);
    None for an episode that began at the size asked for (the size may be short: it
    holds a stable window, and the guard's lesson learns from a trip after it goes), or
    where no agent reports how many serve (``serving`` None: it holds, as before). A
    quiet tick is no end: the episode ends when the guard's replicas go, or when the
    forecast asks for the size and the guard has been quiet for a horizon."""
    if guard:
        if base.backlog_asked is not None:  # the same backlog
            return max(base.backlog_asked, asked)
        if not base.guard and serving is not None and serving < asked:  # begins short
            return asked
        return None
    if base.backlog_asked is None:
        return None
    quiet = base.guard_at is None or now - base.guard_at >= horizon
    if asked >= base.active and quiet:
        return None  # the forecast asks for the size: the guard's replicas are its own
    return base.backlog_asked


def _drain_s(
    signals: PoolSignals, ttft_slo_s: float | None, per: float, rate: float
) -> float | None:
    """Seconds the replicas serving take to clear the queue at what they bear beyond the
    ``rate`` expected; None where they bear no more, or where first tokens already miss
    the SLO (a miss users feel is not waited out)."""
    spare = signals.active_now * per - rate
    if spare <= 0 or _slo_missed(signals, ttft_slo_s):
        return None
    return (signals.queue_depth or 0.0) / spare


def _went_down(base: ScaleRecord, now: float, policy: ScalingPolicy) -> bool:
    """``_just_down``, for a record that says when (the guard's lesson: a record written
    before ``down_at`` did not, and its last change may have been WARM's)."""
    return base.down_at is not None and _just_down(base, now, policy)


def _just_down(base: ScaleRecord, now: float, policy: ScalingPolicy) -> bool:
    """ACTIVE went down within a stable window: counted from ``down_at``, not from
    ``changed_at``, which WARM moves too (each change of the standby held the pool to
    the load surely there for a window more, and the reason said it went down then)."""
    return base.direction is Direction.DOWN and now - _down_at(base) < policy.stable_window_s


def _down_at(base: ScaleRecord) -> float:
    """When ACTIVE last went down; a record written before ``down_at``: its last change."""
    return base.down_at if base.down_at is not None else base.changed_at


def _first(unit: str, active_now: int, policy: ScalingPolicy, now: float) -> ScaleRecord:
    """A pool never sized: at what serves now, within the bounds."""
    active = max(policy.min_active, min(policy.max_active, active_now))
    return ScaleRecord(
        unit=unit, active=active, warm=policy.burst_warm, decided_at=now, changed_at=now
    )


def _dark(
    base: ScaleRecord,
    stored: ScaleRecord | None,
    seen: float | None,
    now: float,
    policy: ScalingPolicy,
) -> Sized:
    """No fresh report: the size holds, the stable window starts again afterwards."""
    why = "no agent report" if seen is None else f"no agent report for {now - seen:.0f} s"
    return _settle(
        base,
        stored,
        active=base.active,
        warm=base.warm,
        now=now,
        policy=policy,
        reasons=(f"signal dark ({why}): the size holds",),
        update={
            "lower_since": None,
            "window": (),
            "load_rps": None,
            "forecast_rps": None,
            "upper_rps": None,
            "guard": "",
        },
    )


def _with_incoming(
    base: ScaleRecord,
    moving: Moving,
    need: int,
    upper: float,
    per: float,
    capacity: Capacity,
    policy: ScalingPolicy,
    now: float,
    reasons: list[str],
) -> tuple[Incoming, int]:
    """Sized for its own load before the failover plus the moved load at the hit rate it
    arrives with. The arrival is a step, not a trend: the forecast, which would
    extrapolate it, counts only once it has settled (two horizons)."""
    incoming, planned, why = _incoming(base.incoming, moving, upper, per, capacity)
    need = _within(max(planned, need) if _settled(moving, now, policy) else planned, policy)
    reasons.append(f"{why} -> {need} ACTIVE, no scale-down while it moves")
    return incoming, need


def _settled(moving: Moving, now: float, policy: ScalingPolicy) -> bool:
    """Whether a failover's moved load has had two horizons to arrive: from then the
    forecast, which would extrapolate its step, counts again."""
    return now - moving.started_at >= 2 * policy.horizon


def _incoming(
    last: Incoming | None, moving: Moving, upper: float, per: float, capacity: Capacity
) -> tuple[Incoming, int, str]:
    """The failover's record (the pool's own band when the first move began), the
    replicas that and the moved load need, and why. Moves that overlap are one episode
    (core/scale_tick sums them, named by the earliest still running): when that one
    ends and a later one goes on, the baseline stays the pool's own load from before
    any moved, not a band with the later move's load already in it."""
    same = last is not None and (last.source, last.started_at) == (
        moving.source,
        moving.started_at,
    )
    if same and last is not None:
        record = last
    else:
        own = last.baseline_rps if last is not None else upper
        record = Incoming(source=moving.source, started_at=moving.started_at, baseline_rps=own)
    moved_per = max(capacity.per_replica(moving.hit_rate), _EPS)
    planned = math.ceil(record.baseline_rps / per + moving.rps / moved_per - _EPS)
    why = (
        f"failover from {moving.source}: {moving.rps:.3g} rps moving here at hit rate "
        f"{moving.hit_rate:.2f} ({moved_per:.3g} rps per replica), beside "
        f"{record.baseline_rps:.3g} of its own"
    )
    return record, planned, why


def _within(n: int, policy: ScalingPolicy) -> int:
    return max(policy.min_active, min(policy.max_active, n))


def _smoothed_hit(last: float | None, seen: float | None, cap: float) -> float:
    """The hit rate sized on: a rise is smoothed (one high report is no capacity yet), a
    fall is believed at once (the capacity it takes is gone now: a prompt template that
    changed collapses it within seconds)."""
    if seen is None:
        return min(cap, last or 0.0)
    seen = min(cap, max(0.0, seen))
    if last is None or seen < last:
        return seen
    return (1 - HIT_WEIGHT) * last + HIT_WEIGHT * seen


def _usual_hit(base: ScaleRecord, hit: float, seen: float, policy: ScalingPolicy) -> float:
    """The hit rate over about ``standby_hit_window_s``: an exponential mean of the
    smoothed one, weighted by the time since the last report folded in."""
    last = base.standby_hit_rate
    if last is None or base.forecast is None:
        return hit
    dt = max(0.0, seen - base.forecast.observed_at)
    keep = math.exp(-dt / policy.standby_hit_window_s)
    return keep * last + (1 - keep) * hit


def _guard(signals: PoolSignals, ttft_slo_s: float | None, policy: ScalingPolicy) -> str:
    """Why the forecast missed, from what the replicas show now ("" when it did not)."""
    why = []
    per = (signals.queue_depth or 0.0) / max(1, signals.active_now)
    if per > policy.guard_queue_per_replica:
        why.append(f"{per:.3g} waiting per replica > {policy.guard_queue_per_replica:g}")
    if _slo_missed(signals, ttft_slo_s):
        why.append(f"first-token p99 {signals.ttft_p99_s:.3g} s > {ttft_slo_s:g} s")
    return ", ".join(why)


def _slo_missed(signals: PoolSignals, ttft_slo_s: float | None) -> bool:
    p99 = signals.ttft_p99_s
    return ttft_slo_s is not None and p99 is not None and p99 > ttft_slo_s


class _Next(NamedTuple):
    """ACTIVE after this tick, since when the forecast has asked for fewer, what it
    asked for over the window, and the size held at what serves (None: not held so)."""

    active: int
    lower_since: float | None
    window: tuple[tuple[float, int], ...]
    held: int | None = None


def _next_active(
    base: ScaleRecord,
    need: int,
    now: float,
    window_s: float,
    *,
    hold_down: bool,
    backlog: int | None,
    serving: int | None,
    horizon: float,
    min_active: int,
    reasons: list[str],
) -> _Next:
    """ACTIVE after this tick, since when the forecast has asked for fewer, and what it
    asked for over the last stable window (a scale-down goes to the most of it, as an
    HPA's stabilisation window does).

    The window holds the replicas a pool has, not those still to come: once the
    forecast has asked for fewer for a horizon, a size the pool never reached (at a
    ramp's knee the trend asked for more than the top needs, and launches for it arrive
    minutes later) is held at what serves, or the ask now if more, so that the launches
    and wakes for the older asks, which the newest replaced, are called off. A guard
    that cleared a step's backlog (``backlog``: the most the forecast asked for during
    it) gives back what it added beyond that once quiet for a horizon."""
    if need >= base.active or hold_down:
        return _Next(max(need, base.active), None, ())
    since = base.lower_since if base.lower_since is not None else now
    window = _slide(base.window, now, need, now - window_s)
    peak, waited = min(window[0][1], base.active), now - since
    if waited >= window_s:
        if peak < base.active:
            reasons.append(f"asked for {peak} or fewer for the last {window_s:g} s: down to {peak}")
        return _Next(peak, since, window)
    if backlog is not None and waited >= horizon:
        to = min(base.active, max(backlog, peak))
        if to < base.active:
            reasons.append(
                f"the guard's {base.active - to} beyond the {backlog} asked for cleared a "
                f"step's backlog, quiet for {waited:.0f} s: down to {to}"
            )
            return _Next(to, since, window)
    reasons.append(f"scale-down to {peak} waits its stable window ({waited:.0f}/{window_s:g} s)")
    if serving is not None and serving < base.active and waited >= horizon:
        held = min(base.active, max(need, serving, min_active))
        if held < base.active:
            reasons.append(
                f"held at {held}: {serving} serve, {need} asked for now; the "
                f"{base.active - held} not up yet are not brought"
            )
        return _Next(held, since, window, held if held < base.active else None)
    return _Next(base.active, since, window)


def _slide(
    window: tuple[tuple[float, int], ...], now: float, need: int, cutoff: float
) -> tuple[tuple[float, int], ...]:
    """The window's falling staircase with ``need`` asked at ``now``, nothing before
    ``cutoff``: the most asked for over the window is its first step."""
    kept = [(t, n) for t, n in window if t > cutoff]
    while kept and kept[-1][1] <= need:
        kept.pop()
    return (*kept, (now, need))


def _settle(
    base: ScaleRecord,
    stored: ScaleRecord | None,
    *,
    active: int,
    warm: int,
    now: float,
    policy: ScalingPolicy,
    reasons: tuple[str, ...],
    update: dict[str, object],
    not_down: bool = False,
) -> Sized:
    """The record after this tick; ``not_down``: a lower ACTIVE that let no replica go
    (held at what serves), not a scale-down."""
    changed = stored is None or (active, warm) != (stored.active, stored.warm)
    direction, down_at = base.direction, base.down_at
    if stored is not None and active != stored.active and not (not_down and active < stored.active):
        direction = Direction.UP if active > stored.active else Direction.DOWN
        down_at = now if direction is Direction.DOWN else down_at
    record = base.model_copy(
        update={
            "active": active,
            "warm": warm,
            "decided_at": now,
            "changed_at": now if changed else (stored or base).changed_at,
            "direction": direction,
            "down_at": down_at,
            "reasons": reasons,
            **update,
        }
    )
    checkpoint_due = stored is None or now - stored.decided_at >= policy.checkpoint_s
    # a signal that went dark or came back is news for whoever reads the record
    lit = stored is not None and (stored.load_rps is None) != (record.load_rps is None)
    return Sized(record=record, changed=changed, due=changed or checkpoint_due or lit)


def restored(memory: ScaleRecord | None, stored: ScaleRecord | None) -> ScaleRecord | None:
    """The record to continue from: this leader's own newer state (decided since the
    last write), else what etcd holds (a new leader continues the forecast there)."""
    if memory is not None and (stored is None or memory.decided_at >= stored.decided_at):
        return memory
    return stored


__all__ = ["Capacity", "ForecastState", "Moving", "PoolSignals", "Sized", "restored", "size_pool"]
