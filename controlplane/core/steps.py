"""A failover's and a recovery's steps as writes. Pure (docs/architecture.md §7.1).

A failover's steps (pre-warm, routing switch) and a recovery's steps before its first
traffic step (the home region's pre-warm) are recorded in the region's record when
done, so a new leader resumes at the first one not recorded (``pending_steps``,
``recovery_pending``). ``decide`` writes the switch itself and starts each pre-warm as
a job (``failover_job_id``, ``recovery_job_id`` name them); a later tick records the
job's result with ``failover_step_write`` or ``recovery_step_write``.
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.core.actions import Job, JobKind, Jobs, Write
from controlplane.core.failover import resplit_after_prewarm, routing_after_switch
from controlplane.core.recovery import pending_recovery_steps
from controlplane.kernel.config import Topology
from controlplane.kernel.details import routing_details
from controlplane.kernel.model import (
    AuditAction,
    AuditEntry,
    FailoverPlan,
    FailoverProgress,
    FailoverStep,
    PrewarmFigures,
    RecoveryStep,
    RegionRecord,
    RegionState,
)
from controlplane.kernel.snapshot import Snapshot


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


def failover_job_id(region: str, failover: FailoverProgress) -> str:
    """Names one failover's pre-warm: a new leader asks the agents again under the same
    id, and they do not warm twice."""
    return f"{region}@{failover.started_at:.3f}"


def recovery_job_id(region: str, record: RegionRecord) -> str:
    return f"{region}@recovery@{record.since:.3f}"


def failover_step_write(
    snap: Snapshot,
    region: str,
    step: FailoverStep,
    actor: str,
    prewarm_result: PrewarmFigures | None = None,
    topology: Topology | None = None,
) -> Write:
    """The write that records ``step`` of ``region``'s failover as done (with the routing
    switch itself, for SWITCH). With ``topology``, a switch after the pre-warm splits
    the load again by what the targets bear warm (``resplit_after_prewarm``). Raises
    ValueError if the step is not pending."""
    rec = snap.regions[region].record
    if step not in pending_steps(rec) or rec.failover is None:
        raise ValueError(f"{region}: step {step.value} is not pending")
    if step is FailoverStep.PREWARM:
        return _prewarm_write(snap, region, actor, prewarm_result or PrewarmFigures())
    return _switch_write(snap, region, actor, topology)


def _prewarm_write(snap: Snapshot, region: str, actor: str, result: PrewarmFigures) -> Write:
    """Records the failover's pre-warm as done with its figures, and consumes its job."""
    view = snap.regions[region]
    rec = view.record
    fo = rec.failover
    assert fo is not None  # failover_step_write checked
    new = rec.model_copy(
        update={
            "failover": fo.model_copy(
                update={"done": (*fo.done, FailoverStep.PREWARM), "prewarm_result": result}
            )
        }
    )
    return Write(
        region=region,
        expected_rev=view.record_rev,
        record=new,
        failover_steps=(FailoverStep.PREWARM,),
        consumes=(failover_job_id(region, fo),),
        audit=(
            AuditEntry(
                at=snap.now,
                actor=actor,
                action=AuditAction.PREWARM,
                region=region,
                reason=fo.plan.reason,
                details=result.details(),
            ),
        ),
    )


def _switch_write(snap: Snapshot, region: str, actor: str, topology: Topology | None) -> Write:
    """The routing switch, recorded as done with the plan it switched by."""
    view = snap.regions[region]
    rec = view.record
    fo = rec.failover
    assert fo is not None  # failover_step_write checked
    plan = _plan_at_switch(snap, region, fo, topology)
    routes = routing_after_switch(snap, plan)
    new = rec.model_copy(
        update={
            "failover": fo.model_copy(
                update={"done": (*fo.done, FailoverStep.SWITCH), "plan": plan}
            )
        }
    )
    # No session is written, now or later: one pinned to ``region`` is re-pinned by the
    # gateway that serves its next request; one that sends none until ``region`` serves
    # again keeps its pin and is served there again, as nothing of it is cached
    # elsewhere (docs/architecture.md §2).
    return Write(
        region=region,
        expected_rev=view.record_rev,
        record=new,
        routing=routes,
        routing_revs={k: snap.regions[k].routing_rev for k in routes},
        failover_steps=(FailoverStep.SWITCH,),
        audit=(
            AuditEntry(
                at=snap.now,
                actor=actor,
                action=AuditAction.ROUTING_SWITCH,
                region=region,
                reason=plan.reason,
                details=routing_details(routes),  # {region: JSON {target: weight}}
            ),
        ),
    )


def _plan_at_switch(
    snap: Snapshot, region: str, fo: FailoverProgress, topology: Topology | None
) -> FailoverPlan:
    """The plan as it stands when the switch is written: targets that have since failed
    over themselves are dropped, and the load is split again by the pre-warm's result
    (with ``topology``). ValueError when no target is left: the next tick retries."""
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
    if topology is not None and fo.prewarm_result is not None:
        plan = resplit_after_prewarm(snap, topology, plan, fo.prewarm_result.attained_fraction)
    return plan


def recovery_step_write(
    snap: Snapshot,
    region: str,
    step: RecoveryStep,
    actor: str,
    result: PrewarmFigures | None = None,
) -> Write:
    """The write that records ``step`` of ``region``'s recovery as done, with its result
    (a failed pre-warm too: recovery goes on). Raises ValueError if it is not pending."""
    view = snap.regions[region]
    rec = view.record
    prog = rec.recovery
    if step not in recovery_pending(rec) or prog is None:
        raise ValueError(f"{region}: recovery step {step.value} is not pending")
    figures = result or PrewarmFigures()
    new = rec.model_copy(
        update={
            "recovery": prog.model_copy(
                update={"done": (*prog.done, step), "prewarm_result": figures}
            )
        }
    )
    failed = figures.failed or (figures.targets_unreachable or 0.0) > 0
    return Write(
        region=region,
        expected_rev=view.record_rev,
        record=new,
        consumes=(recovery_job_id(region, rec),),
        audit=(
            AuditEntry(
                at=snap.now,
                actor=actor,
                action=AuditAction.of_recovery(step),
                region=region,
                reason=f"{region}'s own top prefixes replayed on it before its first step",
                result="failed; recovery goes on" if failed else "ok",
                details=figures.details(),
            ),
        ),
    )


def next_steps(
    snap: Snapshot,
    name: str,
    first: Write | None,
    jobs: Jobs,
    actor: str,
    topology: Topology | None = None,
) -> tuple[Write | None, list[Job], str | None]:
    """The region's failover or recovery steps that can be taken now, after ``first``
    (this tick's write of the region, if any): merged into one write with it, and the
    jobs to start. A switch is written at once; a pre-warm is recorded once its job's
    result is in, else its job is started (the executor ignores one already running)."""
    out, started = first, []
    while steps := pending_steps(snap.regions[name].record):
        fo = snap.regions[name].record.failover
        assert fo is not None
        fid = failover_job_id(name, fo)
        if steps[0] is FailoverStep.PREWARM and fid not in jobs.results:
            started.append(Job(kind=JobKind.FAILOVER_PREWARM, region=name, id=fid, plan=fo.plan))
            break
        try:
            w = failover_step_write(
                snap, name, steps[0], actor, jobs.results.get(fid), topology=topology
            )
        except ValueError as e:  # every target failed over since: the next tick retries
            return out, started, str(e)
        out = w if out is None else out.merged(w)
        snap = snap.with_record(w.record)
    rec = snap.regions[name].record
    if recovery_pending(rec):
        rid = recovery_job_id(name, rec)
        if rid not in jobs.results:
            started.append(Job(kind=JobKind.RECOVERY_PREWARM, region=name, id=rid))
        elif first is None:  # recorded alone: this tick's move was decided without it
            out = recovery_step_write(
                snap, name, recovery_pending(rec)[0], actor, jobs.results[rid]
            )
    return out, started, None


def all_next_steps(
    snap: Snapshot,
    writes: Mapping[str, Write],
    jobs: Jobs,
    actor: str,
    topology: Topology | None = None,
) -> tuple[Snapshot, dict[str, Write], list[Job], list[str]]:
    """Every region's ``next_steps`` this tick, each merged with its region's write in
    ``writes`` (this tick's transitions). Returns the snapshot with the records written,
    the writes, the jobs to start (not those already running) and why steps wait."""
    out = dict(writes)  # a region's merged write keeps its place in the tick's order
    started: list[Job] = []
    waits: list[str] = []
    for name in snap.regions:
        w, new_jobs, note = next_steps(snap, name, out.get(name), jobs, actor, topology)
        if w is not None:
            out[name] = w
            snap = snap.with_record(w.record)
        started += [j for j in new_jobs if j.id not in jobs.running]
        if note:
            waits.append(note)
    return snap, out, started, waits


def awaited(name: str, rec: RegionRecord) -> str:
    """The id of the pre-warm whose result the region's pending step waits for; "" if none."""
    if FailoverStep.PREWARM in pending_steps(rec) and rec.failover is not None:
        return failover_job_id(name, rec.failover)
    return recovery_job_id(name, rec) if recovery_pending(rec) else ""
