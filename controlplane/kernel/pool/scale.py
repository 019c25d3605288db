"""A pool's desired size, as the leader's scaler decides it (``scale/<unit>``).

The region agent's warm pool follows ``active`` and ``warm`` level-triggered; the rest
of the record is the scaler's own: why it decided so (``reasons``, also audited), the
forecaster's state (so that a new leader continues a ramp instead of starting from
nothing) and the stable window a scale-down waits out. ``ScalingPolicy`` is the
topology's ``scaling:`` section (docs/scaling.md).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen

# The agent's report: the p95 of its pool's last wakes (WARM -> ACTIVE), seconds. The
# scaler's horizon is never shorter (a replica asked for later than that comes late).
ACTIVATION_SIGNAL = "activation_p95_s"


class Direction(StrEnum):
    UP = "up"
    DOWN = "down"
    HOLD = "hold"


class ForecastState(Frozen):
    """A local-linear-trend Kalman filter of one series (controlplane/core/forecast.py):
    the rate and its trend per second, their covariance (``p_ll``, ``p_lt``, ``p_tt``),
    the mean interval between observations, and the time of the last one folded in
    (an observation no newer is not folded again)."""

    level: float
    trend: float = 0.0
    p_ll: float = Field(ge=0)
    p_lt: float = 0.0
    p_tt: float = Field(ge=0)
    interval_s: float = Field(1.0, gt=0)
    observed_at: float
    observations: int = Field(1, ge=1)


class Incoming(Frozen):
    """A failover moving load onto this pool: which (``source``, ``started_at``), and
    the upper band of this pool's own load when the scaler first saw it (what the pool
    is sized for besides the moved load while it moves)."""

    source: str
    started_at: float
    baseline_rps: float = Field(ge=0)


class ScaleRecord(Frozen):
    unit: str = Field(min_length=1)  # the failover unit: a region, or <region>.<pool>
    active: int = Field(ge=0)  # replicas serving
    warm: int = Field(ge=0)  # replicas asleep, ready to wake within the horizon
    decided_at: float
    changed_at: float  # when active or warm last changed
    direction: Direction = Direction.HOLD  # of the last change
    reasons: tuple[str, ...] = ()
    # What it sized on, for status, failoverctl, the dashboard and metrics (None: the
    # signal was dark): the load reported, the forecast a horizon ahead and its upper
    # band, what one replica bears at the hit rate used, and where that comes from.
    load_rps: float | None = None
    forecast_rps: float | None = None
    upper_rps: float | None = None
    per_replica_rps: float | None = None
    capacity: str = ""
    guard: str = ""  # why the reactive guard added a replica ("" it did not)
    forecast: ForecastState | None = None  # of the served requests/s
    hit_rate: float | None = None  # smoothed prefix-cache hit rate, as used
    # since when the forecast has asked for fewer ACTIVE replicas than the record has,
    # without a break: a scale-down waits a stable window from here (None: not asking)
    lower_since: float | None = None
    # what it asked for in the last stable window, as a falling staircase of
    # (time, ACTIVE): the first is the most, the size a scale-down goes to
    window: tuple[tuple[float, int], ...] = ()
    incoming: Incoming | None = None  # a failover moving load here (None: none)


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
        Field(gt=0, description="wakes a pool carries out per second (they share a host)"),
    ] = 0.5
    min_active: Annotated[int, Field(ge=0, description="never fewer ACTIVE replicas")] = 1
    max_active: Annotated[int, Field(ge=1, description="never more ACTIVE replicas")] = 64
    burst_warm: Annotated[
        int,
        Field(ge=0, description="WARM replicas kept for a burst beyond the forecast"),
    ] = 1
    standby_rps: Annotated[
        float,
        Field(
            ge=0,
            description="a load the pool must be able to carry within one horizon at "
            "any time (the burst it plans for, requests/s): WARM replicas cover what "
            "ACTIVE does not, at the forecast hit rate; 0: none beyond burst_warm",
        ),
    ] = 0.0
    stable_window_s: Annotated[
        float,
        Field(
            ge=0,
            description="the forecast asks for fewer replicas this long before "
            "any goes (through IDLE)",
        ),
    ] = 300.0
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
    checkpoint_s: Annotated[
        float,
        Field(gt=0, description="the forecaster's state is written at least this often"),
    ] = 10.0

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.max_active < self.min_active:
            raise ValueError("scaling.max_active must be >= min_active")
        return self

    @property
    def horizon(self) -> float:
        """The horizon used: never shorter than a wake."""
        return max(self.horizon_s, self.activation_s)
