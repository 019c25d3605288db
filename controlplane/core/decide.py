"""One reconcile tick: snapshot in, actions out. Pure (DESIGN.md §7.1).

``decide`` returns a ``TickResult`` that names every write the orchestrator must
make; each ``Write`` is one fenced etcd transaction for one region (record CAS,
routing, audit, intent resolution: all or nothing). Failover steps that take time
(pre-warm) are returned as ``RunFailover`` and carried out step by step with
``failover_step_write``, so a new leader resumes at the first step not recorded.
Recovery's steps before its first traffic step (the home region's pre-warm) follow
the same pattern: ``RunRecovery`` and ``recovery_step_write``; the traffic steps and
their guard are decided in ``controlplane.core.recovery``.
"""

from __future__ import annotations

from pydantic import Field

from controlplane.config import Topology
from controlplane.core.failover import (
    PlanRefused,
    plan_failover,
    routing_after_switch,
    routing_recovery_step,
)
from controlplane.core.health import evaluation_due, fold_health
from controlplane.core.machine import fire
from controlplane.core.model import (
    AuditEntry,
    Decision,
    FailoverPlan,
    FailoverProgress,
    FailoverStep,
    Frozen,
    Health,
    Intent,
    IntentKind,
    RecoveryProgress,
    RecoveryStep,
    RegionHealth,
    RegionRecord,
    RegionState,
    Routing,
)
from controlplane.core.recovery import MoveKind, next_recovery_move, pending_recovery_steps
from controlplane.core.snapshot import RegionView, Snapshot


class Write(Frozen):
    """One all-or-nothing transaction about one region."""

    region: str
    expected_rev: int  # CAS on regions/<r>/state (0 = must be absent)
    record: RegionRecord
    routing: dict[str, Routing] = Field(default_factory=dict)
    routing_revs: dict[str, int] = Field(default_factory=dict)  # CAS on each routing key
    decision: Decision | None = None
    audit: tuple[AuditEntry, ...] = ()
    resolve_intent: str | None = None


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
    """A refused operator intent: deleted and audited with the reason."""

    intent_id: str
    audit: AuditEntry


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


def pending_steps(record: RegionRecord) -> tuple[FailoverStep, ...]:
    """Steps of the current failover not yet recorded, in the order they must run."""
    fo = record.failover
    if record.state is not RegionState.FAILING_OVER or fo is None:
        return ()
    order = (
        (FailoverStep.PREWARM, FailoverStep.SWITCH)
        if fo.plan.warm_first
        else (FailoverStep.SWITCH, FailoverStep.PREWARM)
    )
    return tuple(s for s in order if s not in fo.done)


def recovery_pending(record: RegionRecord) -> tuple[RecoveryStep, ...]:
    """Steps of the current recovery before its first traffic step, not yet recorded."""
    if record.state is not RegionState.RECOVERED:
        return ()
    return pending_recovery_steps(record.recovery)


def _transition(
    view: RegionView,
    trigger: str,
    *,
    reason: str,
    actor: str,
    now: float,
    record_changes: dict[str, object],
    routing: dict[str, Routing] | None = None,
    routing_revs: dict[str, int] | None = None,
    intent_id: str | None = None,
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
    details = {"trigger": trigger}
    if routing:
        details["routing"] = "; ".join(
            f"{k}={dict(sorted(v.targets.items()))}" for k, v in sorted(routing.items())
        )
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
                action="transition",
                region=view.name,
                reason=reason,
                decision=decision,
                details=details,
            ),
        ),
        resolve_intent=intent_id,
    )


def _start_failover(
    view: RegionView, plan: FailoverPlan, trigger: str, now: float, intent_id: str | None = None
) -> Write:
    return _transition(
        view,
        trigger,
        reason=plan.reason,
        actor=plan.actor,
        now=now,
        intent_id=intent_id,
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
        capacity_rps=topology.region(view.name).capacity_rps,
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
            "complete",
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
        details["routing"] = str(dict(sorted(routing.targets.items())))
    for b in move.breaches:
        details[b.signal] = f"{b.value:.4g}"
        details[f"{b.signal}_threshold"] = f"{b.threshold:.4g}"
    action = {
        MoveKind.ABANDON: "recovery_prewarm",
        MoveKind.HOLD: "recovery_hold",
        MoveKind.GUARD: "recovery_guard",
        MoveKind.SPIKE: "recovery_guard",
        MoveKind.CALM: "recovery_calm",
    }.get(move.kind, "recovery_step")
    if move.kind is MoveKind.ABANDON:
        details.update({k: f"{v:g}" for k, v in sorted(move.progress.prewarm_result.items())})
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
    rec, h, now, timing = view.record, view.health, snap.now, topology.timing
    state, verdict = rec.state, h.verdict
    if state in (RegionState.NORMAL, RegionState.DEGRADED, RegionState.RECOVERED) and (
        verdict is Health.UNHEALTHY
    ):
        relapse = state is RegionState.RECOVERED
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
        return _start_failover(view, plan, "relapse" if relapse else "fail_over", now), None
    if state is not RegionState.FAILING_OVER and view.barred:
        return _drain_barred(snap, topology, view, actor)
    if state is RegionState.NORMAL and verdict is Health.DEGRADED:
        return _transition(
            view, "degrade", reason="SLO breach reported", actor=actor, now=now, record_changes={}
        ), None
    if (
        state is RegionState.DEGRADED
        and verdict is Health.HEALTHY
        and now - h.since >= timing.degraded_dwell_s
    ):
        return _transition(
            view,
            "restore",
            reason=f"healthy for {now - h.since:.0f}s",
            actor=actor,
            now=now,
            record_changes={},
        ), None
    if (
        state is RegionState.FAILING_OVER
        and not pending_steps(rec)
        and rec.failover is not None
        # An operator's failover (a drain) is undone by an operator, never by automation.
        and not rec.failover.plan.manual
        and verdict is Health.HEALTHY
        # Healthy for the whole dwell *since the failover*, not merely since the verdict.
        and now - max(h.since, rec.since) >= timing.recovery_dwell_s
        # A failed drill keeps the region's traffic away until a passing drill or an
        # operator override (DESIGN.md §6).
        and not view.barred
    ):
        healthy_for = now - max(h.since, rec.since)
        return _begin_recovery(view, topology, f"healthy for {healthy_for:.0f}s", actor, now), None
    if state is RegionState.RECOVERED:
        return _recovery_write(view, topology, now, actor), None
    return None, None


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
    return _start_failover(view, plan, "relapse" if relapse else "fail_over", snap.now), None


def _begin_recovery(
    view: RegionView,
    topology: Topology,
    reason: str,
    actor: str,
    now: float,
    intent_id: str | None = None,
) -> Write:
    return _transition(
        view,
        "recover",
        reason=reason,
        actor=actor,
        now=now,
        intent_id=intent_id,
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


def _intent(snap: Snapshot, topology: Topology, intent: Intent) -> Write | DropIntent:
    now = snap.now
    view = snap.regions.get(intent.region)

    def refuse(why: str) -> DropIntent:
        return DropIntent(
            intent_id=intent.id,
            audit=AuditEntry(
                at=now,
                actor=intent.actor,
                action=f"intent_{intent.kind.value}",
                region=intent.region,
                reason=intent.reason,
                result=f"refused: {why}",
                details={"intent": intent.id},
            ),
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
        trigger = "relapse" if state is RegionState.RECOVERED else "fail_over"
        return _start_failover(view, plan, trigger, now, intent.id)
    # RECOVER
    if state is not RegionState.FAILING_OVER:
        return refuse(f"{intent.region} is {state.value}, not FAILING_OVER")
    if pending_steps(view.record):
        return refuse(f"{intent.region}'s failover has not finished its steps yet")
    if view.health.verdict is Health.UNHEALTHY and not intent.force:
        return refuse(f"{intent.region} is still UNHEALTHY (force with a reason to override)")
    return _begin_recovery(view, topology, intent.reason, intent.actor, now, intent.id)


def _with_record(snap: Snapshot, w: Write) -> Snapshot:
    """The snapshot as later decisions of the same tick must see it: a region failed over
    a moment ago is no longer a target, nor counted as serving."""
    view = snap.regions[w.region].model_copy(update={"record": w.record})
    return snap.model_copy(update={"regions": {**snap.regions, w.region: view}})


def decide(snap: Snapshot, topology: Topology, actor: str) -> TickResult:
    """Decide one tick. ``actor`` names this control-plane replica in decisions."""
    now = snap.now
    health_writes: list[WriteHealth] = []
    regions: dict[str, RegionView] = {}
    for name, view in snap.regions.items():
        if evaluation_due(view.health, snap.reports, now, topology.timing):
            h = fold_health(view.health, snap.reports, now, topology.timing)
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
        out = _intent(snap, topology, intent)
        if isinstance(out, DropIntent):
            dropped.append(out)
        else:
            writes[intent.region] = out
            snap = _with_record(snap, out)

    if not snap.control.paused:
        for name in regions:
            if name in writes:
                continue
            w, note = _automatic(snap, topology, snap.regions[name], actor)
            if w is not None:
                writes[name] = w
                snap = _with_record(snap, w)
            if note:
                notes.append(note)

    failovers, recoveries = [], []
    for name, view in snap.regions.items():
        rec = view.record
        if steps := pending_steps(rec):
            failovers.append(RunFailover(region=name, pending=steps))
        if later := recovery_pending(rec):
            recoveries.append(RunRecovery(region=name, pending=later))
    return TickResult(
        now=now,
        health=tuple(health_writes),
        writes=tuple(writes.values()),
        failovers=tuple(failovers),
        recoveries=tuple(recoveries),
        dropped=tuple(dropped),
        notes=tuple(notes),
    )


def failover_step_write(
    snap: Snapshot,
    region: str,
    step: FailoverStep,
    actor: str,
    prewarm_result: dict[str, float] | None = None,
) -> Write:
    """The write that records ``step`` of ``region``'s failover as done (with the routing
    switch itself, for SWITCH). Raises ValueError if the step is not pending."""
    view = snap.regions[region]
    rec = view.record
    if step not in pending_steps(rec) or rec.failover is None:
        raise ValueError(f"{region}: step {step.value} is not pending")
    fo = rec.failover
    now = snap.now
    if step is FailoverStep.PREWARM:
        result = dict(prewarm_result or {})
        new = rec.model_copy(
            update={
                "failover": fo.model_copy(
                    update={"done": (*fo.done, step), "prewarm_result": result}
                )
            }
        )
        return Write(
            region=region,
            expected_rev=view.record_rev,
            record=new,
            audit=(
                AuditEntry(
                    at=now,
                    actor=actor,
                    action="prewarm",
                    region=region,
                    reason=fo.plan.reason,
                    details={k: f"{v:g}" for k, v in sorted(result.items())},
                ),
            ),
        )
    # SWITCH: targets that have since failed over themselves are dropped.
    live = {
        t: w
        for t, w in fo.plan.targets.items()
        if t in snap.regions and snap.regions[t].record.state is not RegionState.FAILING_OVER
    }
    if not live:
        raise ValueError(f"{region}: every planned target has failed over since; waiting")
    plan = (
        fo.plan
        if live == fo.plan.targets
        else fo.plan.model_copy(
            update={"targets": {k: v / sum(live.values()) for k, v in live.items()}}
        )
    )
    routes = routing_after_switch(snap, plan)
    new = rec.model_copy(
        update={"failover": fo.model_copy(update={"done": (*fo.done, step), "plan": plan})}
    )
    return Write(
        region=region,
        expected_rev=view.record_rev,
        record=new,
        routing=routes,
        routing_revs={k: snap.regions[k].routing_rev for k in routes},
        audit=(
            AuditEntry(
                at=now,
                actor=actor,
                action="routing_switch",
                region=region,
                reason=plan.reason,
                details={
                    k: str(dict(sorted(v.targets.items()))) for k, v in sorted(routes.items())
                },
            ),
        ),
    )


def recovery_step_write(
    snap: Snapshot,
    region: str,
    step: RecoveryStep,
    actor: str,
    result: dict[str, float] | None = None,
) -> Write:
    """The write that records ``step`` of ``region``'s recovery as done, with its result
    (a failed pre-warm too: recovery goes on). Raises ValueError if it is not pending."""
    view = snap.regions[region]
    rec = view.record
    prog = rec.recovery
    if step not in recovery_pending(rec) or prog is None:
        raise ValueError(f"{region}: recovery step {step.value} is not pending")
    figures = dict(result or {})
    new = rec.model_copy(
        update={
            "recovery": prog.model_copy(
                update={"done": (*prog.done, step), "prewarm_result": figures}
            )
        }
    )
    failed = figures.get("failed", 0.0) > 0 or figures.get("targets_unreachable", 0.0) > 0
    return Write(
        region=region,
        expected_rev=view.record_rev,
        record=new,
        audit=(
            AuditEntry(
                at=snap.now,
                actor=actor,
                action=f"recovery_{step.value}",
                region=region,
                reason=f"{region}'s own top prefixes replayed on it before its first step",
                result="failed; recovery goes on" if failed else "ok",
                details={k: f"{v:g}" for k, v in sorted(figures.items())},
            ),
        ),
    )
