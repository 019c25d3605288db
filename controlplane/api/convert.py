"""Conversions between the core models and the gRPC messages."""

from __future__ import annotations

from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.core.intents import IntentOutcome, IntentStatus
from controlplane.kernel.health_report import health_to_pb
from controlplane.kernel.model import (
    AuditEntry,
    Decision,
    FailoverPlan,
    ObserverKind,
    RegionState,
)
from controlplane.kernel.snapshot import RegionView

_INTENT_STATE = {
    IntentStatus.PENDING: pb.INTENT_PENDING,
    IntentStatus.DONE: pb.INTENT_DONE,
    IntentStatus.REFUSED: pb.INTENT_REFUSED,
}
_KIND_FROM_PB: dict[int, ObserverKind] = {
    pb.AGENT: ObserverKind.AGENT,
    pb.PROBE: ObserverKind.PROBE,
    pb.GATEWAY: ObserverKind.GATEWAY,
}


def kind_from_pb(v: int) -> ObserverKind | None:
    return _KIND_FROM_PB.get(v)


def state_to_pb(s: RegionState) -> int:
    return int(pb.RegionState.Value(s.value))


def region_status(view: RegionView, zone: str) -> pb.RegionStatus:
    rec, fo, rc = view.record, view.record.failover, view.record.recovery
    return pb.RegionStatus(
        name=view.name,
        zone=zone,
        state=state_to_pb(rec.state),  # type: ignore[arg-type]
        health=health_to_pb(view.health.verdict),
        epoch=rec.epoch,
        reason=rec.reason,
        since=rec.since,
        routing=view.effective_routing().targets,
        barred=view.barred,
        signals=view.health.signals,
        votes={k: v.value for k, v in view.health.votes.items()},
        failover_steps_done=",".join(s.value for s in fo.done) if fo else "",
        recovery_step=rc.step if rc else 0,
        recovery_steps=rc.steps if rc else 0,
        degradation_steps=list(view.degradation),
    )


def decision_to_pb(d: Decision) -> pb.Decision:
    return pb.Decision(
        region=d.region,
        from_state=state_to_pb(d.from_state),  # type: ignore[arg-type]
        to_state=state_to_pb(d.to_state),  # type: ignore[arg-type]
        trigger=d.trigger,
        reason=d.reason,
        actor=d.actor,
        at=d.at,
        epoch=d.epoch,
        signals=d.signals,
    )


def event_to_pb(key_id: str, a: AuditEntry) -> pb.Event:
    ev = pb.Event(
        id=key_id,
        at=a.at,
        action=a.action.value,
        region=a.region,
        actor=a.actor,
        reason=a.reason,
        result=a.result,
        details=a.details,
    )
    if a.decision is not None:
        ev.decision.CopyFrom(decision_to_pb(a.decision))
    return ev


def plan_to_pb(p: FailoverPlan) -> pb.FailoverPlan:
    return pb.FailoverPlan(
        source=p.source,
        targets=p.targets,
        forced=p.forced,
        warm_first=p.warm_first,
        headroom_short=p.headroom_short,
        notes=p.notes,
    )


def intent_status_to_pb(o: IntentOutcome) -> pb.IntentStatus:
    return pb.IntentStatus(
        intent_id=o.id,
        kind=o.kind.value,
        region=o.region,
        state=_INTENT_STATE[o.status],
        detail=o.detail,
        reason=o.reason,
        actor=o.actor,
        targets=o.targets,
        requested_at=o.requested_at,
        decided_at=o.decided_at,
        decided_by=o.decided_by,
        epoch=o.epoch,
    )
