"""Every pool's size, one decision per tick (docs/scaling.md). Pure.

For each failover unit (a region, or a region's model pool): its newest fresh agent
report (load, hit rate, queue, first-token p99), what one replica bears (the capacity
probe's record when fresh, else the typed ``capacity_rps`` over its replicas), and
:func:`controlplane.core.scaler.size_pool`. A changed size is a ``ScaleWrite`` with an
audit entry, written fenced and compare-and-set on ``scale/<unit>``'s revision like a
ladder move; the forecaster's state is written as a checkpoint every
``scaling.checkpoint_s`` so that a new leader continues a ramp.
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.core.actions import ScaleWrite
from controlplane.core.bearing import HIT_RATE_SIGNAL, moved_hit_rate, region_bearing
from controlplane.core.scaler import Capacity, Moving, PoolSignals, size_pool
from controlplane.core.spend import Budget, Held, budget_for, committed, held_spend
from controlplane.kernel.capacity.record import CapacitySource
from controlplane.kernel.config import Topology
from controlplane.kernel.details import json_list
from controlplane.kernel.ladder.model import LOAD_SIGNAL, TTFT_SIGNAL
from controlplane.kernel.model import (
    AuditAction,
    AuditEntry,
    FailoverStep,
    HealthReport,
    ObserverKind,
    RegionState,
)
from controlplane.kernel.pool.cost import CostPolicy
from controlplane.kernel.pool.scale import ACTIVATION_SIGNAL, ScaleRecord
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.kernel.vllm.signals import LOAD_RAW_SIGNAL  # the last round, unsmoothed

QUEUE_SIGNAL = "queue_depth"


def scale_moves(
    snap: Snapshot, topology: Topology, actor: str, memory: Mapping[str, ScaleRecord]
) -> tuple[tuple[ScaleWrite, ...], dict[str, ScaleRecord]]:
    """The scale records to write this tick, and every pool's newest record; none
    without the topology's ``scaling:`` or while automation is paused (sizes hold); a
    held unit's size holds."""
    policy = topology.scaling
    if policy is None or snap.paused:
        return (), {}
    newest = _newest_agent_reports(snap.reports)
    moving = moving_loads(snap)
    writes: list[ScaleWrite] = []
    sizes: dict[str, ScaleRecord] = {}
    spend = _committed(snap, topology, memory)
    for name, view in snap.regions.items():
        if (view.scale is None and view.scale_rev) or view.held(snap.now):
            continue  # unreadable (rewritten by an operator, never over blindly), or held
        sized = size_pool(
            name,
            view.scale,
            _signals(view, newest.get(name)),
            _capacity(view, topology, snap.now),
            policy,
            now=snap.now,
            ttft_slo_s=topology.region(name).slo.ttft_p99_s,
            failing_over=view.record.state is RegionState.FAILING_OVER,
            moving=moving.get(name),
            memory=memory.get(name),
            budget=pool_budget(snap, topology, name, moving.get(name), spend),
        )
        sizes[name] = sized.record
        if topology.cost is not None:  # what the next pools of this tick size against
            spend[name] = max(spend[name], committed_of(topology, name, sized.record))
        if not sized.due and not _budget_news(view.scale, sized.record):
            continue
        audit = None
        if sized.changed:
            before = view.scale
            audit = AuditEntry(
                at=snap.now,
                actor=actor,
                action=AuditAction.SCALE,
                region=name,
                reason=sized.record.reasons[0] if sized.record.reasons else "",
                details={
                    "active": str(sized.record.active),
                    "warm": str(sized.record.warm),
                    "active_before": "" if before is None else str(before.active),
                    "warm_before": "" if before is None else str(before.warm),
                    "reasons": json_list(sized.record.reasons),
                },
            )
        writes.append(
            ScaleWrite(unit=name, expected_rev=view.scale_rev, record=sized.record, audit=audit)
        )
    return tuple(writes), sizes


def moving_loads(snap: Snapshot) -> dict[str, Moving]:
    """Each failover target's share of the running failovers' load, and the hit rate it
    arrives with there: cold, or the source's times the pre-warm's verified attainment
    on that target (docs/capacity.md). Two failovers onto one target add up
    (:func:`_together`)."""
    parts: dict[str, list[Moving]] = {}
    for view in snap.regions.values():
        fo = view.record.failover
        if view.record.state is not RegionState.FAILING_OVER or fo is None:
            continue
        warmed = FailoverStep.PREWARM in fo.done
        figures = fo.prewarm_result
        for target, weight in fo.plan.targets.items():
            attained = (
                figures.target_attained.get(target, figures.attained_fraction) if warmed else None
            )
            moving = Moving(
                source=fo.plan.source,
                started_at=fo.started_at,
                rps=fo.plan.moved_rps * weight,
                hit_rate=moved_hit_rate(fo.plan.source_hit_rate, attained),
            )
            parts.setdefault(target, []).append(moving)
    return {target: _together(moves) for target, moves in parts.items()}


def _together(moves: list[Moving]) -> Moving:
    """Several failovers moving load onto one target, as one: their loads summed, at the
    hit rate of them all (weighted by load: the hits over the requests, as the pool will
    see them and as its own load is sized), named by the earliest still running, from
    its start. The earliest, because the allowance bounds how long the pool may spend
    past its budget, which a later failover must not restart (a chain of them would
    keep it exempt for good); and because the scaler keys the failover's ``Incoming``
    on (source, started_at), so the pool's own baseline, taken before any load moved,
    is kept when a second failover joins (a new key would take it again, the first's
    moved load inside it, and count that load twice)."""
    first = min(moves, key=lambda m: (m.started_at, m.source))
    rps = sum(m.rps for m in moves)
    if rps > 0:
        hit = sum(m.rps * m.hit_rate for m in moves) / rps
    else:  # nothing measured moving: the coldest, the capacity it takes is the most
        hit = min(m.hit_rate for m in moves)
    return Moving(source=first.source, started_at=first.started_at, rps=rps, hit_rate=hit)


def _newest_agent_reports(reports: tuple[HealthReport, ...]) -> dict[str, HealthReport]:
    out: dict[str, HealthReport] = {}
    for r in reports:
        if r.kind is ObserverKind.AGENT and (
            r.region not in out or r.received_at > out[r.region].received_at
        ):
            out[r.region] = r
    return out


def _signals(view: RegionView, report: HealthReport | None) -> PoolSignals:
    active = view.active_replicas or 0
    known = view.active_replicas is not None
    if report is None:
        return PoolSignals(None, None, None, None, None, active, serving_known=known)
    s = report.signals
    load = s.get(LOAD_RAW_SIGNAL, s.get(LOAD_SIGNAL))
    return PoolSignals(
        observed_at=report.received_at,
        load_rps=None if load is None else max(0.0, load),
        hit_rate=s.get(HIT_RATE_SIGNAL),
        queue_depth=s.get(QUEUE_SIGNAL),
        ttft_p99_s=s.get(TTFT_SIGNAL),
        active_now=active,
        activation_p95_s=s.get(ACTIVATION_SIGNAL),
        wake_at=view.wake_at,
        serving_known=known,
    )


def _capacity(view: RegionView, topology: Topology, now: float) -> Capacity:
    """What one replica bears at a hit rate: the probe's replica (with the measured
    scaling efficiency), else the typed capacity over the replicas serving now."""
    bearing = region_bearing(view, topology, now)
    record = bearing.record
    if bearing.source is CapacitySource.MEASURED and record is not None:
        eff, fos, effect = record.scaling_efficiency, record.factor_of_safety, record.effect
        return Capacity(
            lambda h: effect.capacity(h) / fos * eff, "measured", measured_at=record.measured_at
        )
    n = max(1, view.active_replicas or 0)
    typed = topology.region(view.name).capacity_rps
    why = f"typed capacity_rps {typed:g} / {n} replicas"
    if bearing.source is CapacitySource.STALE:
        why += f"; the probe's is stale: {bearing.reason}"
    return Capacity(lambda h: bearing.allowed(h) / n, why)


def committed_of(topology: Topology, unit: str, record: ScaleRecord) -> float:
    """A pool's $/h at the sizes a record asks for (0 without ``cost:``)."""
    cost = topology.cost
    return 0.0 if cost is None else committed(cost, unit, record.active, record.warm)


def _committed(
    snap: Snapshot, topology: Topology, memory: Mapping[str, ScaleRecord]
) -> dict[str, float]:
    """Each pool's $/h committed: the more of what runs now and what its last decision
    asks for (a scale-up on its way is spent already, as far as the budget goes)."""
    cost = topology.cost
    if cost is None:
        return {}
    out = {}
    for name, view in snap.regions.items():
        now = held_spend(cost, view)  # launches at ACTIVE's price, IDLE at its own
        last = memory.get(name) or view.scale
        out[name] = max(now, committed_of(topology, name, last) if last else 0.0)
    return out


def pool_budget(
    snap: Snapshot,
    topology: Topology,
    unit: str,
    moving: Moving | None,
    spend: Mapping[str, float],
) -> Budget | None:
    """What ``unit`` may spend: exempt while an operator's lift holds, and while it is
    the target of a failover within its allowance less the wind-down (then the budget
    binds again, the ladder sheds what it cannot carry, and the replicas it cuts are
    stopped by the allowance's end). An exemption says when it ends, so that the
    ladder is shedding by then (``core/ladder_tick``)."""
    cost = topology.cost
    if cost is None:
        return None
    exempt = lapsed = ""
    ends_at = None
    if lift := snap.regions[unit].lifted(snap.now):
        exempt = f"{lift.describe()} (until {lift.until:.0f}, {lift.until - snap.now:.0f} s left)"
        ends_at = lift.until
    elif moving is not None:
        exempt, lapsed, ends_at = _allowance(cost, moving, snap.now)
    zones = {r.name: r.zone for r in topology.regions}
    held = Held.of(snap.regions[unit])  # what it pays for whatever the scaler asks
    return budget_for(
        cost, unit, zones, spend, exempt=exempt, lapsed=lapsed, held=held, ends_at=ends_at
    )


def _allowance(cost: CostPolicy, moving: Moving, now: float) -> tuple[str, str, float | None]:
    """A failover target's exemption (why, or why it lapsed, and when it ends). It ends
    ``failover_wind_down_s`` before the allowance does: the allowance bounds what the
    pool spends, not the leader's word, and the replicas the budget cuts drain, sleep
    after the IDLE dwell and stop (an over-budget pool's WARM dwell waived) within it.
    Ending it by the dwells the pool keeps otherwise (300 s of WARM) would take a sixth
    of the default allowance to pay for standby the budget let go."""
    allowance, wind = cost.failover_allowance_s, cost.failover_wind_down_s
    spent = now - moving.started_at
    ends_at = moving.started_at + max(0.0, allowance - wind)
    if now < ends_at:
        exempt = (
            f"failover from {moving.source}: {ends_at - now:.0f} s left of its "
            f"{allowance:g} s budget allowance (its last {wind:g} s wind it down)"
        )
        return exempt, "", ends_at
    if spent < allowance:
        lapsed = (
            f"failover from {moving.source}: its {allowance:g} s budget allowance ends in "
            f"{allowance - spent:.0f} s: the budget binds again {wind:g} s before, so that "
            "the replicas it cuts are stopped by then"
        )
    else:
        lapsed = (
            f"failover from {moving.source}: its {allowance:g} s budget allowance "
            f"ended {spent - allowance:.0f} s ago: the budget binds again"
        )
    return "", lapsed, None


def _budget_news(stored: ScaleRecord | None, record: ScaleRecord) -> bool:
    """Whether the budget started or stopped holding the pool short (now, or at the end
    of its exemption), or the pool went over it or back: the ladder and the pool's agent
    read them from the stored record, so it is written at once, not at the next
    checkpoint."""
    return _budget_word(stored) != _budget_word(record)


def _budget_word(record: ScaleRecord | None) -> tuple[bool, bool, bool]:
    note = record.budget if record is not None else None
    if note is None:
        return False, False, False
    return note.short > 0, note.short_at_end > 0, note.over
