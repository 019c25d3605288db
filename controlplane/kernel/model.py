"""Domain types shared by the pure core and the adapters.

Everything here is a frozen pydantic model: the core takes snapshots and returns
decisions, never mutating what it was given. Timestamps are seconds on the
control plane's clock (``Clock.now()``), never the reporter's, so that a skewed
agent clock cannot make a stale report look fresh.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    # Non-finite floats (a first-token p99 in the histogram's +Inf bucket is inf) are
    # written as "Infinity"/"NaN" strings, which read back as floats; JSON's default
    # null would make a stored record or audit entry unreadable.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")


class RegionState(StrEnum):
    NORMAL = "NORMAL"
    DEGRADED = "DEGRADED"
    FAILING_OVER = "FAILING_OVER"
    RECOVERED = "RECOVERED"


class Health(StrEnum):
    HEALTHY = "HEALTHY"
    DEGRADED = "DEGRADED"
    UNHEALTHY = "UNHEALTHY"
    UNKNOWN = "UNKNOWN"


class ObserverKind(StrEnum):
    AGENT = "agent"  # the region's own agent, reporting on its vLLM replicas
    PROBE = "probe"  # the control plane probing the agent itself
    GATEWAY = "gateway"  # a gateway reporting what its requests into the region saw


Signals = dict[str, float]


class HealthReport(Frozen):
    """One observer's view of one region at one moment."""

    region: str
    observer: str = Field(min_length=1, max_length=128)
    kind: ObserverKind
    health: Health
    signals: Signals = Field(default_factory=dict)
    received_at: float
    detail: str = ""


class RegionHealth(Frozen):
    """The folded verdict for a region, stored at ``regions/<r>/health``."""

    region: str
    verdict: Health = Health.UNKNOWN
    raw: Health = Health.UNKNOWN  # this tick's quorum result, before hysteresis
    bad_streak: int = 0
    good_streak: int = 0
    since: float = 0.0
    votes: dict[str, Health] = Field(default_factory=dict)
    signals: Signals = Field(default_factory=dict)
    evaluated_at: float = 0.0  # hysteresis counts evaluations, at most one per probe interval


class Decision(Frozen):
    """One state transition and why it happened: persisted, audited, streamed."""

    region: str
    from_state: RegionState
    to_state: RegionState
    trigger: str
    reason: str
    actor: str
    at: float
    epoch: int
    signals: Signals = Field(default_factory=dict)


class FailoverPlan(Frozen):
    source: str
    targets: dict[str, float]  # region -> weight, weights sum to 1
    forced: bool = False
    manual: bool = False
    warm_first: bool = False  # manual or degraded source: pre-warm before the switch
    reason: str
    actor: str
    headroom_short: bool = False  # targets together cannot absorb the source's load
    notes: list[str] = Field(default_factory=list)


class FailoverStep(StrEnum):
    PREWARM = "prewarm"
    SWITCH = "switch"


class FailoverProgress(Frozen):
    """How far a failover got; a new leader resumes from the first missing step."""

    plan: FailoverPlan
    started_at: float
    done: tuple[FailoverStep, ...] = ()
    prewarm_result: dict[str, float] = Field(default_factory=dict)


class RecoveryStep(StrEnum):
    PREWARM = "prewarm"  # the region's own top prefixes replayed on it before traffic returns


class RecoveryProgress(Frozen):
    """How far graduated recovery got; a new leader resumes from here."""

    step: int = 0  # 0..steps; weight back home = step / steps
    steps: int = 10
    last_step_at: float = 0.0
    held: bool = False  # paused: health not HEALTHY, or the signal guard (guard_at)
    # Steps before the first traffic step (chosen when recovery began) and those done.
    planned: tuple[RecoveryStep, ...] = ()
    done: tuple[RecoveryStep, ...] = ()
    prewarm_result: dict[str, float] = Field(default_factory=dict)
    # The signal guard: when it last stepped the weight back (None: not engaged), and
    # since when the signals have been calm again (None: still breaching).
    guard_at: float | None = None
    calm_since: float | None = None


class RegionRecord(Frozen):
    """Value of ``regions/<r>/state``."""

    region: str
    state: RegionState = RegionState.NORMAL
    epoch: int = 0
    reason: str = "initial"
    since: float = 0.0
    last_decision: Decision | None = None
    failover: FailoverProgress | None = None
    recovery: RecoveryProgress | None = None
    last_failover_at: float | None = None


class Routing(Frozen):
    """Value of ``routing/<r>``: where traffic homed in ``r`` goes."""

    targets: dict[str, float]
    epoch: int = 0


class Readiness(Frozen):
    """Value of ``regions/<r>/readiness``, written by the drill runner."""

    passed: bool
    drill: str = ""
    at: float = 0.0
    # An operator's override of a failed verdict (the region takes traffic again);
    # cleared by the next drill's verdict.
    override_reason: str = ""
    override_actor: str = ""
    override_at: float = 0.0


class IntentKind(StrEnum):
    FAILOVER = "failover"
    RECOVER = "recover"


class Intent(Frozen):
    """An operator command, written by the API and carried out by the leader's loop."""

    id: str
    kind: IntentKind
    region: str
    targets: tuple[str, ...] = ()
    reason: str
    actor: str
    force: bool = False
    created_at: float


class AuditEntry(Frozen):
    at: float
    actor: str
    action: str
    region: str = ""
    reason: str = ""
    result: str = "ok"
    decision: Decision | None = None
    details: dict[str, str] = Field(default_factory=dict)


class ControlFlags(Frozen):
    """Value of ``control``: automation pause, set by operators."""

    paused: bool = False
    reason: str = ""
    actor: str = ""
    at: float = 0.0
