"""What a region's degradation ladder has switched off: the value of
``degradation/<region>`` (docs/architecture.md §5), written by the leader and watched by gateways
(context cap, parallel tool calls, shedding) and region agents (speculative decoding).

``FeatureFlags`` is what the actuators read: the effective settings after the applied
steps. The record also says which steps are applied, in order, so that recovery can
walk them backwards and a new leader can resume.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from controlplane.kernel.model import Frozen


class FeatureFlags(Frozen):
    """The effective feature settings of one region. The defaults are "nothing
    degraded"; every field is what some ladder step's actuator changes."""

    speculative_decoding: bool = True  # region agent: replicas with/without a draft model
    max_context_tokens: int | None = Field(None, ge=1)  # gateway: None = no cap
    context_cap_mode: Literal["reject", "truncate"] = "reject"  # over the cap: 4xx, or
    # drop the oldest turns (chat only; the system prompt and the last turn stay)
    parallel_tool_calls: bool = True  # gateway: False forces parallel_tool_calls off
    shed_priority_below: int | None = None  # gateway: refuse requests of lower priority


class DegradationRecord(Frozen):
    """Value of ``degradation/<region>``."""

    region: str
    applied: tuple[str, ...] = ()  # ladder step names, in the order they were applied
    # Steps restored since the last apply, last one last: recovery's guard re-applies
    # the last of them, and must know it after a leader change too.
    restored: tuple[str, ...] = ()
    flags: FeatureFlags = FeatureFlags()
    since: float = 0.0  # when the last step was applied or restored
    reason: str = ""
    epoch: int = 0  # bumped on every change: watchers apply only newer records
