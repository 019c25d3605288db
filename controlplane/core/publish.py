"""What the leader publishes for every other process, as parts of its tick: the cluster
spec (one write), the prefix catalogs (a periodic job) and the end of a pause that
expired and the holds whose time is up. Pure (docs/architecture.md §2)."""

from __future__ import annotations

from controlplane.core.actions import (
    CLUSTER,
    ControlWrite,
    HoldRelease,
    Job,
    JobKind,
    Jobs,
    SpecWrite,
)
from controlplane.kernel.cluster_spec import ClusterSpec, changes
from controlplane.kernel.config import PrefixesConfig
from controlplane.kernel.model import AuditAction, AuditEntry, ControlFlags
from controlplane.kernel.snapshot import Snapshot


def spec_write(snap: Snapshot, spec: ClusterSpec | None, actor: str) -> SpecWrite | None:
    """The leader publishes what its topology says all processes must agree on
    (docs/architecture.md §2), when etcd holds another spec, an unreadable one or none."""
    if spec is None or snap.spec == spec:
        return None
    if snap.spec is None:
        reason = "the stored spec was unreadable" if snap.spec_rev else "no cluster spec yet"
    else:
        reason = "the leader's topology differs from the published spec"
    entry = AuditEntry(
        at=snap.now,
        actor=actor,
        action=AuditAction.SPEC_PUBLISHED,
        reason=reason,
        details={k: f"{old} -> {new}" for k, (new, old) in changes(spec, snap.spec).items()},
    )
    return SpecWrite(expected_rev=snap.spec_rev, spec=spec, audit=entry)


def pause_expired(snap: Snapshot, actor: str) -> ControlWrite | None:
    """A pause past its ``until`` ends: automation resumes, in the audit log as a resume
    by the leader naming the pause (its actor, reason and length). The ticks decide as
    unpaused from ``until`` on whether or not this write lands."""
    c = snap.control
    if not c.paused or c.in_force(snap.now) or c.until is None:
        return None
    reason = (
        f"the pause {c.actor or 'an operator'} set for {c.until - c.at:.0f} s expired "
        f"(it said: {c.reason or 'no reason'})"
    )
    return ControlWrite(
        expected_rev=snap.control_rev,
        control=ControlFlags(paused=False, reason=reason, actor=actor, at=snap.now),
        audit=AuditEntry(at=snap.now, actor=actor, action=AuditAction.RESUME, reason=reason),
    )


def holds_expired(snap: Snapshot, actor: str) -> tuple[HoldRelease, ...]:
    """Each unit's hold past its ``until`` ends: deleted, audited as a release by the
    leader naming the hold. The ticks decide as unheld from ``until`` on whether or not
    this write lands."""
    out = []
    for name, view in snap.regions.items():
        # a budget lift ends as a hold does (the same record, another key and action)
        for h, rev, lift in ((view.hold, view.hold_rev, False), (view.lift, view.lift_rev, True)):
            if h is None or h.in_force(snap.now):
                continue
            what = "budget lift" if lift else "hold"
            reason = (
                f"the {what} {h.actor or 'an operator'} set for {h.until - h.at:.0f} s "
                f"expired (it said: {h.reason or 'no reason'})"
            )
            action = AuditAction.BUDGET_UNLIFT if lift else AuditAction.RELEASE
            entry = AuditEntry(at=snap.now, actor=actor, action=action, region=name, reason=reason)
            out.append(HoldRelease(unit=name, expected_rev=rev, audit=entry, lift=lift))
    return tuple(out)


def prefix_aggregation(now: float, prefixes: PrefixesConfig, jobs: Jobs) -> Job | None:
    """The prefix aggregation to start this tick: at a term's first tick, then once
    ``aggregate_interval_s`` has passed since the last one ended (failed or not)."""
    if any(i.startswith(f"{JobKind.PREFIX_AGGREGATE.value}@") for i in jobs.running):
        return None
    last = jobs.aggregated_at
    if last is not None and now - last < prefixes.aggregate_interval_s:
        return None
    kind = JobKind.PREFIX_AGGREGATE
    return Job(kind=kind, region=CLUSTER, id=f"{kind.value}@{now:.3f}")
