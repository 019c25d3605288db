"""A pool's desired size, as the leader's scaler decides it (``scale/<unit>``).

The region agent's warm pool follows ``active`` and ``warm`` level-triggered; the rest
of the record is the scaler's own: why it decided so (``reasons``, also audited), the
forecaster's state (so that a new leader continues a ramp instead of starting from
nothing) and the stable window a scale-down waits out. ``ScalingPolicy`` is the
topology's ``scaling:`` section (docs/scaling.md).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen
from controlplane.kernel.pool.cost import BudgetNote

# The agent's report: the p95 of its pool's last wakes (WARM -> ACTIVE), seconds. The
# scaler's horizon is never shorter (a replica asked for later than that comes late).
ACTIVATION_SIGNAL = "activation_p95_s"
# The agent's report: the replicas per second its pool's last batches of wakes achieved
# (regions/pool/wake_rate.py); the sizing formula's measured activation rate.
ACTIVATION_RATE_SIGNAL = "activation_rate"
# The agent's report: 1 while its pool is at zero on purpose, or waking from it (scale
# to zero): asleep, not down; the leader's health fold never counts it down.
ASLEEP_SIGNAL = "asleep"


class Direction(StrEnum):
    UP = "up"
    DOWN = "down"
    HOLD = "hold"


class ForecastState(Frozen):
    """The forecaster of one series (controlplane/core/forecast.py): a local-linear-trend
    Kalman filter (the rate and its trend per second, their covariance ``p_ll``,
    ``p_lt``, ``p_tt``, its change detector's sums), the mean interval between
    observations, the time of the last one folded in (an observation no newer is not
    folded again), and the flat model beside it. A record written before the flat model
    starts on the trend filter (``flat`` False) and hands to the level as a flat load
    shows itself."""

    level: float
    trend: float = 0.0
    p_ll: float = Field(ge=0)
    p_lt: float = 0.0
    p_tt: float = Field(ge=0)
    interval_s: float = Field(1.0, gt=0)
    observed_at: float
    observations: int = Field(1, ge=1)
    # the change detector's sums (a two-sided CUSUM of normalised innovations): a ramp
    # half seen when the leader changed is seen by the next one as soon
    drift_up: float = Field(0.0, ge=0)
    drift_down: float = Field(0.0, ge=0)
    # the flat model beside it (a local level with a long memory): whether it is the one
    # believed, its level and variance, its change detector's sums, how many reports in
    # a row the trend filter has not leant (to hand back), and how much noisier than
    # Poisson the reports are (both filters' report noise is scaled by it)
    flat: bool = False
    flat_level: float | None = None
    flat_var: float = Field(0.0, ge=0)
    flat_up: float = Field(0.0, ge=0)
    flat_down: float = Field(0.0, ge=0)
    still: int = Field(0, ge=0)
    dispersion: float = Field(1.0, ge=1)


class Incoming(Frozen):
    """A failover moving load onto this pool: which (``source``, ``started_at``), and
    the upper band of this pool's own load when the scaler first saw it (what the pool
    is sized for besides the moved load while it moves)."""

    source: str
    started_at: float
    baseline_rps: float = Field(ge=0)


class GuardLesson(Frozen):
    """What the reactive guard taught: it tripped soon after a scale-down to ``active``
    ACTIVE replicas, sized for ``load_rps`` (the forecast's upper band then) at
    ``hit_rate``, so that size misses at that load whatever the capacity record says.
    While it holds, the scaler does not go back down to it at that load
    (core/guard_lesson.py)."""

    at: float  # when the guard tripped
    active: int = Field(ge=1)
    load_rps: float = Field(ge=0)
    hit_rate: float = Field(ge=0, le=1)


class ScaleRecord(Frozen):
    unit: str = Field(min_length=1)  # the failover unit: a region, or <region>.<pool>
    active: int = Field(ge=0)  # replicas serving
    warm: int = Field(ge=0)  # replicas asleep, ready to wake within the horizon
    decided_at: float
    changed_at: float  # when active or warm last changed
    direction: Direction = Direction.HOLD  # of the last change
    down_at: float | None = None  # when ACTIVE last went down (None: never)
    reasons: tuple[str, ...] = ()
    # What it sized on, for status, failoverctl, the dashboard and metrics (None: the
    # signal was dark): the load reported, the forecast a horizon ahead and its upper
    # band, what one replica bears at the hit rate used, and where that comes from.
    load_rps: float | None = None
    forecast_rps: float | None = None
    upper_rps: float | None = None
    per_replica_rps: float | None = None
    capacity: str = ""
    # why the reactive guard tripped ("" it did not): it adds a replica, or holds the
    # size where the replicas a step asked for clear its backlog within a horizon
    guard: str = ""
    guard_at: float | None = None  # when the guard last tripped (None: never)
    # a guard episode that began while the pool was still waking to what the forecast
    # asked (a step's backlog, not a size that misses): the most the forecast asked
    # during it, which its extra replicas go back to one horizon after it ends (None:
    # no such episode, or they went, or the forecast asked for the size since and the
    # guard has been quiet for a horizon)
    backlog_asked: int | None = Field(None, ge=0)
    forecast: ForecastState | None = None  # of the served requests/s
    hit_rate: float | None = None  # smoothed prefix-cache hit rate, as used
    # the hit rate over about ``scaling.standby_hit_window_s`` (an EWMA): what the
    # standby counts on for a burst (None: no report yet)
    standby_hit_rate: float | None = None
    # since when the forecast has asked for fewer ACTIVE replicas than the record has,
    # without a break: a scale-down waits a stable window from here (None: not asking)
    lower_since: float | None = None
    # what it asked for in the last stable window, as a falling staircase of
    # (time, ACTIVE): the first is the most, the size a scale-down goes to
    window: tuple[tuple[float, int], ...] = ()
    incoming: Incoming | None = None  # a failover moving load here (None: none)
    budget: BudgetNote | None = None  # what the budget made of it (None: no cost:)
    # Scale to zero (``scaling.idle_to_zero_s``): the last time the pool had demand (load
    # reported, or a wake request), and the wake request last honoured (None: none).
    demand_at: float | None = None
    woken_at: float | None = None
    # How far the forecasts missed (core/forecast_error.py): forecasts awaiting the report
    # a horizon later, as (due_at, predicted rps), at most 8; the EWMA of the relative
    # miss |observed - predicted| / max(observed, 10 rps) (None: none scored yet) and how
    # many it folded. In the record so that a new leader continues it.
    forecast_due: tuple[tuple[float, float], ...] = Field((), max_length=8)
    forecast_error: float | None = Field(None, ge=0)
    forecast_error_samples: int = Field(0, ge=0)
    # the reactive guard's lesson about the capacity (core/guard_lesson.py; None: none
    # fresh): in the record so that a new leader does not go back to the size that missed
    lesson: GuardLesson | None = None

    @property
    def asleep(self) -> bool:
        """Zero ACTIVE on purpose: the scaler put the pool to sleep, it is not down."""
        return self.active == 0


class WakeRequest(Frozen):
    """``wake/<unit>``: a data plane got a request for a pool with no ACTIVE replica.
    Written at most once per ``WAKE_REWRITE_S`` by each writer (not once per request);
    the leader's scaler counts one newer than the pool's sleep as demand."""

    unit: str = Field(min_length=1)
    at: float  # wall-clock seconds of the request that asked
    by: str = ""  # the gateway or picker that wrote it


# A data plane rewrites its wake request at most this often while it holds requests
# (the leader needs one fresh request, not one per client request).
WAKE_REWRITE_S = 2.0


class ScalingPolicy(Frozen):
    """The topology's ``scaling:`` section: unset, the leader sizes no pool."""

    forecast: Annotated[
        bool,
        Field(
            description="size for the forecast's upper band a horizon ahead; false: for "
            "the load now (reactive: the warm pool and the guard alone)"
        ),
    ] = True
    horizon_s: Annotated[
        float,
        Field(
            gt=0,
            description="how far ahead the load is forecast; a pool is sized for the "
            "forecast's upper band this far ahead (never shorter than activation_s)",
        ),
    ] = 30.0
    activation_s: Annotated[
        float,
        Field(ge=0, description="WARM -> ACTIVE, p95 (vLLM sleep mode's wake, measured)"),
    ] = 5.0
    activation_rate: Annotated[
        float,
        Field(
            gt=0,
            description="wakes a pool carries out per second (they share a host); stands "
            "in until the pool's agent measures it (its batches of wakes)",
        ),
    ] = 0.5
    min_active: Annotated[int, Field(ge=0, description="never fewer ACTIVE replicas")] = 1
    max_active: Annotated[int, Field(ge=1, description="never more ACTIVE replicas")] = 64
    burst_warm: Annotated[
        int,
        Field(
            ge=0,
            description="WARM replicas kept for a burst beyond the forecast; within "
            "standby_rps's WARM where that is more (the planned burst, sized)",
        ),
    ] = 1
    standby_rps: Annotated[
        float,
        Field(
            ge=0,
            description="a load the pool must be able to carry within one horizon at "
            "any time (the burst it plans for, requests/s): WARM replicas cover what "
            "ACTIVE does not, at the pool's hit rate over standby_hit_window_s; burst_warm "
            "counts within them; 0: none beyond burst_warm",
        ),
    ] = 0.0
    standby_hit_window_s: Annotated[
        float,
        Field(
            gt=0,
            description="the hit rate a planned burst (standby_rps) is counted at is "
            "averaged over about this long (an exponential mean): a burst is new "
            "traffic, which arrives at the pool's usual hit rate, not at this minute's "
            "(a hit-rate collapse raises ACTIVE at once, and the standby only slowly)",
        ),
    ] = 3600.0
    stable_window_s: Annotated[
        float,
        Field(
            ge=0,
            description="the forecast asks for fewer replicas this long before "
            "any goes (through IDLE)",
        ),
    ] = 120.0
    decline_window_s: Annotated[
        float | None,
        Field(
            ge=0,
            description="while the load is falling for sure (the trend filter believed, "
            "its trend over 4 deviations down), a scale-down waits this long instead of "
            "stable_window_s (at most that); unset: one horizon. A stable window guards "
            "against noise, and a significant trend is not noise: on the reference ramp's "
            "way down the full window held the peak's replicas for 120 s",
        ),
    ] = None
    band_z: Annotated[
        float, Field(gt=0, description="the upper band, in residual deviations (P90: 1.28)")
    ] = 1.2816
    max_hit_rate: Annotated[
        float, Field(gt=0, lt=1, description="the hit rate a forecast may count on, at most")
    ] = 0.95
    dark_after_s: Annotated[
        float,
        Field(gt=0, description="no fresh agent report this long: the size holds"),
    ] = 15.0
    guard_queue_per_replica: Annotated[
        float,
        Field(
            gt=0,
            description="waiting requests per ACTIVE replica that add one "
            "replica whatever the forecast says",
        ),
    ] = 4.0
    guard_lesson_s: Annotated[
        float,
        Field(
            ge=0,
            description="when the guard trips soon after a scale-down, the size the "
            "pool went down to misses at that load (the capacity record overstates what "
            "a replica bears): for this long (or until the capacity is measured again) "
            "the scaler does not go back down to it while the load is as high, instead "
            "of missing once a stable window; 0: off",
        ),
    ] = 3600.0
    checkpoint_s: Annotated[
        float,
        Field(gt=0, description="the forecaster's state is written at least this often"),
    ] = 10.0

    idle_to_zero_s: Annotated[
        float | None,
        Field(
            gt=0,
            description="scale to zero: with min_active 0, a pool that had no load and "
            "no wake request this long goes to 0 ACTIVE (asleep on purpose, never "
            "failed over); its next request wakes it. null: off",
        ),
    ] = None
    zero_state: Annotated[
        Literal["warm", "cold"],
        Field(
            description="what a pool at zero keeps: warm (burst_warm replicas asleep, at "
            "least one: a wake in seconds) or cold (none: a launch, then a wake)"
        ),
    ] = "warm"

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.max_active < self.min_active:
            raise ValueError("scaling.max_active must be >= min_active")
        if self.idle_to_zero_s is not None and self.min_active > 0:
            raise ValueError("scaling.idle_to_zero_s needs min_active: 0")
        return self

    @property
    def horizon(self) -> float:
        """The horizon used: never shorter than a wake."""
        return max(self.horizon_s, self.activation_s)
