from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REGION_STATE_UNSPECIFIED: _ClassVar[RegionState]
    NORMAL: _ClassVar[RegionState]
    DEGRADED: _ClassVar[RegionState]
    FAILING_OVER: _ClassVar[RegionState]
    RECOVERED: _ClassVar[RegionState]
    REGION_STATE_UNKNOWN: _ClassVar[RegionState]

class Health(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEALTH_UNSPECIFIED: _ClassVar[Health]
    HEALTHY: _ClassVar[Health]
    HEALTH_DEGRADED: _ClassVar[Health]
    UNHEALTHY: _ClassVar[Health]
    UNKNOWN: _ClassVar[Health]

class ObserverKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBSERVER_KIND_UNSPECIFIED: _ClassVar[ObserverKind]
    AGENT: _ClassVar[ObserverKind]
    PROBE: _ClassVar[ObserverKind]
    GATEWAY: _ClassVar[ObserverKind]

class IntentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTENT_STATE_UNSPECIFIED: _ClassVar[IntentState]
    INTENT_PENDING: _ClassVar[IntentState]
    INTENT_DONE: _ClassVar[IntentState]
    INTENT_REFUSED: _ClassVar[IntentState]
REGION_STATE_UNSPECIFIED: RegionState
NORMAL: RegionState
DEGRADED: RegionState
FAILING_OVER: RegionState
RECOVERED: RegionState
REGION_STATE_UNKNOWN: RegionState
HEALTH_UNSPECIFIED: Health
HEALTHY: Health
HEALTH_DEGRADED: Health
UNHEALTHY: Health
UNKNOWN: Health
OBSERVER_KIND_UNSPECIFIED: ObserverKind
AGENT: ObserverKind
PROBE: ObserverKind
GATEWAY: ObserverKind
INTENT_STATE_UNSPECIFIED: IntentState
INTENT_PENDING: IntentState
INTENT_DONE: IntentState
INTENT_REFUSED: IntentState

class RegionStatus(_message.Message):
    __slots__ = ("name", "zone", "state", "health", "epoch", "reason", "since", "routing", "barred", "signals", "votes", "failover_steps_done", "recovery_step", "recovery_steps", "degradation_steps", "capacity", "stored_state", "pool_of", "pool", "models", "scale", "hold", "budget_lift", "engine_version")
    class RoutingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class VotesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    BARRED_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    FAILOVER_STEPS_DONE_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_STEP_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_STEPS_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_STEPS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    STORED_STATE_FIELD_NUMBER: _ClassVar[int]
    POOL_OF_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    BUDGET_LIFT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    zone: str
    state: RegionState
    health: Health
    epoch: int
    reason: str
    since: float
    routing: _containers.ScalarMap[str, float]
    barred: bool
    signals: _containers.ScalarMap[str, float]
    votes: _containers.ScalarMap[str, str]
    failover_steps_done: str
    recovery_step: int
    recovery_steps: int
    degradation_steps: _containers.RepeatedScalarFieldContainer[str]
    capacity: RegionCapacity
    stored_state: RegionState
    pool_of: str
    pool: str
    models: _containers.RepeatedScalarFieldContainer[str]
    scale: PoolSize
    hold: UnitHold
    budget_lift: UnitHold
    engine_version: str
    def __init__(self, name: _Optional[str] = ..., zone: _Optional[str] = ..., state: _Optional[_Union[RegionState, str]] = ..., health: _Optional[_Union[Health, str]] = ..., epoch: _Optional[int] = ..., reason: _Optional[str] = ..., since: _Optional[float] = ..., routing: _Optional[_Mapping[str, float]] = ..., barred: _Optional[bool] = ..., signals: _Optional[_Mapping[str, float]] = ..., votes: _Optional[_Mapping[str, str]] = ..., failover_steps_done: _Optional[str] = ..., recovery_step: _Optional[int] = ..., recovery_steps: _Optional[int] = ..., degradation_steps: _Optional[_Iterable[str]] = ..., capacity: _Optional[_Union[RegionCapacity, _Mapping]] = ..., stored_state: _Optional[_Union[RegionState, str]] = ..., pool_of: _Optional[str] = ..., pool: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., scale: _Optional[_Union[PoolSize, _Mapping]] = ..., hold: _Optional[_Union[UnitHold, _Mapping]] = ..., budget_lift: _Optional[_Union[UnitHold, _Mapping]] = ..., engine_version: _Optional[str] = ...) -> None: ...

class UnitHold(_message.Message):
    __slots__ = ("reason", "actor", "at", "until")
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    reason: str
    actor: str
    at: float
    until: float
    def __init__(self, reason: _Optional[str] = ..., actor: _Optional[str] = ..., at: _Optional[float] = ..., until: _Optional[float] = ...) -> None: ...

class PoolSize(_message.Message):
    __slots__ = ("active", "warm", "reason", "decided_at")
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    WARM_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    active: int
    warm: int
    reason: str
    decided_at: float
    def __init__(self, active: _Optional[int] = ..., warm: _Optional[int] = ..., reason: _Optional[str] = ..., decided_at: _Optional[float] = ...) -> None: ...

class RegionCapacity(_message.Message):
    __slots__ = ("source", "reason", "cbu", "allowed_rps", "load_rps", "hit_rate", "warn_cbu", "page_cbu", "active_replicas", "measured_at", "knee_rps", "ultimate_rps", "ultimate_bounded", "r_base_rps", "beta", "factor_of_safety", "t_recover_s", "engine_version")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CBU_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_RPS_FIELD_NUMBER: _ClassVar[int]
    LOAD_RPS_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    WARN_CBU_FIELD_NUMBER: _ClassVar[int]
    PAGE_CBU_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_FIELD_NUMBER: _ClassVar[int]
    KNEE_RPS_FIELD_NUMBER: _ClassVar[int]
    ULTIMATE_RPS_FIELD_NUMBER: _ClassVar[int]
    ULTIMATE_BOUNDED_FIELD_NUMBER: _ClassVar[int]
    R_BASE_RPS_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    FACTOR_OF_SAFETY_FIELD_NUMBER: _ClassVar[int]
    T_RECOVER_S_FIELD_NUMBER: _ClassVar[int]
    ENGINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    source: str
    reason: str
    cbu: float
    allowed_rps: float
    load_rps: float
    hit_rate: float
    warn_cbu: float
    page_cbu: float
    active_replicas: int
    measured_at: float
    knee_rps: float
    ultimate_rps: float
    ultimate_bounded: bool
    r_base_rps: float
    beta: float
    factor_of_safety: float
    t_recover_s: float
    engine_version: str
    def __init__(self, source: _Optional[str] = ..., reason: _Optional[str] = ..., cbu: _Optional[float] = ..., allowed_rps: _Optional[float] = ..., load_rps: _Optional[float] = ..., hit_rate: _Optional[float] = ..., warn_cbu: _Optional[float] = ..., page_cbu: _Optional[float] = ..., active_replicas: _Optional[int] = ..., measured_at: _Optional[float] = ..., knee_rps: _Optional[float] = ..., ultimate_rps: _Optional[float] = ..., ultimate_bounded: _Optional[bool] = ..., r_base_rps: _Optional[float] = ..., beta: _Optional[float] = ..., factor_of_safety: _Optional[float] = ..., t_recover_s: _Optional[float] = ..., engine_version: _Optional[str] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("regions", "paused", "pause_reason", "leader", "responder", "responder_is_leader", "generated_at", "store", "paused_until", "ladder_steps", "ladder_sha256")
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PAUSE_REASON_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    LADDER_STEPS_FIELD_NUMBER: _ClassVar[int]
    LADDER_SHA256_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[RegionStatus]
    paused: bool
    pause_reason: str
    leader: str
    responder: str
    responder_is_leader: bool
    generated_at: float
    store: StoreWrites
    paused_until: float
    ladder_steps: _containers.RepeatedScalarFieldContainer[str]
    ladder_sha256: str
    def __init__(self, regions: _Optional[_Iterable[_Union[RegionStatus, _Mapping]]] = ..., paused: _Optional[bool] = ..., pause_reason: _Optional[str] = ..., leader: _Optional[str] = ..., responder: _Optional[str] = ..., responder_is_leader: _Optional[bool] = ..., generated_at: _Optional[float] = ..., store: _Optional[_Union[StoreWrites, _Mapping]] = ..., paused_until: _Optional[float] = ..., ladder_steps: _Optional[_Iterable[str]] = ..., ladder_sha256: _Optional[str] = ...) -> None: ...

class StoreWrites(_message.Message):
    __slots__ = ("writable", "reason", "since", "alarms")
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    ALARMS_FIELD_NUMBER: _ClassVar[int]
    writable: bool
    reason: str
    since: float
    alarms: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, writable: _Optional[bool] = ..., reason: _Optional[str] = ..., since: _Optional[float] = ..., alarms: _Optional[_Iterable[str]] = ...) -> None: ...

class HealthReport(_message.Message):
    __slots__ = ("region", "observer", "kind", "health", "signals", "detail", "engine_version", "serving_config")
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REGION_FIELD_NUMBER: _ClassVar[int]
    OBSERVER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVING_CONFIG_FIELD_NUMBER: _ClassVar[int]
    region: str
    observer: str
    kind: ObserverKind
    health: Health
    signals: _containers.ScalarMap[str, float]
    detail: str
    engine_version: str
    serving_config: str
    def __init__(self, region: _Optional[str] = ..., observer: _Optional[str] = ..., kind: _Optional[_Union[ObserverKind, str]] = ..., health: _Optional[_Union[Health, str]] = ..., signals: _Optional[_Mapping[str, float]] = ..., detail: _Optional[str] = ..., engine_version: _Optional[str] = ..., serving_config: _Optional[str] = ...) -> None: ...

class ReportHealthResponse(_message.Message):
    __slots__ = ("accepted", "thresholds", "model")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    thresholds: RegionThresholds
    model: str
    def __init__(self, accepted: _Optional[bool] = ..., thresholds: _Optional[_Union[RegionThresholds, _Mapping]] = ..., model: _Optional[str] = ...) -> None: ...

class RegionThresholds(_message.Message):
    __slots__ = ("queue_over", "ttft_p99_over_s", "error_rate_over")
    QUEUE_OVER_FIELD_NUMBER: _ClassVar[int]
    TTFT_P99_OVER_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_OVER_FIELD_NUMBER: _ClassVar[int]
    queue_over: int
    ttft_p99_over_s: float
    error_rate_over: float
    def __init__(self, queue_over: _Optional[int] = ..., ttft_p99_over_s: _Optional[float] = ..., error_rate_over: _Optional[float] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("region", "from_state", "to_state", "trigger", "reason", "actor", "at", "epoch", "signals", "cause")
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REGION_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    region: str
    from_state: RegionState
    to_state: RegionState
    trigger: str
    reason: str
    actor: str
    at: float
    epoch: int
    signals: _containers.ScalarMap[str, float]
    cause: str
    def __init__(self, region: _Optional[str] = ..., from_state: _Optional[_Union[RegionState, str]] = ..., to_state: _Optional[_Union[RegionState, str]] = ..., trigger: _Optional[str] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., at: _Optional[float] = ..., epoch: _Optional[int] = ..., signals: _Optional[_Mapping[str, float]] = ..., cause: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("id", "at", "action", "region", "actor", "reason", "result", "decision", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    id: str
    at: float
    action: str
    region: str
    actor: str
    reason: str
    result: str
    decision: Decision
    details: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., at: _Optional[float] = ..., action: _Optional[str] = ..., region: _Optional[str] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., result: _Optional[str] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("region", "replay")
    REGION_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    region: str
    replay: int
    def __init__(self, region: _Optional[str] = ..., replay: _Optional[int] = ...) -> None: ...

class FailoverRequest(_message.Message):
    __slots__ = ("region", "to", "reason", "force", "dry_run", "actor")
    REGION_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    region: str
    to: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    force: bool
    dry_run: bool
    actor: str
    def __init__(self, region: _Optional[str] = ..., to: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., force: _Optional[bool] = ..., dry_run: _Optional[bool] = ..., actor: _Optional[str] = ...) -> None: ...

class FailoverPlan(_message.Message):
    __slots__ = ("source", "targets", "forced", "warm_first", "headroom_short", "notes")
    class TargetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    FORCED_FIELD_NUMBER: _ClassVar[int]
    WARM_FIRST_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_SHORT_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    source: str
    targets: _containers.ScalarMap[str, float]
    forced: bool
    warm_first: bool
    headroom_short: bool
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, source: _Optional[str] = ..., targets: _Optional[_Mapping[str, float]] = ..., forced: _Optional[bool] = ..., warm_first: _Optional[bool] = ..., headroom_short: _Optional[bool] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class FailoverResponse(_message.Message):
    __slots__ = ("accepted", "intent_id", "plan", "dry_run")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    intent_id: str
    plan: FailoverPlan
    dry_run: bool
    def __init__(self, accepted: _Optional[bool] = ..., intent_id: _Optional[str] = ..., plan: _Optional[_Union[FailoverPlan, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class RecoveryRequest(_message.Message):
    __slots__ = ("region", "reason", "actor")
    REGION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    region: str
    reason: str
    actor: str
    def __init__(self, region: _Optional[str] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class IntentResponse(_message.Message):
    __slots__ = ("accepted", "intent_id")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    intent_id: str
    def __init__(self, accepted: _Optional[bool] = ..., intent_id: _Optional[str] = ...) -> None: ...

class GetIntentRequest(_message.Message):
    __slots__ = ("intent_id",)
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    def __init__(self, intent_id: _Optional[str] = ...) -> None: ...

class IntentStatus(_message.Message):
    __slots__ = ("intent_id", "kind", "region", "state", "detail", "reason", "actor", "targets", "requested_at", "decided_at", "decided_by", "epoch")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    kind: str
    region: str
    state: IntentState
    detail: str
    reason: str
    actor: str
    targets: _containers.RepeatedScalarFieldContainer[str]
    requested_at: float
    decided_at: float
    decided_by: str
    epoch: int
    def __init__(self, intent_id: _Optional[str] = ..., kind: _Optional[str] = ..., region: _Optional[str] = ..., state: _Optional[_Union[IntentState, str]] = ..., detail: _Optional[str] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., targets: _Optional[_Iterable[str]] = ..., requested_at: _Optional[float] = ..., decided_at: _Optional[float] = ..., decided_by: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("reason", "actor", "for_s")
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    FOR_S_FIELD_NUMBER: _ClassVar[int]
    reason: str
    actor: str
    for_s: float
    def __init__(self, reason: _Optional[str] = ..., actor: _Optional[str] = ..., for_s: _Optional[float] = ...) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("paused",)
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    def __init__(self, paused: _Optional[bool] = ...) -> None: ...

class HoldRequest(_message.Message):
    __slots__ = ("region", "reason", "actor", "for_s")
    REGION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    FOR_S_FIELD_NUMBER: _ClassVar[int]
    region: str
    reason: str
    actor: str
    for_s: float
    def __init__(self, region: _Optional[str] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., for_s: _Optional[float] = ...) -> None: ...

class HoldResponse(_message.Message):
    __slots__ = ("region", "held", "until")
    REGION_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    region: str
    held: bool
    until: float
    def __init__(self, region: _Optional[str] = ..., held: _Optional[bool] = ..., until: _Optional[float] = ...) -> None: ...

class HistoryRequest(_message.Message):
    __slots__ = ("region", "limit")
    REGION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    region: str
    limit: int
    def __init__(self, region: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class HistoryResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class PinSessionRequest(_message.Message):
    __slots__ = ("session_id", "region", "home", "reason", "actor")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    region: str
    home: str
    reason: str
    actor: str
    def __init__(self, session_id: _Optional[str] = ..., region: _Optional[str] = ..., home: _Optional[str] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "found", "home", "region", "epoch", "pinned_at", "moves")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PINNED_AT_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    found: bool
    home: str
    region: str
    epoch: int
    pinned_at: float
    moves: int
    def __init__(self, session_id: _Optional[str] = ..., found: _Optional[bool] = ..., home: _Optional[str] = ..., region: _Optional[str] = ..., epoch: _Optional[int] = ..., pinned_at: _Optional[float] = ..., moves: _Optional[int] = ...) -> None: ...

class ReadinessRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class RegionReadiness(_message.Message):
    __slots__ = ("region", "has_verdict", "passed", "drill", "at", "override_reason", "override_actor", "override_at", "barred")
    REGION_FIELD_NUMBER: _ClassVar[int]
    HAS_VERDICT_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    DRILL_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_REASON_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_ACTOR_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_AT_FIELD_NUMBER: _ClassVar[int]
    BARRED_FIELD_NUMBER: _ClassVar[int]
    region: str
    has_verdict: bool
    passed: bool
    drill: str
    at: float
    override_reason: str
    override_actor: str
    override_at: float
    barred: bool
    def __init__(self, region: _Optional[str] = ..., has_verdict: _Optional[bool] = ..., passed: _Optional[bool] = ..., drill: _Optional[str] = ..., at: _Optional[float] = ..., override_reason: _Optional[str] = ..., override_actor: _Optional[str] = ..., override_at: _Optional[float] = ..., barred: _Optional[bool] = ...) -> None: ...

class ReadinessResponse(_message.Message):
    __slots__ = ("regions",)
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[RegionReadiness]
    def __init__(self, regions: _Optional[_Iterable[_Union[RegionReadiness, _Mapping]]] = ...) -> None: ...

class ReadinessOverrideRequest(_message.Message):
    __slots__ = ("region", "reason", "actor")
    REGION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    region: str
    reason: str
    actor: str
    def __init__(self, region: _Optional[str] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class TopPrefixesRequest(_message.Message):
    __slots__ = ("region", "limit")
    REGION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    region: str
    limit: int
    def __init__(self, region: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class PrefixEntry(_message.Message):
    __slots__ = ("key", "tokens", "count", "sessions", "may_leave", "preview")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAY_LEAVE_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    key: str
    tokens: int
    count: float
    sessions: int
    may_leave: bool
    preview: str
    def __init__(self, key: _Optional[str] = ..., tokens: _Optional[int] = ..., count: _Optional[float] = ..., sessions: _Optional[int] = ..., may_leave: _Optional[bool] = ..., preview: _Optional[str] = ...) -> None: ...

class TopPrefixesResponse(_message.Message):
    __slots__ = ("region", "found", "generated_at", "gateways", "min_sessions", "entries")
    REGION_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    GATEWAYS_FIELD_NUMBER: _ClassVar[int]
    MIN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    region: str
    found: bool
    generated_at: float
    gateways: int
    min_sessions: int
    entries: _containers.RepeatedCompositeFieldContainer[PrefixEntry]
    def __init__(self, region: _Optional[str] = ..., found: _Optional[bool] = ..., generated_at: _Optional[float] = ..., gateways: _Optional[int] = ..., min_sessions: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[PrefixEntry, _Mapping]]] = ...) -> None: ...

class DrillsRequest(_message.Message):
    __slots__ = ("limit", "region")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    limit: int
    region: str
    def __init__(self, limit: _Optional[int] = ..., region: _Optional[str] = ...) -> None: ...

class DrillRun(_message.Message):
    __slots__ = ("id", "scenario", "region", "started_at", "ended_at", "passed", "dry_run", "aborted", "failed", "trigger", "report_path", "request_id", "criteria")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCENARIO_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    REPORT_PATH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CRITERIA_FIELD_NUMBER: _ClassVar[int]
    id: str
    scenario: str
    region: str
    started_at: float
    ended_at: float
    passed: bool
    dry_run: bool
    aborted: str
    failed: _containers.RepeatedScalarFieldContainer[str]
    trigger: str
    report_path: str
    request_id: str
    criteria: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., scenario: _Optional[str] = ..., region: _Optional[str] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., passed: _Optional[bool] = ..., dry_run: _Optional[bool] = ..., aborted: _Optional[str] = ..., failed: _Optional[_Iterable[str]] = ..., trigger: _Optional[str] = ..., report_path: _Optional[str] = ..., request_id: _Optional[str] = ..., criteria: _Optional[_Iterable[str]] = ...) -> None: ...

class ScheduledDrill(_message.Message):
    __slots__ = ("scenario", "region", "at")
    SCENARIO_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    scenario: str
    region: str
    at: float
    def __init__(self, scenario: _Optional[str] = ..., region: _Optional[str] = ..., at: _Optional[float] = ...) -> None: ...

class DrillScenario(_message.Message):
    __slots__ = ("name", "title", "region")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    name: str
    title: str
    region: str
    def __init__(self, name: _Optional[str] = ..., title: _Optional[str] = ..., region: _Optional[str] = ...) -> None: ...

class PendingDrill(_message.Message):
    __slots__ = ("id", "scenario", "region", "dry_run", "actor", "reason", "requested_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCENARIO_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    scenario: str
    region: str
    dry_run: bool
    actor: str
    reason: str
    requested_at: float
    def __init__(self, id: _Optional[str] = ..., scenario: _Optional[str] = ..., region: _Optional[str] = ..., dry_run: _Optional[bool] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., requested_at: _Optional[float] = ...) -> None: ...

class DrillsResponse(_message.Message):
    __slots__ = ("runs", "scenarios", "upcoming", "pending", "service", "published_at", "running", "progress")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    SCENARIOS_FIELD_NUMBER: _ClassVar[int]
    UPCOMING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[DrillRun]
    scenarios: _containers.RepeatedCompositeFieldContainer[DrillScenario]
    upcoming: _containers.RepeatedCompositeFieldContainer[ScheduledDrill]
    pending: _containers.RepeatedCompositeFieldContainer[PendingDrill]
    service: str
    published_at: float
    running: str
    progress: str
    def __init__(self, runs: _Optional[_Iterable[_Union[DrillRun, _Mapping]]] = ..., scenarios: _Optional[_Iterable[_Union[DrillScenario, _Mapping]]] = ..., upcoming: _Optional[_Iterable[_Union[ScheduledDrill, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[PendingDrill, _Mapping]]] = ..., service: _Optional[str] = ..., published_at: _Optional[float] = ..., running: _Optional[str] = ..., progress: _Optional[str] = ...) -> None: ...

class DrillRequest(_message.Message):
    __slots__ = ("scenario", "region", "dry_run", "reason", "actor", "replica")
    SCENARIO_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    scenario: str
    region: str
    dry_run: bool
    reason: str
    actor: str
    replica: str
    def __init__(self, scenario: _Optional[str] = ..., region: _Optional[str] = ..., dry_run: _Optional[bool] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., replica: _Optional[str] = ...) -> None: ...

class CapacityRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class RegionCapacityRecord(_message.Message):
    __slots__ = ("region", "bearing", "record_json")
    REGION_FIELD_NUMBER: _ClassVar[int]
    BEARING_FIELD_NUMBER: _ClassVar[int]
    RECORD_JSON_FIELD_NUMBER: _ClassVar[int]
    region: str
    bearing: RegionCapacity
    record_json: bytes
    def __init__(self, region: _Optional[str] = ..., bearing: _Optional[_Union[RegionCapacity, _Mapping]] = ..., record_json: _Optional[bytes] = ...) -> None: ...

class CapacityResponse(_message.Message):
    __slots__ = ("regions", "generated_at")
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[RegionCapacityRecord]
    generated_at: float
    def __init__(self, regions: _Optional[_Iterable[_Union[RegionCapacityRecord, _Mapping]]] = ..., generated_at: _Optional[float] = ...) -> None: ...

class ScaleRequest(_message.Message):
    __slots__ = ("unit",)
    UNIT_FIELD_NUMBER: _ClassVar[int]
    unit: str
    def __init__(self, unit: _Optional[str] = ...) -> None: ...

class PoolScale(_message.Message):
    __slots__ = ("unit", "active_now", "record_json", "cold_start_json")
    UNIT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_NOW_FIELD_NUMBER: _ClassVar[int]
    RECORD_JSON_FIELD_NUMBER: _ClassVar[int]
    COLD_START_JSON_FIELD_NUMBER: _ClassVar[int]
    unit: str
    active_now: int
    record_json: bytes
    cold_start_json: bytes
    def __init__(self, unit: _Optional[str] = ..., active_now: _Optional[int] = ..., record_json: _Optional[bytes] = ..., cold_start_json: _Optional[bytes] = ...) -> None: ...

class CostRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CostResponse(_message.Message):
    __slots__ = ("report_json", "generated_at")
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    report_json: bytes
    generated_at: float
    def __init__(self, report_json: _Optional[bytes] = ..., generated_at: _Optional[float] = ...) -> None: ...

class ScaleResponse(_message.Message):
    __slots__ = ("pools", "generated_at", "scaling")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    SCALING_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolScale]
    generated_at: float
    scaling: bool
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolScale, _Mapping]]] = ..., generated_at: _Optional[float] = ..., scaling: _Optional[bool] = ...) -> None: ...
