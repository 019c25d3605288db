"""One reconcile tick: snapshot in, actions out. Pure (docs/architecture.md §7.1).

``decide`` returns a ``TickResult`` (``controlplane.core.actions``) naming every write of
the tick; each ``Write`` is one fenced etcd transaction for one region (record CAS,
routing, audit, intent resolution: all or nothing). In order: health folding, operator
intents, automatic transitions (none while paused, none of a held unit), then each
running failover's and recovery's next steps (``steps.next_steps``): a switch is written
at once, with the transition that needs it; a pre-warm is started as a job and its
result, an input of a later tick (``Jobs``), recorded then, with the switch that waited
for it. Recovery's traffic steps and their guard: ``controlplane.core.recovery``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from controlplane.core.actions import (
    NO_JOBS,
    DropIntent,
    Jobs,
    TickResult,
    Write,
    WriteHealth,
)
from controlplane.core.bearing import allowed_now
from controlplane.core.causes import drilled, with_cause
from controlplane.core.failover import PlanRefused, plan_failover, routing_recovery_step
from controlplane.core.health import by_region, evaluation_due, fold_health
from controlplane.core.intents import IntentStatus, done, outcome_details, refused
from controlplane.core.ladder_tick import ladder_moves
from controlplane.core.machine import fire
from controlplane.core.publish import holds_expired, pause_expired, prefix_aggregation, spec_write
from controlplane.core.recovery import MoveKind, next_recovery_move
from controlplane.core.scale_tick import scale_moves
from controlplane.core.steps import all_next_steps, awaited, pending_steps
from controlplane.kernel.cluster_spec import ClusterSpec
from controlplane.kernel.config import Topology
from controlplane.kernel.details import routing_text
from controlplane.kernel.ladder.model import Ladder
from controlplane.kernel.model import (
    RECOVERY_STEP_DETAIL,
    AuditAction,
    AuditEntry,
    Cause,
    FailoverPlan,
    FailoverProgress,
    Health,
    Intent,
    IntentKind,
    RecoveryProgress,
    RecoveryStep,
    RegionState,
    Routing,
    Trigger,
)
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.snapshot import RegionView, Snapshot


def _transition(
    view: RegionView,
    trigger: Trigger,
    *,
    reason: str,
    actor: str,
    now: float,
    record_changes: dict[str, object],
    routing: dict[str, Routing] | None = None,
    routing_revs: dict[str, int] | None = None,
    intent: Intent | None = None,
    decided_by: str = "",
) -> Write:
    rec = view.record
    decision = fire(
        rec,
        trigger,
        reason=reason,
        actor=actor,
        now=now,
        signals=view.health.signals,
        epoch=rec.epoch + 1,
    )
    if intent is not None:
        decision = decision.model_copy(update={"cause": Cause.MANUAL})
    new = rec.model_copy(
        update={
            "state": decision.to_state,
            "epoch": rec.epoch + 1,
            "reason": reason,
            "since": now,
            "last_decision": decision,
            **record_changes,
        }
    )
    details = {"trigger": trigger.value}
    if routing:
        details["routing"] = routing_text(routing)
    if intent is not None:
        details |= outcome_details(intent.id, IntentStatus.DONE)
    return Write(
        region=view.name,
        expected_rev=view.record_rev,
        record=new,
        routing=routing or {},
        routing_revs=routing_revs or {},
        decision=decision,
        audit=(
            AuditEntry(
                at=now,
                actor=actor,
                action=AuditAction.TRANSITION,
                region=view.name,
                reason=reason,
                decision=decision,
                details=details,
            ),
        ),
        intent_outcome=None if intent is None else done(intent, decision, decided_by),
    )


def _start_failover(
    view: RegionView,
    plan: FailoverPlan,
    trigger: Trigger,
    now: float,
    intent: Intent | None = None,
    decided_by: str = "",
) -> Write:
    return _transition(
        view,
        trigger,
        reason=plan.reason,
        actor=plan.actor,
        now=now,
        intent=intent,
        decided_by=decided_by,
        record_changes={
            "failover": FailoverProgress(plan=plan, started_at=now),
            "recovery": None,
            "last_failover_at": now,
        },
    )


def _recovery_write(view: RegionView, topology: Topology, now: float, actor: str) -> Write | None:
    rec, cfg = view.record, topology.recovery
    prog = rec.recovery or RecoveryProgress(steps=cfg.steps, last_step_at=rec.since)
    move = next_recovery_move(
        prog,
        cfg,
        region=view.name,
        verdict=view.health.verdict,
        signals=view.health.signals,
        capacity_rps=allowed_now(view, topology, now),
        now=now,
        began_at=rec.since,
        prewarm_budget_s=topology.prewarm.budget_s,
    )
    if not move.writes:
        return None
    if move.kind is MoveKind.COMPLETE:
        routing = routing_recovery_step(view.effective_routing(), view.name, 1.0)
        return _transition(
            view,
            Trigger.COMPLETE,
            reason="graduated recovery complete",
            actor=actor,
            now=now,
            record_changes={"recovery": None, "failover": None},
            routing={view.name: routing},
            routing_revs={view.name: view.routing_rev},
        )
    routes: dict[str, Routing] = {}
    details: dict[str, str] = {}
    if move.fraction_home is not None:
        routing = routing_recovery_step(view.effective_routing(), view.name, move.fraction_home)
        routes[view.name] = routing
        details["routing"] = routing_text(routes)
    for b in move.breaches:
        details[b.signal] = f"{b.value:.4g}"
        details[f"{b.signal}_threshold"] = f"{b.threshold:.4g}"
    action = {
        MoveKind.ABANDON: AuditAction.of_recovery(RecoveryStep.PREWARM),
        MoveKind.HOLD: AuditAction.RECOVERY_HOLD,
        MoveKind.GUARD: AuditAction.RECOVERY_GUARD,
        MoveKind.SPIKE: AuditAction.RECOVERY_GUARD,
        MoveKind.CALM: AuditAction.RECOVERY_CALM,
    }.get(move.kind, AuditAction.RECOVERY_STEP)
    if move.kind is MoveKind.ABANDON:
        details.update(move.progress.prewarm_result.details())
    if action is AuditAction.RECOVERY_STEP:  # readers learn the step without the reason
        details[RECOVERY_STEP_DETAIL] = str(move.progress.step)
    result = "abandoned" if move.kind is MoveKind.ABANDON else "ok"
    return Write(
        region=view.name,
        expected_rev=view.record_rev,
        record=rec.model_copy(update={"recovery": move.progress}),
        routing=routes,
        routing_revs={view.name: view.routing_rev} if routes else {},
        audit=(
            AuditEntry(
                at=now,
                actor=actor,
                action=action,
                region=view.name,
                reason=move.reason,
                result=result,
                details=details,
            ),
        ),
    )


def _automatic(
    snap: Snapshot, topology: Topology, view: RegionView, actor: str
) -> tuple[Write | None, str | None]:
    """The automatic move of one region this tick, if any, and why a wanted one was
    refused. An UNHEALTHY verdict fails any serving region over; a failed drill drains
    it; otherwise the planner of the region's state decides (``_PLANNERS``)."""
    state, verdict = view.record.state, view.health.verdict
    if state is not RegionState.FAILING_OVER and verdict is Health.UNHEALTHY:
        return _fail_over_unhealthy(snap, topology, view, actor)
    if state is not RegionState.FAILING_OVER and view.barred:
        return _drain_barred(snap, topology, view, actor)
    return _PLANNERS[state](snap, topology, view, actor), None


def _fail_over_unhealthy(
    snap: Snapshot, topology: Topology, view: RegionView, actor: str
) -> tuple[Write | None, str | None]:
    relapse = view.record.state is RegionState.RECOVERED
    h = view.health
    reason = f"UNHEALTHY confirmed by {int(h.signals.get('votes_down', 0))} observers"
    try:
        plan = plan_failover(
            snap,
            topology,
            view.name,
            reason=reason,
            actor=actor,
            cooldown_s=0.0 if relapse else None,
        )
    except PlanRefused as e:
        return None, f"{view.name} not failed over: {e}"
    trigger = Trigger.RELAPSE if relapse else Trigger.FAIL_OVER
    return _start_failover(view, plan, trigger, snap.now), None


def _when_normal(snap: Snapshot, topology: Topology, view: RegionView, actor: str) -> Write | None:
    if view.health.verdict is not Health.DEGRADED:
        return None
    return _transition(
        view,
        Trigger.DEGRADE,
        reason="SLO breach reported",
        actor=actor,
        now=snap.now,
        record_changes={},
    )


def _when_degraded(
    snap: Snapshot, topology: Topology, view: RegionView, actor: str
) -> Write | None:
    h, now = view.health, snap.now
    if h.verdict is not Health.HEALTHY or now - h.since < topology.timing.degraded_dwell_s:
        return None
    return _transition(
        view,
        Trigger.RESTORE,
        reason=f"healthy for {now - h.since:.0f}s",
        actor=actor,
        now=now,
        record_changes={},
    )


def _when_failing_over(
    snap: Snapshot, topology: Topology, view: RegionView, actor: str
) -> Write | None:
    rec, h, now = view.record, view.health, snap.now
    if (
        pending_steps(rec)
        or rec.failover is None
        # An operator's failover (a drain) is undone by an operator, never by automation.
        or rec.failover.plan.manual
        or h.verdict is not Health.HEALTHY
        # A failed drill keeps the region's traffic away until a passing drill or an
        # operator override (docs/architecture.md §6).
        or view.barred
    ):
        return None
    # Healthy for the whole dwell *since the failover*, not merely since the verdict.
    healthy_for = now - max(h.since, rec.since)
    if healthy_for < topology.timing.recovery_dwell_s:
        return None
    return _begin_recovery(view, topology, f"healthy for {healthy_for:.0f}s", actor, now)


def _when_recovered(
    snap: Snapshot, topology: Topology, view: RegionView, actor: str
) -> Write | None:
    return _recovery_write(view, topology, snap.now, actor)


_Planner = Callable[[Snapshot, Topology, RegionView, str], "Write | None"]
# One planner per state: what automation does with a region in that state.
_PLANNERS: Mapping[RegionState, _Planner] = {
    RegionState.NORMAL: _when_normal,
    RegionState.DEGRADED: _when_degraded,
    RegionState.FAILING_OVER: _when_failing_over,
    RegionState.RECOVERED: _when_recovered,
}


def _drain_barred(
    snap: Snapshot, topology: Topology, view: RegionView, actor: str
) -> tuple[Write | None, str | None]:
    """A region barred by its last drill takes no production traffic: move it away
    like an operator's drain (warm the targets first), when the safety rules allow."""
    ready = view.readiness
    drill = ready.drill if ready is not None else "?"
    relapse = view.record.state is RegionState.RECOVERED
    try:
        plan = plan_failover(
            snap,
            topology,
            view.name,
            reason=f"barred: its last drill {drill} failed",
            actor=actor,
            cooldown_s=0.0 if relapse else None,
        )
    except PlanRefused as e:
        return None, f"{view.name} is barred by drill {drill} but keeps its traffic: {e}"
    plan = plan.model_copy(update={"warm_first": True})
    trigger = Trigger.RELAPSE if relapse else Trigger.FAIL_OVER
    return _start_failover(view, plan, trigger, snap.now), None


def _begin_recovery(
    view: RegionView,
    topology: Topology,
    reason: str,
    actor: str,
    now: float,
    intent: Intent | None = None,
    decided_by: str = "",
) -> Write:
    return _transition(
        view,
        Trigger.RECOVER,
        reason=reason,
        actor=actor,
        now=now,
        intent=intent,
        decided_by=decided_by,
        record_changes={
            "failover": None,
            "recovery": RecoveryProgress(
                step=0,
                steps=topology.recovery.steps,
                last_step_at=now,
                planned=(RecoveryStep.PREWARM,) if topology.recovery.prewarm else (),
            ),
        },
    )


def _intent(snap: Snapshot, topology: Topology, intent: Intent, actor: str) -> Write | DropIntent:
    """Carry out ``intent`` or refuse it; either way its outcome is recorded (``actor``,
    this leader, decided it)."""
    now = snap.now
    view = snap.regions.get(intent.region)

    def refuse(why: str) -> DropIntent:
        return DropIntent(
            intent_id=intent.id,
            audit=AuditEntry(
                at=now,
                actor=intent.actor,
                action=AuditAction.of_intent(intent.kind),
                region=intent.region,
                reason=intent.reason,
                result=f"refused: {why}",
                details=outcome_details(intent.id, IntentStatus.REFUSED),
            ),
            outcome=refused(intent, why, now, actor),
        )

    if view is None:
        return refuse(f"unknown region {intent.region!r}")
    state = view.record.state
    if intent.kind is IntentKind.FAILOVER:
        if state is RegionState.FAILING_OVER:
            return refuse(f"{intent.region} is already failed over")
        try:
            plan = plan_failover(
                snap,
                topology,
                intent.region,
                reason=intent.reason,
                actor=intent.actor,
                requested=intent.targets,
                forced=intent.force,
                manual=True,
            )
        except PlanRefused as e:
            return refuse(str(e))
        trigger = Trigger.RELAPSE if state is RegionState.RECOVERED else Trigger.FAIL_OVER
        return _start_failover(view, plan, trigger, now, intent, actor)
    # RECOVER
    if state is not RegionState.FAILING_OVER:
        return refuse(f"{intent.region} is {state.value}, not FAILING_OVER")
    if pending_steps(view.record):
        return refuse(f"{intent.region}'s failover has not finished its steps yet")
    if view.health.verdict is Health.UNHEALTHY and not intent.force:
        return refuse(f"{intent.region} is still UNHEALTHY (force with a reason to override)")
    return _begin_recovery(view, topology, intent.reason, intent.actor, now, intent, actor)


def decide(
    snap: Snapshot,
    topology: Topology,
    actor: str,
    jobs: Jobs = NO_JOBS,
    ladder: Ladder | None = None,
    spec: ClusterSpec | None = None,
    sizes: Mapping[str, ScaleRecord] | None = None,
) -> TickResult:
    """Decide one tick. ``actor`` names this replica in decisions; ``jobs``: the results
    of finished jobs, and those running; ``ladder``: walked one step per region per tick;
    ``spec``: this replica's cluster spec, published when etcd holds another; ``sizes``:
    the scaler's newest record per pool from the last tick (written or not)."""
    now = snap.now
    # The ladder walks on the snapshot as stored: the health folded last tick.
    moves, holds = ladder_moves(snap, topology, ladder, actor) if ladder else ([], {})
    health_writes: list[WriteHealth] = []
    regions: dict[str, RegionView] = {}
    reports = by_region(snap.reports)  # once: each region folds its own, O(reports)
    for name, view in snap.regions.items():
        mine = reports.get(name, [])
        if evaluation_due(view.health, mine, now, topology.timing):
            h = fold_health(view.health, mine, now, topology.timing)
            health_writes.append(WriteHealth(region=name, health=h))
            view = view.model_copy(update={"health": h})
        regions[name] = view
    snap = snap.model_copy(update={"regions": regions})

    writes: dict[str, Write] = {}
    dropped: list[DropIntent] = []
    notes: list[str] = []
    for intent in sorted(snap.intents, key=lambda i: (i.created_at, i.id)):
        if intent.region in writes:
            continue  # one change per region per tick; the next tick takes it
        out = _intent(snap, topology, intent, actor)
        out = out.model_copy(update={"free_claim_rev": snap.claim_to_free(intent)})
        if isinstance(out, DropIntent):
            dropped.append(out)
        else:
            writes[intent.region] = out
            snap = snap.with_record(out.record)

    if not snap.paused:
        for name in regions:
            if name in writes:
                continue
            w, note = _automatic(snap, topology, snap.regions[name], actor)
            if w is not None and drilled(snap, topology, name):
                w = with_cause(w, Cause.DRILL)
            if hold := snap.regions[name].held(now):  # said only when it holds a move back
                w, note = None, f"{name} kept as it is, {hold.describe()}" if w else None
            if w is not None:
                writes[name] = w
                snap = snap.with_record(w.record)
            if note:
                notes.append(note)

    # The pre-warms whose results a pending step waits for (recorded or not this tick:
    # a write can lose its race); the executor forgets any other result.
    awaiting = tuple(awaited(name, view.record) for name, view in regions.items())
    snap, writes, started, waits = all_next_steps(snap, writes, jobs, actor, topology)
    notes += waits
    if aggregate := prefix_aggregation(now, topology.prefixes, jobs):
        started.append(aggregate)
    scale, newest = scale_moves(snap, topology, actor, sizes or {})
    return TickResult(
        now=now,
        health=tuple(health_writes),
        writes=tuple(writes.values()),
        spec=spec_write(snap, spec, actor),
        control=pause_expired(snap, actor),
        releases=holds_expired(snap, actor),
        ladder=tuple(moves),
        ladder_holds=holds,
        scale=scale,
        sizes=newest,
        jobs=tuple(started),
        awaiting=tuple(i for i in awaiting if i),
        dropped=tuple(dropped),
        notes=tuple(notes),
    )
