from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentDescription(_message.Message):
    __slots__ = ("region", "block_size", "prefill_tokens_per_s", "kv_capacity_blocks", "replicas_active", "replicas_warm")
    REGION_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_WARM_FIELD_NUMBER: _ClassVar[int]
    region: str
    block_size: int
    prefill_tokens_per_s: float
    kv_capacity_blocks: int
    replicas_active: int
    replicas_warm: int
    def __init__(self, region: _Optional[str] = ..., block_size: _Optional[int] = ..., prefill_tokens_per_s: _Optional[float] = ..., kv_capacity_blocks: _Optional[int] = ..., replicas_active: _Optional[int] = ..., replicas_warm: _Optional[int] = ...) -> None: ...

class PrewarmRequest(_message.Message):
    __slots__ = ("failover_id", "source", "budget_s", "payloads", "activate", "verify", "routing_chars")
    FAILOVER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_S_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    ACTIVATE_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    ROUTING_CHARS_FIELD_NUMBER: _ClassVar[int]
    failover_id: str
    source: str
    budget_s: float
    payloads: _containers.RepeatedScalarFieldContainer[bytes]
    activate: int
    verify: int
    routing_chars: int
    def __init__(self, failover_id: _Optional[str] = ..., source: _Optional[str] = ..., budget_s: _Optional[float] = ..., payloads: _Optional[_Iterable[bytes]] = ..., activate: _Optional[int] = ..., verify: _Optional[int] = ..., routing_chars: _Optional[int] = ...) -> None: ...

class PrewarmProgress(_message.Message):
    __slots__ = ("total", "warmed", "failed", "elapsed_s", "done", "attainment", "verified", "verified_hit_rate", "prompt_tokens", "replicas_active", "detail", "no_key", "unreadable")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    WARMED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ATTAINMENT_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    NO_KEY_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    total: int
    warmed: int
    failed: int
    elapsed_s: float
    done: bool
    attainment: float
    verified: int
    verified_hit_rate: float
    prompt_tokens: int
    replicas_active: int
    detail: str
    no_key: int
    unreadable: int
    def __init__(self, total: _Optional[int] = ..., warmed: _Optional[int] = ..., failed: _Optional[int] = ..., elapsed_s: _Optional[float] = ..., done: _Optional[bool] = ..., attainment: _Optional[float] = ..., verified: _Optional[int] = ..., verified_hit_rate: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., replicas_active: _Optional[int] = ..., detail: _Optional[str] = ..., no_key: _Optional[int] = ..., unreadable: _Optional[int] = ...) -> None: ...
