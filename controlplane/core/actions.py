"""What one reconcile tick asks the orchestrator to do: the result types shared by
``controlplane.core.decide`` (per-tick decisions) and ``controlplane.core.steps``
(long-running steps carried out one at a time).
"""

from __future__ import annotations

from pydantic import Field

from controlplane.core.intents import IntentOutcome
from controlplane.kernel.model import (
    AuditEntry,
    Decision,
    FailoverStep,
    Frozen,
    RecoveryStep,
    RegionHealth,
    RegionRecord,
    Routing,
)


class Write(Frozen):
    """One all-or-nothing transaction about one region."""

    region: str
    expected_rev: int  # CAS on regions/<r>/state (0 = must be absent)
    record: RegionRecord
    routing: dict[str, Routing] = Field(default_factory=dict)
    routing_revs: dict[str, int] = Field(default_factory=dict)  # CAS on each routing key
    decision: Decision | None = None
    audit: tuple[AuditEntry, ...] = ()
    # The operator intent this write carries out: deleted, and its outcome recorded.
    intent_outcome: IntentOutcome | None = None


class WriteHealth(Frozen):
    region: str
    health: RegionHealth


class RunFailover(Frozen):
    region: str
    pending: tuple[FailoverStep, ...]


class RunRecovery(Frozen):
    """Steps a RECOVERED region takes before its first traffic step (pre-warm)."""

    region: str
    pending: tuple[RecoveryStep, ...]


class DropIntent(Frozen):
    """A refused operator intent: deleted, audited with the reason, outcome recorded."""

    intent_id: str
    audit: AuditEntry
    outcome: IntentOutcome


class TickResult(Frozen):
    now: float
    health: tuple[WriteHealth, ...] = ()
    writes: tuple[Write, ...] = ()
    failovers: tuple[RunFailover, ...] = ()
    recoveries: tuple[RunRecovery, ...] = ()
    dropped: tuple[DropIntent, ...] = ()
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        parts = [
            f"{d.region} {d.from_state.value}->{d.to_state.value} ({d.trigger}: {d.reason})"
            for w in self.writes
            if (d := w.decision)
        ]
        parts += [
            f"{f.region}: failover steps pending {[s.value for s in f.pending]}"
            for f in self.failovers
        ]
        parts += [
            f"{r.region}: recovery steps pending {[s.value for s in r.pending]}"
            for r in self.recoveries
        ]
        parts += [f"intent {x.intent_id} refused: {x.audit.result}" for x in self.dropped]
        return "; ".join(parts + list(self.notes)) or "no change"
