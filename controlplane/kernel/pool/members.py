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

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from controlplane.kernel.model import Frozen

_LOAN_FIELDS = ("lent", "loan_refusals")


class PoolMembers(Frozen):
    region: str = Field(min_length=1)
    active: tuple[str, ...]  # base URLs gateways route to; () = nothing to route to
    warm: int = Field(ge=0)  # asleep and ready to wake (WARM + IDLE)
    at: float  # wall-clock seconds of publication, on the agent's clock: for operators
    agent: str  # who published it, e.g. agent:eu@host:7001
    lent: dict[str, str] = Field(default_factory=dict)  # loan id -> replica URL lent
    loan_refusals: dict[str, str] = Field(default_factory=dict)  # loan id -> reason

    @model_serializer(mode="wrap")
    def _without_empty_loans(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in _LOAN_FIELDS:
            if name in data and not data[name]:
                del data[name]
        return data
