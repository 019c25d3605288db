"""What a region agent publishes about its warm pool (``pools/<region>``). PURE.

Gateways route a region's traffic to ``active`` when a value exists, and to the
topology's static ``regions[].replicas`` when none does. The agent writes it at start
and whenever its ACTIVE set (or its WARM count) changes; it carries no lease, because
the replicas keep serving when the agent restarts.
"""

from __future__ import annotations

from pydantic import Field

from controlplane.kernel.model import Frozen


class PoolMembers(Frozen):
    region: str = Field(min_length=1)
    active: tuple[str, ...]  # base URLs gateways route to; () = nothing to route to
    warm: int = Field(ge=0)  # asleep and ready to wake (WARM + IDLE)
    at: float  # wall-clock seconds of publication, on the agent's clock: for operators
    agent: str  # who published it, e.g. agent:eu@host:7001
