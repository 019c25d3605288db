"""Conversions between the core models and the gRPC messages."""

from __future__ import annotations

import math

from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.api.reads import CapacityView, RegionCapacity
from controlplane.core.intents import IntentOutcome, IntentStatus
from controlplane.core.store_writes import StoreWritesView
from controlplane.kernel.codec import encode
from controlplane.kernel.model import (
    AuditEntry,
    Decision,
    FailoverPlan,
    Health,
    ObserverKind,
    RegionHold,
    RegionState,
)
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.region_config import PoolUnit
from controlplane.kernel.rpc.health_report import health_to_pb
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


def capacity_to_pb(c: CapacityView) -> pb.RegionCapacity:
    """The figures of the last probe stay unset while there is none (fields with
    presence), so that no client reads a missing knee as 0 rps."""
    msg = pb.RegionCapacity(
        source=c.source.value,
        reason=c.reason,
        cbu=math.inf if c.cbu is None else c.cbu,
        allowed_rps=c.allowed_rps,
        load_rps=c.load_rps,
        hit_rate=c.hit_rate,
        warn_cbu=c.warn_cbu,
        page_cbu=c.page_cbu,
        engine_version=c.engine_version,
    )
    optional = {
        "active_replicas": c.active_replicas,
        "measured_at": c.measured_at,
        "knee_rps": c.knee_rps,
        "ultimate_rps": c.ultimate_rps,
        "ultimate_bounded": c.ultimate_bounded,
        "r_base_rps": c.r_base_rps,
        "beta": c.beta,
        "factor_of_safety": c.factor_of_safety,
        "t_recover_s": c.t_recover_s,
    }
    for name, value in optional.items():
        if value is not None:
            setattr(msg, name, value)
    return msg


def capacity_record_to_pb(c: RegionCapacity) -> pb.RegionCapacityRecord:
    return pb.RegionCapacityRecord(
        region=c.region,
        bearing=capacity_to_pb(c.bearing),
        record_json=encode(c.record) if c.record is not None else b"",
    )


def store_writes_to_pb(v: StoreWritesView) -> pb.StoreWrites:
    return pb.StoreWrites(writable=v.writable, reason=v.reason, since=v.since, alarms=v.alarms)


def region_status(
    view: RegionView,
    zone: str,
    capacity: CapacityView,
    *,
    writable: bool = True,
    pool: PoolUnit | None = None,
    hold: RegionHold | None = None,
    lift: RegionHold | None = None,
) -> pb.RegionStatus:
    """``writable``: False while the store refuses writes; the state is then UNKNOWN.
    ``pool``: what a model pool's unit is part of (None: a region without pools)."""
    rec, fo, rc = view.record, view.record.failover, view.record.recovery
    stored = state_to_pb(rec.state)
    return pb.RegionStatus(
        name=view.name,
        zone=zone,
        state=stored if writable else pb.REGION_STATE_UNKNOWN,  # type: ignore[arg-type]
        stored_state=stored,  # type: ignore[arg-type]
        health=health_to_pb(view.health.verdict if writable else Health.UNKNOWN),
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
        capacity=capacity_to_pb(capacity),
        pool_of=pool.region if pool else "",
        pool=pool.pool if pool else "",
        models=list(pool.models) if pool else [],
        scale=scale_to_pb(view.scale) if view.scale is not None else None,
        hold=_unit_hold(hold),
        budget_lift=_unit_hold(lift),
        engine_version=view.health.engine_version,
    )


def _unit_hold(h: RegionHold | None) -> pb.UnitHold | None:
    """A hold, or a budget lift (the same record), as the status shows it."""
    return (
        None if h is None else pb.UnitHold(reason=h.reason, actor=h.actor, at=h.at, until=h.until)
    )


def scale_to_pb(r: ScaleRecord) -> pb.PoolSize:
    return pb.PoolSize(
        active=r.active,
        warm=r.warm,
        reason=r.reasons[0] if r.reasons else "",
        decided_at=r.decided_at,
    )


def decision_to_pb(d: Decision) -> pb.Decision:
    return pb.Decision(
        region=d.region,
        from_state=state_to_pb(d.from_state),  # type: ignore[arg-type]
        to_state=state_to_pb(d.to_state),  # type: ignore[arg-type]
        trigger=str(d.trigger),
        reason=d.reason,
        actor=d.actor,
        at=d.at,
        epoch=d.epoch,
        signals=d.signals,
        cause=str(d.cause),
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
