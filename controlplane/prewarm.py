"""The pre-warm hook a failover runs before or after its routing switch.

The real pre-warmer is ``controlplane.agent_prewarm.AgentPrewarmer`` (top prefixes
replayed on the targets by their region agents, docs/architecture.md §4). ``NoPrefixData``
records honestly that nothing was warmed. (The test lab's ``HoldPrewarmer``,
chaos/lab/controlplane.py, keeps a failover in this step so a leader can be killed in
it; it is injected through ``ControlPlaneReplica(prewarmer=...)``.)
"""

from __future__ import annotations

from typing import Protocol

from controlplane.kernel.model import FailoverPlan, PrewarmFigures


class Prewarmer(Protocol):
    async def prewarm(
        self, plan: FailoverPlan, budget_s: float, failover_id: str
    ) -> PrewarmFigures:
        """Warm the plan's targets within ``budget_s``; return figures for the record.
        ``failover_id`` names the failover: a repeat (a new leader) must not warm twice."""
        ...


class NoPrefixData:
    async def prewarm(
        self, plan: FailoverPlan, budget_s: float, failover_id: str
    ) -> PrewarmFigures:
        return PrewarmFigures(prefixes_total=0.0, prefixes_warmed=0.0, budget_s=budget_s)
