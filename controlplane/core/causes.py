"""What started a transition (``Cause``), for the decisions that carry it into metrics
and events, so that alerting can tell a real outage from planned work. Pure."""

from __future__ import annotations

from controlplane.core.actions import Write
from controlplane.kernel.config import Topology
from controlplane.kernel.model import Cause
from controlplane.kernel.snapshot import Snapshot


def drilled(snap: Snapshot, topology: Topology, unit: str) -> bool:
    """A drill holds the lock on ``unit`` now: on the unit itself, or on its region (a
    drill on a region with model pools acts on every pool)."""
    lock = snap.drill
    return lock is not None and lock.region in (unit, topology.site(unit))


def with_cause(w: Write, cause: Cause) -> Write:
    """``w`` with its decision's cause set, wherever the decision is kept: the write,
    the region's record and the transition's audit entry."""
    d = w.decision
    if d is None or d.cause == cause:
        return w
    d = d.model_copy(update={"cause": cause})
    audit = tuple(
        a.model_copy(update={"decision": d}) if a.decision is not None else a for a in w.audit
    )
    record = w.record.model_copy(update={"last_decision": d})
    return w.model_copy(update={"decision": d, "record": record, "audit": audit})
