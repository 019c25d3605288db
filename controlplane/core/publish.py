"""What the leader publishes for every other process, as parts of its tick: the cluster
spec (one write) and the prefix catalogs (a periodic job). Pure (docs/architecture.md §2)."""

from __future__ import annotations

from controlplane.core.actions import CLUSTER, Job, JobKind, Jobs, SpecWrite
from controlplane.kernel.cluster_spec import ClusterSpec, changes
from controlplane.kernel.config import PrefixesConfig
from controlplane.kernel.model import AuditAction, AuditEntry
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
