"""The topology file's ``timing:`` section (``Topology.timing``): how fast health is
judged and the leader acts, and the rule that keeps a leader from acting on a lease
that may have expired. Read each tick by the deciding core (``core.health``).
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen


class TimingConfig(Frozen):
    """How fast health is judged and the leader acts (docs/architecture.md §3, §7)."""

    probe_interval_s: Annotated[
        float,
        Field(
            gt=0,
            description="agents report and the leader probes this often; health is "
            "folded at most this often",
        ),
    ] = 1.0
    failure_threshold: Annotated[
        int, Field(ge=1, description="bad evaluations in a row before UNHEALTHY")
    ] = 3
    success_threshold: Annotated[
        int, Field(ge=1, description="good evaluations in a row before healthy again")
    ] = 3
    report_stale_s: Annotated[
        float, Field(gt=0, description="reports older than this do not vote")
    ] = 5.0
    quorum: Annotated[
        int, Field(ge=1, le=16, description="observers that must agree a region is down")
    ] = 2
    degraded_dwell_s: Annotated[
        float, Field(ge=0, description="healthy this long before DEGRADED -> NORMAL")
    ] = 30.0
    recovery_dwell_s: Annotated[
        float, Field(ge=0, description="healthy this long before FAILING_OVER -> RECOVERED")
    ] = 30.0
    failover_cooldown_s: Annotated[
        float,
        Field(
            ge=0,
            description="at most one automatic failover per region per cooldown (an "
            "operator's failover is not held by it)",
        ),
    ] = 300.0
    loop_period_s: Annotated[float, Field(gt=0, description="the reconcile tick")] = 1.0
    retry_timeout_s: Annotated[
        float, Field(gt=0, description="bound on the retries of one store call inside a tick")
    ] = 2.0
    lease_ttl_s: Annotated[int, Field(ge=2, description="the leader's lease, whole seconds")] = 10

    @model_validator(mode="after")
    def _invariants(self) -> Self:
        """loop_period_s + 2 x retry_timeout_s <= lease_ttl_s, so a leader never acts on
        a lease that may have expired; report_stale_s >= 2 x probe_interval_s."""
        budget = self.loop_period_s + 2 * self.retry_timeout_s
        if budget > self.lease_ttl_s:
            raise ValueError(
                f"loop_period_s + 2 x retry_timeout_s = {budget:g}s exceeds lease_ttl_s = "
                f"{self.lease_ttl_s}s: a leader could act after its lease expired; raise "
                "lease_ttl_s or lower loop_period_s / retry_timeout_s"
            )
        if self.report_stale_s < 2 * self.probe_interval_s:
            raise ValueError(
                f"report_stale_s ({self.report_stale_s:g}) must be at least 2 x "
                f"probe_interval_s ({self.probe_interval_s:g}) or every report looks stale"
            )
        return self
