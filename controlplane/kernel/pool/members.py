"""What a region agent publishes about its warm pool (``pools/<region>``). PURE.

Gateways route a region's traffic to ``active`` when a value exists, and to the
topology's static ``regions[].replicas`` when none does. The agent writes it at start
and whenever its ACTIVE set (or its WARM count) changes; it carries no lease, because
the replicas keep serving when the agent restarts.

It also answers loans (``pool-loans/<region>/<loan_id>``, :mod:`controlplane.kernel.pool.loans`):
``lent`` names the replica lent for each loan (awake, never in ``active``) and
``loan_refusals`` why a loan is not served. Both default to empty, so a value written
before loans existed still reads; they are left out of the JSON while empty, so that a
reader of that older shape (which refuses unknown fields) still reads what an agent
that lends nothing writes.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from controlplane.kernel.model import Frozen

# The agent's report beside its wake p95 (``activation_p95_s``): how many wakes the p95
# is of, and how long ago the oldest of them was, seconds. The agent keeps its last wakes
# only (since it started): this is how far back the p95 sees, which ``failoverctl
# doctor`` says (question 2 asks for 90 days; the rest is Prometheus's histogram).
ACTIVATION_WAKES_SIGNAL = "activation_wakes"
ACTIVATION_SPAN_SIGNAL = "activation_span_s"
_LOAN_FIELDS = ("lent", "loan_refusals")
# left out when None / False, as before them (a leader older than a field drops it)
_SCALE_FIELDS = ("activation_p95_s", "activation_rate", "asleep")
_COST_FIELDS = ("idle", "warm_kept", "launching")  # left out when 0, as before them


class PoolMembers(Frozen):
    region: str = Field(min_length=1)
    active: tuple[str, ...]  # base URLs gateways route to; () = nothing to route to
    warm: int = Field(ge=0)  # asleep and ready to wake (WARM + IDLE)
    # of ``warm``, the IDLE ones (awake, drained: priced as IDLE, not WARM) and the WARM
    # ones the pool may not stop now (in their WARM dwell, or static); the managed slots
    # being launched (COLD -> WARM, in no other count): what the cost guardrail prices
    # and cannot count on the pool letting go of (core/spend.py)
    idle: int = Field(0, ge=0)
    warm_kept: int = Field(0, ge=0)
    launching: int = Field(0, ge=0)
    at: float  # wall-clock seconds of publication, on the agent's clock: for operators
    agent: str  # who published it, e.g. agent:eu@host:7001
    lent: dict[str, str] = Field(default_factory=dict)  # loan id -> replica URL lent
    loan_refusals: dict[str, str] = Field(default_factory=dict)  # loan id -> reason
    # the p95 of the pool's last wakes (None: none measured): how long a data plane
    # holds a request for a pool at zero (scale to zero, docs/scaling.md)
    activation_p95_s: float | None = None
    # the replicas per second the pool's last batches of two or more wakes achieved
    # (regions/pool/wake_rate.py; None: none measured): the sizing formula's measured
    # activation rate (core/cold_start.py)
    activation_rate: float | None = Field(None, gt=0)
    # the leader asks 0 ACTIVE (scale to zero): a pool with no ACTIVE replica sleeps on
    # purpose, and a data plane holds its requests while it wakes instead of spilling
    # them; False with no ACTIVE replica: the pool is down
    asleep: bool = False

    @model_serializer(mode="wrap")
    def _without_empty_loans(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in _LOAN_FIELDS:
            if name in data and not data[name]:
                del data[name]
        for name in _SCALE_FIELDS:
            if name in data and (data[name] is None or data[name] is False):
                del data[name]
        for name in _COST_FIELDS:
            if name in data and data[name] == 0:
                del data[name]
        return data

    @model_validator(mode="after")
    def _idle_within_warm(self) -> Self:
        if self.idle + self.warm_kept > self.warm:
            raise ValueError(
                f"idle ({self.idle}) and warm_kept ({self.warm_kept}) are parts of warm "
                f"({self.warm}): together at most it"
            )
        return self
