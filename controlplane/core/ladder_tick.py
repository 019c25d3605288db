"""Every region's degradation ladder, one step per tick. Pure (docs/architecture.md §5).

For each region: the mode from its state (DEGRADED, a failover target short of
headroom, or a pool the budget holds short now or within the ladder's lead: degrading;
FAILING_OVER: frozen; otherwise recovering), its signals (the folded health's, plus
``headroom_fraction``), its ``degradation/<region>`` record and
:func:`controlplane.core.ladder_executor.next_ladder_action`. A change is a
``LadderWrite`` the orchestrator writes in one fenced transaction, compare-and-set on
the record's revision, with its audit entry. The gateways and agents watch
``degradation/`` and carry the flags out.
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.core.actions import LadderWrite
from controlplane.core.bearing import allowed_now
from controlplane.core.causes import drilled
from controlplane.core.ladder_executor import ActionKind, LadderMode, mode_for, next_ladder_action
from controlplane.kernel.config import Topology
from controlplane.kernel.details import json_list
from controlplane.kernel.ladder.model import Ladder, with_headroom
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import AuditAction, AuditEntry, Cause, RegionState
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.snapshot import RegionView, Snapshot


def ladder_moves(
    snap: Snapshot, topology: Topology, ladder: Ladder, actor: str
) -> tuple[list[LadderWrite], dict[str, str]]:
    """The ladder changes of this tick, and why each region that does not move holds
    (all of them while automation is paused, a held unit's: the steps stay as they are)."""
    if snap.paused:
        return [], {"*": f"paused with automation: {snap.control.reason}"}
    short = _short_of_headroom(snap)
    # the budget stopped a scale-up the forecast needed, or will when an exemption
    # ends within the ladder's lead: shed, as a short target does
    broke = _short_of_budget(snap, topology, ladder_lead_s(ladder))
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
        mode = mode_for(
            view.record.state, short_of_headroom=region.name in short or region.name in broke
        )
        if view.ladder is None and mode is not LadderMode.DEGRADING:
            continue  # nothing applied and nothing to apply: no record needed
        record = view.ladder or DegradationRecord(region=region.name)
        bears = _bearable(view, topology, snap.now, broke.get(region.name))
        signals = with_headroom(view.health.signals, bears)
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
                "cause": _cause(snap, topology, region.name, short, broke).value,
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


def _cause(
    snap: Snapshot, topology: Topology, unit: str, short: set[str], broke: Mapping[str, int]
) -> Cause:
    """A ladder step's cause: a drill on the region, else capacity when the region took
    more than it can absorb (its steps shed what it cannot carry), else the budget when
    it holds the pool under its forecast, else automatic."""
    if drilled(snap, topology, unit):
        return Cause.DRILL
    if unit in short:
        return Cause.CAPACITY
    return Cause.BUDGET if unit in broke else Cause.AUTOMATIC


def _bearable(view: RegionView, topology: Topology, now: float, paid: int | None) -> float:
    """What the region bears now; for a pool the budget holds short (``paid``: the
    ACTIVE replicas it pays for, now or once its exemption ends), no more than those (so
    its headroom and CBU triggers see the shortfall)."""
    allowed = allowed_now(view, topology, now)
    rec = view.scale
    if paid is not None and rec is not None and rec.per_replica_rps is not None:
        return min(allowed, rec.per_replica_rps * paid)
    return allowed


def ladder_lead_s(ladder: Ladder) -> float:
    """How long before a pool's budget exemption ends the ladder starts degrading it:
    a step interval per step. Walking from none applied to the last step (shed-batch)
    takes one interval fewer; the spare one is for the gateways to see the flag. So
    the pool sheds by the time the budget cuts its capacity, rather than three steps
    after (the alternative, the cut waiting for the ladder, would spend past the
    allowance: the budget's terms are the bound)."""
    return ladder.degrade.step_interval_s * len(ladder.steps)


def budget_paid(rec: ScaleRecord, now: float, lead_s: float) -> int | None:
    """The ACTIVE replicas the budget pays for, when it holds the pool short: now (the
    record's ``budget.short``: its ACTIVE are capped already), or once an exemption
    ending within ``lead_s`` ends (its ``short_at_end``: the ACTIVE it would cut); None
    when it holds nothing short now or that soon."""
    note = rec.budget
    if note is None:
        return None
    if note.short:
        return rec.active
    if note.short_at_end and note.ends_at is not None and note.ends_at - now <= lead_s:
        return max(0, rec.active - note.short_at_end)
    return None


def _short_of_budget(snap: Snapshot, topology: Topology, lead_s: float) -> dict[str, int]:
    """Pools whose last scale record says the budget holds ACTIVE replicas the forecast
    needed short (:func:`budget_paid`), with what it pays for, decided within a
    checkpoint and the dark window (an old record's word is not the budget's now)."""
    policy = topology.scaling
    if policy is None or topology.cost is None:
        return {}
    out = {}
    for name, view in snap.regions.items():
        rec = view.scale
        if rec is None or snap.now - rec.decided_at > policy.checkpoint_s + policy.dark_after_s:
            continue
        if (paid := budget_paid(rec, snap.now, lead_s)) is not None:
            out[name] = paid
    return out


def _short_of_headroom(snap: Snapshot) -> set[str]:
    """Targets of running failovers whose plan said they cannot absorb the load."""
    out: set[str] = set()
    for view in snap.regions.values():
        fo = view.record.failover
        if view.record.state is RegionState.FAILING_OVER and fo and fo.plan.headroom_short:
            out.update(fo.plan.targets)
    return out
