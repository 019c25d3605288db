"""Failover planning and routing arithmetic: the safety rules of docs/architecture.md §3.

Rules (modelled on AWS ARC's assertion rules), each bypassed only by ``force``
with a reason:

* never fail over into a region that is barred by a failed drill, UNHEALTHY,
  UNKNOWN, in another residency zone, or without headroom;
* never route away from the last healthy region (not even forced);
* one failover per region at a time, and at most one *automatic* failover per
  cooldown. An operator's failover is not held by the cooldown: it is deliberate,
  has a reason and is audited, and refusing it would push the operator to ``force``,
  which also lifts the residency, barred and headroom rules that should still hold.

Targets share the source's load by what each bears (``core/bearing.py``, docs/capacity.md):
the measured, prefix-aware capacity where a fresh probe exists, the typed ``capacity_rps``
otherwise; the moved traffic counts as cold in its new region. No target is planned
past capacity utilisation 1.0: what the targets together cannot bear is the plan's
shortfall, which sets ``headroom_short`` (the ladder then degrades the targets and sheds
low priority first) and is written in the plan's notes.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.core.bearing import (
    Target,
    cbu_now,
    hit_rate_of,
    load_of,
    moved_hit_rate,
    region_bearing,
    split,
    target_of,
)
from controlplane.kernel.config import Topology
from controlplane.kernel.model import FailoverPlan, Health, RegionState, Routing
from controlplane.kernel.snapshot import RegionView, Snapshot

_ROUND = 6


class PlanRefused(ValueError):
    """The failover would break a safety rule; the message says which and what to do."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


def _exclusion(
    view: RegionView, source: RegionView, topology: Topology, forced: bool, now: float
) -> str | None:
    """Why ``view`` may not take the source's traffic, or None."""
    family = topology.family(source.name)
    if topology.family(view.name) != family:  # not even forced: it lacks the model
        return f"serves no pool {family!r}" if family else "is a model pool, not a region"
    if view.record.state is RegionState.FAILING_OVER:
        return "is itself failed over"
    if forced:
        return None
    if view.barred:
        return "is barred by its last drill"
    if view.health.verdict is Health.UNHEALTHY:
        return "is UNHEALTHY"
    if view.health.verdict is Health.UNKNOWN:
        return "has UNKNOWN health"
    src_zone = topology.region(source.name).zone
    if topology.region(view.name).zone != src_zone:
        return f"is in zone {topology.region(view.name).zone}, not {src_zone}"
    if (cbu := cbu_now(view, topology, now)) >= 1.0:
        return f"has no headroom (capacity utilisation {cbu:.2f})"
    return None


def _candidates(source: str, requested: Sequence[str], topology: Topology) -> list[str]:
    if requested:
        return list(dict.fromkeys(requested))
    preferred = topology.region(source).failover_to
    if preferred:
        return list(preferred)
    zone, family = topology.region(source).zone, topology.family(source)
    return [
        r.name
        for r in topology.regions
        if r.name != source and r.zone == zone and topology.family(r.name) == family
    ]


def normalise(weights: dict[str, float]) -> dict[str, float]:
    total = sum(w for w in weights.values() if w > 0)
    if total <= 0:
        return {k: round(1 / len(weights), _ROUND) for k in weights}
    return {k: round(w / total, _ROUND) for k, w in weights.items() if w > 0}


def plan_failover(
    snap: Snapshot,
    topology: Topology,
    source: str,
    *,
    reason: str,
    actor: str,
    requested: Sequence[str] = (),
    forced: bool = False,
    manual: bool = False,
    cooldown_s: float | None = None,
) -> FailoverPlan:
    """Choose targets for ``source`` or raise PlanRefused naming the broken rule."""
    # The rules in the order an operator fixes them: the request itself, then the
    # targets, then the last-healthy rule that not even force lifts.
    src = _admissible_source(
        snap,
        topology,
        source,
        reason,
        requested,
        forced=forced,
        manual=manual,
        cooldown_s=cooldown_s,
    )
    targets, excluded = _eligible_targets(snap, topology, source, src, requested, forced)
    _refuse_last_healthy(snap, source, src)

    load = load_of(src)
    # Cold in its new region: the pre-warm has not run when the plan is made.
    hit = moved_hit_rate(hit_rate_of(src), None)
    sp = split(load, hit, targets)
    notes = [f"{k} skipped: {v}" for k, v in excluded.items()]
    notes += [
        _capacity_note(snap, topology, t.name, sp.moved_rps[t.name], sp.cbu_after[t.name])
        for t in targets
    ]
    short = not sp.fits
    if short:
        borne = load - sp.shortfall_rps
        notes.append(
            f"targets bear {borne:.1f} of the source's {load:.1f} rps at capacity "
            f"utilisation 1.0: short by {sp.shortfall_rps:.1f} rps; the degradation ladder "
            "degrades the targets, shedding low priority first"
        )
    weights = sp.moved_rps if load > 0 else sp.rooms
    return FailoverPlan(
        source=source,
        targets=normalise(weights),
        forced=forced,
        manual=manual,
        warm_first=manual or src.health.verdict is not Health.UNHEALTHY,
        reason=reason,
        actor=actor,
        headroom_short=short,
        notes=notes,
        cbu_after={k: round(v, 4) for k, v in sp.cbu_after.items()},
        shortfall_rps=round(sp.shortfall_rps, 3),
        moved_rps=round(load, 3),
        source_hit_rate=round(hit_rate_of(src), 4),
    )


def _admissible_source(
    snap: Snapshot,
    topology: Topology,
    source: str,
    reason: str,
    requested: Sequence[str],
    *,
    forced: bool,
    manual: bool,
    cooldown_s: float | None,
) -> RegionView:
    """The source's view, once the request is well formed: a known source not already
    failed over nor in its cooldown, a reason when forced, known targets."""
    if source not in snap.regions:
        raise PlanRefused(
            f"unknown region {source!r}; known regions: {sorted(snap.regions)}",
            code="unknown_region",
        )
    if forced and not reason.strip():
        raise PlanRefused("a forced failover needs a reason", code="reason_required")
    src = snap.regions[source]
    if src.record.state is RegionState.FAILING_OVER:
        raise PlanRefused(f"{source} is already failed over", code="in_progress")
    cooldown = topology.timing.failover_cooldown_s if cooldown_s is None else cooldown_s
    last = src.record.last_failover_at
    if last is not None and snap.now - last < cooldown and not (forced or manual):
        raise PlanRefused(
            f"{source} failed over {snap.now - last:.0f}s ago; cooldown is {cooldown:.0f}s "
            "for automatic failovers (an operator can fail it over with failoverctl)",
            code="cooldown",
        )
    bad = [t for t in requested if t not in snap.regions or t == source]
    if bad:
        raise PlanRefused(
            f"invalid target(s) {bad}: targets must be other known regions "
            f"({sorted(set(snap.regions) - {source})})",
            code="unknown_region",
        )
    return src


def _eligible_targets(
    snap: Snapshot,
    topology: Topology,
    source: str,
    src: RegionView,
    requested: Sequence[str],
    forced: bool,
) -> tuple[list[Target], dict[str, str]]:
    """The candidates that may take the source's traffic, and why each other one may
    not (for the plan's notes); PlanRefused when none may."""
    excluded: dict[str, str] = {}
    targets: list[Target] = []
    for name in _candidates(source, requested, topology):
        why = _exclusion(snap.regions[name], src, topology, forced, snap.now)
        if why:
            excluded[name] = why
        else:
            targets.append(target_of(snap.regions[name], topology, snap.now))
    if not targets:
        detail = "; ".join(f"{k} {v}" for k, v in excluded.items()) or "no candidate regions"
        raise PlanRefused(
            f"no eligible failover target for {source}: {detail}. "
            "Name targets with --to, or force with a reason.",
            code="no_target",
        )
    return targets, excluded


def _refuse_last_healthy(snap: Snapshot, source: str, src: RegionView) -> None:
    """Not even force overrides this one: moving traffic off the only healthy region
    onto sick ones can only make things worse."""
    serving = (Health.HEALTHY, Health.DEGRADED)
    others_healthy = [
        v
        for n, v in snap.regions.items()
        if n != source and v.in_service and v.health.verdict in serving
    ]
    if src.health.verdict in serving and not others_healthy:
        raise PlanRefused(
            f"{source} is the last healthy region; routing away from it would leave no "
            "healthy region serving",
            code="last_healthy",
        )


def _capacity_note(snap: Snapshot, topology: Topology, name: str, moved: float, cbu: float) -> str:
    view = snap.regions[name]
    b = region_bearing(view, topology, snap.now)
    return (
        f"{name}: {b.source.value} capacity ({b.reason}), allowed "
        f"{b.allowed(hit_rate_of(view)):.1f} rps at hit rate {hit_rate_of(view):.2f}; "
        f"takes {moved:.1f} rps cold, capacity utilisation after {cbu:.2f}"
    )


def resplit_after_prewarm(
    snap: Snapshot, topology: Topology, plan: FailoverPlan, attained: float | None
) -> FailoverPlan:
    """``plan`` split again at its switch, once the pre-warm ran before it (a planned
    failover): the moved traffic arrives at the source's hit rate times the pre-warm's
    verified attainment instead of cold, so the targets bear more of it. Unchanged
    without an attainment, a load, or targets still in the snapshot."""
    src = snap.regions.get(plan.source)
    names = [t for t in plan.targets if t in snap.regions]
    if attained is None or src is None or load_of(src) <= 0 or not names:
        return plan
    hit = moved_hit_rate(hit_rate_of(src), attained)
    if hit <= 0:
        return plan
    targets = [target_of(snap.regions[n], topology, snap.now) for n in names]
    sp = split(load_of(src), hit, targets)
    note = (
        f"split again after the pre-warm: the moved traffic at hit rate {hit:.2f} "
        f"(attainment {attained:.2f}), short by {sp.shortfall_rps:.1f} rps"
    )
    return plan.model_copy(
        update={
            "targets": normalise(sp.moved_rps),
            "cbu_after": {k: round(v, 4) for k, v in sp.cbu_after.items()},
            "shortfall_rps": round(sp.shortfall_rps, 3),
            "headroom_short": not sp.fits,
            "notes": [*plan.notes, note],
        }
    )


def routing_after_switch(snap: Snapshot, plan: FailoverPlan) -> dict[str, Routing]:
    """New routing values: the source's traffic goes to the plan's targets, and any other
    region whose traffic was sent to the source is redirected the same way.
    Only changed keys are returned; each gets its epoch bumped."""
    out: dict[str, Routing] = {}
    for name, routing in snap.routings().items():
        if name == plan.source:
            new = dict(plan.targets)
        elif plan.source in routing.targets:
            share = routing.targets[plan.source]
            new = {k: v for k, v in routing.targets.items() if k != plan.source}
            for t, w in plan.targets.items():
                new[t] = new.get(t, 0.0) + share * w
            new = normalise(new)
        else:
            continue
        if new != routing.targets:
            out[name] = Routing(targets=new, epoch=routing.epoch + 1)
    return out


def routing_recovery_step(current: Routing, home: str, fraction_home: float) -> Routing:
    """Send ``fraction_home`` of new sessions back home, the rest as now (proportionally)."""
    away = {k: v for k, v in current.targets.items() if k != home and v > 0}
    fraction_home = min(max(fraction_home, 0.0), 1.0)
    if not away or fraction_home >= 1.0:
        return Routing(targets={home: 1.0}, epoch=current.epoch + 1)
    total = sum(away.values())
    new = {k: round(v / total * (1 - fraction_home), _ROUND) for k, v in away.items()}
    if fraction_home > 0:
        new[home] = round(fraction_home, _ROUND)
    return Routing(targets=new, epoch=current.epoch + 1)
