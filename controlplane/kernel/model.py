"""Domain types shared by the pure core and the adapters.

Everything here is a frozen pydantic model: the core takes snapshots and returns
decisions, never mutating what it was given. Timestamps are seconds on the
control plane's clock (``Clock.now()``), never the reporter's, so that a skewed
agent clock cannot make a stale report look fresh.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator


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
    # vLLM's /version of the region's replicas, as its agent read them ("" unknown)
    engine_version: str = Field("", exclude_if=lambda v: not v)
    # Their serving configuration's fingerprint (kernel/capacity/serving.py; "" unknown)
    serving_config: str = Field("", exclude_if=lambda v: not v)


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
    # The engine the region runs, from its agents' latest fresh report ("" unknown):
    # a capacity probe of another engine is stale.
    engine_version: str = Field("", exclude_if=lambda v: not v)
    # Its serving configuration (kernel/capacity/serving.py's fingerprint), from the same reports:
    # a capacity probe under another configuration is stale too.
    serving_config: str = Field("", exclude_if=lambda v: not v)
    evaluated_at: float = 0.0  # hysteresis counts evaluations, at most one per probe interval


class Trigger(StrEnum):
    """What moves a region (the edges: ``controlplane/core/machine.py``); the value is
    what a ``Decision`` and the metrics show."""

    DEGRADE = "degrade"  # the region's SLOs are breached
    RESTORE = "restore"  # healthy again for the dwell
    FAIL_OVER = "fail_over"  # traffic leaves (automatic, a drain, or a failed drill)
    RECOVER = "recover"  # healthy for the dwell since the failover: traffic comes back
    COMPLETE = "complete"  # the last recovery step is home
    RELAPSE = "relapse"  # unhealthy again while recovering: traffic leaves again


# A trigger this version knows, or the text of one a newer version added. A decision is
# stored in ``regions/<r>/state`` and the audit log, which neighbouring versions read
# during a rolling upgrade: an unknown value must read as text, not make the whole
# record corrupt (the codec drops unknown fields; an enum that grows needs this).
TriggerValue = Annotated[Trigger | str, Field(union_mode="left_to_right")]


class Cause(StrEnum):
    """Who or what started a transition: metrics label it, events carry it, and the
    paging alert leaves out what a person or a drill started (runbooks/README.md)."""

    AUTOMATIC = "automatic"  # the leader, on what the observers saw
    MANUAL = "manual"  # an operator's intent (failoverctl failover/recover)
    DRILL = "drill"  # the leader, while a drill holds the lock on the region
    CAPACITY = "capacity"  # the ladder's steps, while the region is short of headroom
    BUDGET = "budget"  # the ladder's steps, while the budget holds a pool under its forecast


CauseValue = Annotated[Cause | str, Field(union_mode="left_to_right")]  # as TriggerValue


class Decision(Frozen):
    """One state transition and why it happened: persisted, audited, streamed."""

    region: str
    from_state: RegionState
    to_state: RegionState
    trigger: TriggerValue
    reason: str
    actor: str
    at: float
    epoch: int
    signals: Signals = Field(default_factory=dict)
    cause: CauseValue = Cause.AUTOMATIC  # absent from records written before causes


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
    # By what each target bears (docs/capacity.md): its capacity utilisation once it
    # carries its share, and the load no target could take (0: it fits).
    cbu_after: dict[str, float] = Field(default_factory=dict)
    shortfall_rps: float = Field(0.0, ge=0)
    # The source's load and hit rate when planned: what the scaler sizes the targets
    # for while it moves (docs/scaling.md); absent in plans made before it was kept.
    moved_rps: float = Field(0.0, ge=0, exclude_if=lambda v: not v)
    source_hit_rate: float = Field(0.0, ge=0, le=1, exclude_if=lambda v: not v)


class FailoverStep(StrEnum):
    PREWARM = "prewarm"
    SWITCH = "switch"


class PrewarmFigures(Frozen):
    """What one pre-warm did (a failover's on its targets, a recovery's on its home).

    Every figure is optional: each pre-warmer reports what it knows (none at all when
    nothing ran). Counts are floats, as they have always been stored. In etcd and the
    HTTP API it is one flat ``{name: number}`` object with the keys used before it was
    typed: ``skipped`` as ``skipped_<reason>`` and ``target_attained`` as
    ``target.<region>.attained_fraction``; a key this model does not know is kept in
    ``other`` so that a record written by another version still reads back.
    """

    budget_s: float | None = None
    targets: float | None = None  # targets asked to warm
    targets_unreachable: float | None = None  # of those, no agent or no final report
    catalog_entries: float | None = None
    catalog_age_s: float | None = None
    prefixes_total: float | None = None  # chosen to replay, over every target
    prefixes_warmed: float | None = None
    prefixes_failed: float | None = None
    planned_prefill_s: float | None = None
    elapsed_s: float | None = None  # the slowest target's
    attained_fraction: float | None = None  # warmed / total over every target
    verified: float | None = None  # replays sent a second time to check the cache
    verified_hit_rate: float | None = None
    prompt_tokens: float | None = None
    replicas_active: float | None = None
    held_s: float | None = None  # the test lab's HoldPrewarmer: how long it held
    waited_s: float | None = None  # with ``abandoned``: how long recovery waited
    # Why nothing (or not all) was warmed; stored as 1 when set, absent when not.
    unsupported: bool = False  # the pre-warmer cannot warm a recovering region
    failed: bool = False  # the pre-warmer raised
    abandoned: bool = False  # no result in time; recovery went on without
    skipped: dict[str, float] = Field(default_factory=dict)  # SkipReason value -> prefixes
    target_attained: dict[str, float] = Field(default_factory=dict)  # region -> fraction
    other: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _unflatten(cls, data: Any) -> Any:
        """The stored flat mapping (or keyword arguments) into the fields."""
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {}
        skipped, attained, other = {}, {}, {}
        for k, v in data.items():
            if k in cls.model_fields:
                out[k] = v
            elif k.startswith(_SKIPPED):
                skipped[k.removeprefix(_SKIPPED)] = v
            elif k.startswith(_TARGET) and k.endswith(_ATTAINED):
                attained[k[len(_TARGET) : -len(_ATTAINED)]] = v
            else:
                other[k] = v
        for name, part in (("skipped", skipped), ("target_attained", attained), ("other", other)):
            if part:
                out[name] = {**out.get(name, {}), **part}
        return out

    @model_serializer(mode="plain")
    def flat(self) -> dict[str, float]:
        """The stored form: one ``{key: number}`` mapping (see the class doc)."""
        out: dict[str, float] = {}
        for name in type(self).model_fields:
            v = getattr(self, name)
            if isinstance(v, bool):
                if v:
                    out[name] = 1.0
            elif isinstance(v, float | int):
                out[name] = float(v)
        out.update({f"{_SKIPPED}{k}": v for k, v in self.skipped.items()})
        out.update({f"{_TARGET}{k}{_ATTAINED}": v for k, v in self.target_attained.items()})
        out.update(self.other)
        return out

    def details(self) -> dict[str, str]:
        """The figures as audit ``details``: sorted keys, numbers in ``%g``."""
        return {k: f"{v:g}" for k, v in sorted(self.flat().items())}

    @classmethod
    def from_details(cls, details: dict[str, str]) -> PrewarmFigures:
        """Read back :meth:`details`; a value that is not a number is left out."""
        out: dict[str, float] = {}
        for k, v in details.items():
            try:
                out[k] = float(v)
            except ValueError:
                continue
        return cls.model_validate(out)


_SKIPPED = "skipped_"
_TARGET, _ATTAINED = "target.", ".attained_fraction"


class FailoverProgress(Frozen):
    """How far a failover got; a new leader resumes from the first missing step."""

    plan: FailoverPlan
    started_at: float
    done: tuple[FailoverStep, ...] = ()
    prewarm_result: PrewarmFigures = Field(default_factory=PrewarmFigures)


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
    prewarm_result: PrewarmFigures = Field(default_factory=PrewarmFigures)
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


def default_routing(region: str) -> Routing:
    """The routing of a region no failover has touched (no ``routing/<r>`` key): all of
    its traffic stays home."""
    return Routing(targets={region: 1.0})


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

    # Never carried out without a field a newer version added (codec.decode).
    REFUSE_UNKNOWN_ON_READ: ClassVar[bool] = True

    id: str
    kind: IntentKind
    region: str
    targets: tuple[str, ...] = ()
    reason: str
    actor: str
    force: bool = False
    created_at: float


class LadderChange(StrEnum):
    """A move of a region's degradation ladder, as audited and as the drills judge it."""

    APPLY = "apply"
    REAPPLY = "reapply"  # the guard put back the last restored step
    RESTORE = "restore"


class AuditAction(StrEnum):
    """What an audit entry records; the value is what etcd and the APIs show.

    Some carry a kind in their name (``ladder_<change>``, ``intent_<kind>``,
    ``recovery_<step>``): build those with the ``of_*`` helpers and read the kind back
    with ``ladder_change`` / ``intent_kind`` rather than matching prefixes.
    """

    TRANSITION = "transition"  # a state change, with its decision
    PREWARM = "prewarm"  # a failover's pre-warm step done, its figures in details
    ROUTING_SWITCH = "routing_switch"  # a failover's switch
    SESSIONS_REPINNED = "sessions_repinned"  # the background re-pin after a switch
    SESSION_PIN = "session_pin"
    RECOVERY_PREWARM = "recovery_prewarm"  # recovery's pre-warm done (or given up)
    RECOVERY_STEP = "recovery_step"  # one increment more home; ``recovery_step`` detail
    RECOVERY_HOLD = "recovery_hold"
    RECOVERY_GUARD = "recovery_guard"
    RECOVERY_CALM = "recovery_calm"
    INTENT_FAILOVER = "intent_failover"
    INTENT_RECOVER = "intent_recover"
    LADDER_APPLY = "ladder_apply"
    LADDER_REAPPLY = "ladder_reapply"
    LADDER_RESTORE = "ladder_restore"
    PAUSE = "pause"
    RESUME = "resume"
    HOLD = "hold"  # an operator held one unit's automation (regions/<unit>/hold)
    RELEASE = "release"  # a hold ended: released by an operator, or expired
    BUDGET_LIFT = "budget_lift"  # an operator lifted a pool's budget (regions/<unit>/budget-lift)
    BUDGET_UNLIFT = "budget_unlift"  # a budget lift ended: by an operator, or expired
    READINESS_OVERRIDE = "readiness_override"
    DRILL_REQUESTED = "drill_requested"
    DRILL_RUN = "drill_run"
    DRILL_VERDICT = "drill_verdict"
    SPEC_PUBLISHED = "spec_published"  # the leader wrote the cluster spec; changes in details
    CAPACITY_MEASURED = "capacity_measured"  # a capacity probe wrote capacity/<r>
    SCALE = "scale"  # the scaler changed a pool's desired size (scale/<unit>)

    @classmethod
    def of_intent(cls, kind: IntentKind) -> AuditAction:
        return cls(f"{_INTENT}{kind.value}")

    @classmethod
    def of_recovery(cls, step: RecoveryStep) -> AuditAction:
        return cls(f"{_RECOVERY}{step.value}")

    @classmethod
    def of_ladder(cls, change: LadderChange) -> AuditAction:
        return cls(f"{_LADDER}{change.value}")

    @property
    def ladder_change(self) -> LadderChange | None:
        """The ladder move a ladder entry records, else None."""
        if not self.value.startswith(_LADDER):
            return None
        return LadderChange(self.value.removeprefix(_LADDER))

    @property
    def intent_kind(self) -> IntentKind | None:
        return (
            IntentKind(self.value.removeprefix(_INTENT)) if self.value.startswith(_INTENT) else None
        )


_INTENT, _RECOVERY, _LADDER = "intent_", "recovery_", "ladder_"
# Audit detail: the recovery step (``RecoveryProgress.step``) a ``recovery_step`` made.
RECOVERY_STEP_DETAIL = "recovery_step"


class AuditEntry(Frozen):
    at: float
    actor: str
    action: AuditAction
    region: str = ""
    reason: str = ""
    result: str = "ok"
    decision: Decision | None = None
    details: dict[str, str] = Field(default_factory=dict)

    @property
    def recovery_step(self) -> int | None:
        """The step a ``recovery_step`` entry made (its detail), else None."""
        text = self.details.get(RECOVERY_STEP_DETAIL)
        return int(text) if text is not None and text.isdigit() else None


PAUSE_DEFAULT_S = 3600.0  # a pause asked for without a length
PAUSE_MAX_S = 7 * 86400.0  # the longest pause: a week, renewed by pausing again


def pause_length(for_s: float) -> float:
    """A pause's length in seconds from what was asked (0: the default); ValueError
    naming the bounds otherwise."""
    if for_s == 0:
        return PAUSE_DEFAULT_S
    if not 0 < for_s <= PAUSE_MAX_S:  # also NaN
        raise ValueError(
            f"a pause lasts more than 0 s and at most {PAUSE_MAX_S:.0f} s (7 days), "
            f"not {for_s!r}; pause again to extend one"
        )
    return for_s


class ControlFlags(Frozen):
    """Value of ``control``: automation pause, set by operators. A pause ends by itself
    at ``until`` (the leader resumes automation then and audits it); None: a pause
    written before pauses expired, which holds until a resume."""

    paused: bool = False
    reason: str = ""
    actor: str = ""
    at: float = 0.0
    until: float | None = None

    def in_force(self, now: float) -> bool:
        """Paused at ``now``: set, and not expired."""
        return self.paused and (self.until is None or now < self.until)


class RegionHold(Frozen):
    """Value of ``regions/<unit>/hold``: an operator holds one failover unit's automation
    (its automatic transitions and recovery steps, its ladder and its scaler) while every
    other unit carries on, until ``until``: the leader then releases it and audits it.
    Lengths as a pause's (``pause_length``)."""

    unit: str
    reason: str
    actor: str
    at: float
    until: float

    def in_force(self, now: float) -> bool:
        return now < self.until

    def describe(self) -> str:
        return f"held by {self.actor or 'an operator'}: {self.reason}"
