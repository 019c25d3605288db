"""The cluster spec as one write of the leader's tick. Pure (docs/architecture.md §2)."""

from __future__ import annotations

from controlplane.core.actions import SpecWrite
from controlplane.kernel.cluster_spec import ClusterSpec, changes
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
