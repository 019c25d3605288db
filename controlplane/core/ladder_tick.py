"""Every region's degradation ladder, one step per tick. Pure (docs/architecture.md §5).

For each region: the mode from its state (DEGRADED, or a failover target short of
headroom: degrading; FAILING_OVER: frozen; otherwise recovering), its signals (the
folded health's, plus ``headroom_fraction``), its ``degradation/<region>`` record and
:func:`controlplane.core.ladder_executor.next_ladder_action`. A change is a
``LadderWrite`` the orchestrator writes in one fenced transaction, compare-and-set on
the record's revision, with its audit entry. The gateways and agents watch
``degradation/`` and carry the flags out.
"""

from __future__ import annotations

from controlplane.core.actions import LadderWrite
from controlplane.core.bearing import allowed_now
from controlplane.core.causes import drilled
from controlplane.core.ladder_executor import ActionKind, LadderMode, mode_for, next_ladder_action
from controlplane.kernel.config import Topology
from controlplane.kernel.details import json_list
from controlplane.kernel.ladder.model import Ladder, with_headroom
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import AuditAction, AuditEntry, Cause, RegionState
from controlplane.kernel.snapshot import Snapshot


def ladder_moves(
    snap: Snapshot, topology: Topology, ladder: Ladder, actor: str
) -> tuple[list[LadderWrite], dict[str, str]]:
    """The ladder changes of this tick, and why each region that does not move holds
    (all of them while automation is paused, a held unit's: the steps stay as they are)."""
    if snap.paused:
        return [], {"*": f"paused with automation: {snap.control.reason}"}
    short = _short_of_headroom(snap)
    writes: list[LadderWrite] = []
    holds: dict[str, str] = {}
    for region in topology.regions:
        view = snap.regions.get(region.name)
        if view is None:
            continue
        if hold := view.held(snap.now):
            holds[region.name] = hold.describe()
            continue
        if view.ladder is None and view.ladder_rev:
            holds[region.name] = (
                "degradation record unreadable: the ladder waits until it is rewritten"
            )
            continue
        mode = mode_for(view.record.state, short_of_headroom=region.name in short)
        if view.ladder is None and mode is not LadderMode.DEGRADING:
            continue  # nothing applied and nothing to apply: no record needed
        record = view.ladder or DegradationRecord(region=region.name)
        signals = with_headroom(view.health.signals, allowed_now(view, topology, snap.now))
        action = next_ladder_action(ladder, record, signals, mode, snap.now)
        change = action.change
        if change is None:
            if action.kind is ActionKind.HOLD:
                holds[region.name] = action.reason
            continue
        entry = AuditEntry(
            at=snap.now,
            actor=actor,
            action=AuditAction.of_ladder(change),
            region=region.name,
            reason=action.reason,
            details={
                "step": action.step or "",
                "applied": json_list(action.record.applied),
                "cause": _cause(snap, topology, region.name, short).value,
            },
        )
        writes.append(
            LadderWrite(
                region=region.name,
                expected_rev=view.ladder_rev,
                record=action.record,
                audit=entry,
                kind=change,
                step=action.step,
            )
        )
    return writes, holds


def _cause(snap: Snapshot, topology: Topology, unit: str, short: set[str]) -> Cause:
    """A ladder step's cause: a drill on the region, else capacity when the region took
    more than it can absorb (its steps shed what it cannot carry), else automatic."""
    if drilled(snap, topology, unit):
        return Cause.DRILL
    return Cause.CAPACITY if unit in short else Cause.AUTOMATIC


def _short_of_headroom(snap: Snapshot) -> set[str]:
    """Targets of running failovers whose plan said they cannot absorb the load."""
    out: set[str] = set()
    for view in snap.regions.values():
        fo = view.record.failover
        if view.record.state is RegionState.FAILING_OVER and fo and fo.plan.headroom_short:
            out.update(fo.plan.targets)
    return out
