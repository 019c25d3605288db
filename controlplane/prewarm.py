"""The pre-warm hook a failover runs before or after its routing switch.

The real pre-warmer is ``controlplane.agent_prewarm.AgentPrewarmer`` (top prefixes
replayed on the targets by their region agents, docs/architecture.md §4). ``NoPrefixData``
records honestly that nothing was warmed; ``HoldPrewarmer`` keeps a failover in this
step for a set time so that drills and tests can kill a leader mid-failover.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from controlplane.core.model import FailoverPlan


class Prewarmer(Protocol):
    async def prewarm(
        self, plan: FailoverPlan, budget_s: float, failover_id: str
    ) -> dict[str, float]:
        """Warm the plan's targets within ``budget_s``; return figures for the record.
        ``failover_id`` names the failover: a repeat (a new leader) must not warm twice."""
        ...


class NoPrefixData:
    async def prewarm(
        self, plan: FailoverPlan, budget_s: float, failover_id: str
    ) -> dict[str, float]:
        return {"prefixes_total": 0.0, "prefixes_warmed": 0.0, "budget_s": budget_s}


class HoldPrewarmer:
    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s

    async def prewarm(
        self, plan: FailoverPlan, budget_s: float, failover_id: str
    ) -> dict[str, float]:
        await asyncio.sleep(min(self.hold_s, budget_s))
        return {"prefixes_total": 0.0, "prefixes_warmed": 0.0, "held_s": self.hold_s}
