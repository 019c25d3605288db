"""What one reconcile tick asks the orchestrator to do (docs/architecture.md §7.1): every
write of the tick, and the jobs (the only slow I/O: pre-warms, the prefix aggregation)
to start. A job's result is an input of a later tick (``Jobs``), never a write of its
own: the pure core records it. No tick writes a session: sessions follow ``routing/``
and are re-pinned by the gateway that serves them (docs/architecture.md §2).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import Field

from controlplane.core.intents import IntentOutcome
from controlplane.kernel.cluster_spec import ClusterSpec
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import (
    AuditEntry,
    ControlFlags,
    Decision,
    FailoverPlan,
    FailoverStep,
    Frozen,
    LadderChange,
    PrewarmFigures,
    RegionHealth,
    RegionRecord,
    Routing,
)
from controlplane.kernel.pool.scale import ScaleRecord


class JobKind(StrEnum):
    FAILOVER_PREWARM = "failover_prewarm"  # warm a failover's targets (plan)
    RECOVERY_PREWARM = "recovery_prewarm"  # warm a recovering region with its own prefixes
    # merge the gateways' prefix exports into every region's catalog, every
    # prefixes.aggregate_interval_s (a cluster-wide job: region CLUSTER)
    PREFIX_AGGREGATE = "prefix_aggregate"


CLUSTER = "*"  # the region of a cluster-wide job


class Job(Frozen):
    """Slow I/O the orchestrator runs in the background, one of each kind per region at
    a time. ``id`` names what it is for (a failover, a recovery, an aggregation): a job
    whose id runs or has a result already is not started again."""

    kind: JobKind
    region: str
    id: str
    plan: FailoverPlan | None = None  # FAILOVER_PREWARM

    def describe(self) -> str:
        if self.kind is JobKind.RECOVERY_PREWARM:
            return f"{self.region}: pre-warm of its own top prefixes started"
        if self.kind is JobKind.PREFIX_AGGREGATE:
            return "prefix catalogs: merging the gateways' exports"
        targets = ", ".join(sorted(self.plan.targets)) if self.plan is not None else "?"
        return f"{self.region}: pre-warm of {targets} started"


class Jobs(Frozen):
    """What the tick knows of its jobs: the results of those finished and not yet
    recorded (by job id), the ids still running, and when this term's last prefix
    aggregation ended (None: none yet, so the first leader tick runs one)."""

    results: Mapping[str, PrewarmFigures] = Field(default_factory=dict)
    running: frozenset[str] = frozenset()
    aggregated_at: float | None = None


NO_JOBS = Jobs()


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
    # The region's claim freed with it, compare-and-delete at this revision (0: kept).
    free_claim_rev: int = 0
    failover_steps: tuple[FailoverStep, ...] = ()  # the failover steps this write records
    consumes: tuple[str, ...] = ()  # ids of the job results it records

    def merged(self, later: Write) -> Write:
        """This write and ``later`` (decided on the snapshot with this one applied) as one
        transaction: a region's change and the failover steps that follow it at once."""
        assert later.region == self.region and later.expected_rev == self.expected_rev
        return self.model_copy(
            update={
                "record": later.record,
                "routing": {**self.routing, **later.routing},
                "routing_revs": {**later.routing_revs, **self.routing_revs},
                "decision": self.decision or later.decision,
                "audit": (*self.audit, *later.audit),
                "intent_outcome": self.intent_outcome or later.intent_outcome,
                "free_claim_rev": self.free_claim_rev or later.free_claim_rev,
                "failover_steps": (*self.failover_steps, *later.failover_steps),
                "consumes": (*self.consumes, *later.consumes),
            }
        )


class LadderWrite(Frozen):
    """A change of ``degradation/<region>``: CAS on its revision (0: absent), audited."""

    region: str
    expected_rev: int
    record: DegradationRecord
    audit: AuditEntry
    kind: LadderChange
    step: str | None = None


class ScaleWrite(Frozen):
    """The scaler's record of a pool (``scale/<unit>``): CAS on its revision (0: absent);
    audited when the desired size changed (``audit``), else a checkpoint of the
    forecaster's state."""

    unit: str
    expected_rev: int
    record: ScaleRecord
    audit: AuditEntry | None = None


class SpecWrite(Frozen):
    """The cluster spec this leader's topology makes, over another (or none) in etcd:
    CAS on ``spec``'s revision (0: absent), audited with what changed."""

    expected_rev: int
    spec: ClusterSpec
    audit: AuditEntry


class ControlWrite(Frozen):
    """``control`` rewritten by the leader (a pause that expired: automation resumes),
    CAS on its revision, audited."""

    expected_rev: int
    control: ControlFlags
    audit: AuditEntry


class HoldRelease(Frozen):
    """``regions/<unit>/hold`` (or, ``lift``, ``regions/<unit>/budget-lift``) deleted by
    the leader once its time is up, CAS on its revision (an operator's newer one stays),
    audited as a release (an unlift)."""

    unit: str
    expected_rev: int
    audit: AuditEntry
    lift: bool = False  # a budget lift, not a hold


class WriteHealth(Frozen):
    region: str
    health: RegionHealth


class DropIntent(Frozen):
    """A refused operator intent: deleted, audited with the reason, outcome recorded."""

    intent_id: str
    audit: AuditEntry
    outcome: IntentOutcome
    free_claim_rev: int = 0  # as on Write


class TickResult(Frozen):
    now: float
    health: tuple[WriteHealth, ...] = ()
    writes: tuple[Write, ...] = ()
    spec: SpecWrite | None = None  # the cluster spec, when etcd holds another
    control: ControlWrite | None = None  # a pause that expired, resumed
    releases: tuple[HoldRelease, ...] = ()  # units' holds that expired
    ladder: tuple[LadderWrite, ...] = ()  # degradation ladder moves
    ladder_holds: dict[str, str] = Field(default_factory=dict)  # region -> why it holds
    scale: tuple[ScaleWrite, ...] = ()  # the scaler's records to write
    # every pool's newest scale record, written or not: the next tick continues from it
    sizes: dict[str, ScaleRecord] = Field(default_factory=dict)
    jobs: tuple[Job, ...] = ()  # to start now (unless running or done)
    awaiting: tuple[str, ...] = ()  # ids of the job results pending steps wait for
    dropped: tuple[DropIntent, ...] = ()
    notes: tuple[str, ...] = ()

    def changes_state(self) -> bool:
        """A region's state, its ladder or an operator's intent changes this tick."""
        return any(w.decision for w in self.writes) or bool(self.ladder or self.dropped)

    def summary(self) -> str:
        """One sentence: what the leader does this tick and why."""
        parts = [f"cluster spec published ({self.spec.audit.reason})"] if self.spec else []
        if self.control is not None:
            parts.append(f"automation resumed ({self.control.audit.reason})")
        parts += [
            f"{x.unit}: {'budget lift ended' if x.lift else 'hold released'} ({x.audit.reason})"
            for x in self.releases
        ]
        for w in self.writes:
            what = [f"{s.value}" for s in w.failover_steps]
            if d := w.decision:
                head = (
                    f"{d.region} {d.from_state.value}->{d.to_state.value} ({d.trigger}: {d.reason})"
                )
                parts.append(head + (f", with its {' and '.join(what)}" if what else ""))
            elif what:
                parts.append(f"{w.region}: failover {' and '.join(what)} recorded")
            elif w.consumes:
                parts.append(f"{w.region}: recovery pre-warm recorded")
        parts += [f"{x.region}: ladder {x.kind} {x.step} ({x.audit.reason})" for x in self.ladder]
        parts += [
            f"{x.unit}: scaled to {x.record.active} ACTIVE + {x.record.warm} WARM "
            f"({x.audit.reason})"
            for x in self.scale
            if x.audit is not None
        ]
        # the periodic aggregation is routine: it would make every few ticks a story
        parts += [j.describe() for j in self.jobs if j.kind is not JobKind.PREFIX_AGGREGATE]
        parts += [f"intent {x.intent_id} refused: {x.audit.result}" for x in self.dropped]
        return "; ".join(parts + list(self.notes)) or "no change"
