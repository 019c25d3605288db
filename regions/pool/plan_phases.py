"""The planner's parts: the pool as read (:class:`PoolView`), scale-up's and the loans'
choice (:class:`Lift`), what one phase plans (:class:`Step`), and the phases but the
loans' (regions/pool/lending.py), each a small function of the first two. PURE."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from regions.pool.states import (
    ACTIVE,
    COLD,
    EDGES,
    IDLE,
    WARM,
    Action,
    DwellPolicy,
    PoolTarget,
    Replica,
    ReplicaState,
    is_stale,
    refusal,
)


class PoolView(NamedTuple):
    """The pool as the planner reads it, once. Free (not busy) replicas come in
    (since, name) order: the longest in their state first."""

    target: PoolTarget
    now: float
    dwell: DwellPolicy
    every: list[Replica]  # all of them, busy ones included
    stale: list[Replica]  # free replicas of another variant
    of: dict[ReplicaState, list[Replica]]  # the other free replicas, by state
    lent: list[Replica]  # every free LENT replica, stale ones included
    launching: int  # busy COLD slots, being launched as a wanted variant
    n_active: int  # every ACTIVE replica, busy and stale ones included
    n_stale_active: int
    loans: Mapping[str, str | None] | None  # loan id -> the URL it names (None: any)

    @property
    def need(self) -> int:
        return self.target.active - self.n_active


class Lift(NamedTuple):
    """Scale-up's choice, then the loans' (which take only what scale-up left), which
    the later phases plan around."""

    resumed: list[Replica]
    woken: list[Replica]
    still_idle: list[Replica]  # IDLE not resumed
    still_warm: list[Replica]  # WARM not woken (nor lent)
    to_bring_up: int  # wanted ACTIVE beyond this plan's: the shortfall, the roll's surge
    shortfall: int
    lending: tuple[tuple[Replica, str], ...] = ()  # (WARM replica, loan id)
    loan_refusals: Mapping[str, str] = {}


class Step(NamedTuple):
    """What one phase plans."""

    actions: tuple[Action, ...] = ()
    deferred: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def move(
    r: Replica, to: ReplicaState, why: str, *, retire: bool = False, loan: str | None = None
) -> Action:
    """``r`` to ``to``; the edge table names the action."""
    kind = EDGES[(r.state, to)]
    return Action(kind=kind, replica=r.name, to=to, reason=why, retire=retire, loan=loan)


def activate(p: PoolView, lift: Lift) -> Step:
    why = (
        f"{p.n_active} ACTIVE < target {p.target.active}"
        if p.need > 0
        else f"roll to {p.target.variant}: replaces one of {p.n_stale_active} ACTIVE "
        "on another variant"
    )
    return Step(actions=tuple(move(r, ACTIVE, why) for r in (*lift.resumed, *lift.woken)))


def drain(p: PoolView, lift: Lift) -> Step:
    """Drain the ACTIVE replicas beyond the target: stale ones first (that is the roll,
    and only ever once a replacement is ACTIVE), then the longest ACTIVE; each once its
    anti-flap dwell is over."""
    excess = p.n_active - p.target.active
    if excess <= 0:
        return Step()
    stale_active = [r for r in p.stale if r.state is ACTIVE]
    candidates = stale_active + p.of[ACTIVE]
    drainable = [r for r in candidates if refusal(r, IDLE, p.now, p.dwell) is None]
    why = f"{p.n_active} ACTIVE > target {p.target.active}"
    actions = tuple(
        move(r, IDLE, _drain_reason(p, r, why) if r in stale_active else why)
        for r in drainable[:excess]
    )
    if len(drainable) >= excess:
        return Step(actions)
    held = tuple(
        f"drain: {refusal(r, IDLE, p.now, p.dwell)}" for r in candidates if r not in drainable
    )
    return Step(actions, deferred=held)


def _drain_reason(p: PoolView, r: Replica, why: str) -> str:
    return f"roll to {p.target.variant}: replaced ({why}); runs {r.variant}"


def retire(p: PoolView, lift: Lift) -> Step:
    """Stale standby leaves: IDLE ones sleep once drained (``drain_s``), WARM managed
    ones stop, freeing their slots for the wanted variant. Static ones stay asleep."""
    actions: list[Action] = []
    held: list[str] = []
    for r in p.stale:
        why = f"retiring: runs {r.variant}, {p.target.variant} wanted"
        if r.state is IDLE:
            reason = refusal(r, WARM, p.now, p.dwell, retiring=True)
            if reason is None:
                actions.append(move(r, WARM, why, retire=True))
            else:
                held.append(f"retire: {reason}")
        elif r.state is WARM and r.managed:
            actions.append(move(r, COLD, why, retire=True))
    return Step(tuple(actions), deferred=tuple(held))


def sleep(p: PoolView, lift: Lift) -> Step:
    why = f"IDLE dwell {p.dwell.idle_min_s:g} s over"
    over = [r for r in lift.still_idle if refusal(r, WARM, p.now, p.dwell) is None]
    return Step(actions=tuple(move(r, WARM, why) for r in over))


def launch(p: PoolView, lift: Lift) -> Step:
    """Re-probe static COLD endpoints (reachable ones join as WARM) and launch managed
    COLD slots up to the standby wanted: the target's WARM and what scale-up could not
    bring ACTIVE. IDLE counts as standby here (it is ready at once) but not when
    stopping (it may be resumed): a hysteresis that avoids launch/stop churn. So does
    ACTIVE beyond the target (drained now or once its dwell is over, it sleeps into
    the standby): a scale-down that raises WARM as it lowers ACTIVE (the scaler's
    planned burst) launched replicas for the standby those drained ones fill."""
    standby = len(lift.still_warm) + len(lift.still_idle) + p.launching + _leaving(p)
    wanted = p.target.warm + lift.to_bring_up
    cold = p.of[COLD]
    managed = [r for r in cold if r.managed]
    adopt = "static endpoint: adopt when reachable"
    actions = tuple(move(r, WARM, adopt) for r in cold if not r.managed) + tuple(
        move(r, WARM, f"standby {standby} < wanted {wanted}")
        for r in managed[: max(wanted - standby, 0)]
    )
    return Step(actions, notes=_slot_notes(p, wanted, standby, len(managed)))


def cancel(p: PoolView, lift: Lift) -> Step:
    """Abandon the launches no longer wanted (the targets fell while they load: a
    ramp's knee passed, a failover called off): those launched as another variant than
    the target's (no one's standby once up), then, newest first (the furthest from
    done), those beyond the target's WARM and what scale-up could not bring ACTIVE. Only
    WARM replicas and launches count here; IDLE replicas and ACTIVE beyond the target
    may be resumed yet (the launch phase counts them), so the two phases never undo each
    other. A launch's progress is lost, but a replica loading is paid like an ACTIVE
    one, and it would arrive to be stopped after its WARM dwell."""
    loading = sorted(
        (r for r in p.every if r.busy and r.state is COLD and r.managed),
        key=lambda r: (-r.since, r.name),
    )
    stale = [r for r in loading if is_stale(r, p.target)]
    wanted_variant = [r for r in loading if r not in stale]
    wanted = p.target.warm + lift.to_bring_up
    excess = min(len(wanted_variant), len(lift.still_warm) + len(wanted_variant) - wanted)
    why = f"{len(lift.still_warm)} WARM + {len(wanted_variant)} launching > wanted {wanted}"
    return Step(
        tuple(
            Action(
                kind="cancel",
                replica=r.name,
                to=COLD,
                reason=f"launching as {r.variant}, {p.target.variant} wanted",
            )
            for r in stale
        )
        + tuple(
            Action(kind="cancel", replica=r.name, to=COLD, reason=why)
            for r in wanted_variant[: max(0, excess)]
        )
    )


def _leaving(p: PoolView) -> int:
    """ACTIVE replicas of the wanted variant beyond the target: drain's to let go."""
    return max(0, p.n_active - p.n_stale_active - p.target.active)


def _slot_notes(p: PoolView, wanted: int, standby: int, n_cold: int) -> tuple[str, ...]:
    """Why the standby wanted is not all launched: no slot, or a slot still retiring."""
    deficit = wanted - standby
    retiring = sum(1 for r in p.stale if r.state in (IDLE, WARM) and r.managed)
    if deficit > n_cold + retiring:
        return (
            f"pool too small: wanted {wanted} in standby, "
            f"have {standby} and {n_cold} COLD slots to launch",
        )
    if deficit > n_cold:
        return (
            f"roll to {p.target.variant}: {deficit - n_cold} launch(es) "
            "wait for the slot of a replica being retired",
        )
    return ()


def stop(p: PoolView, lift: Lift) -> Step:
    """Stop the WARM replicas beyond the standby target once their dwell is over (at
    once while the pool is over its budget: ``dwell_for``)."""
    warm = lift.still_warm
    excess = len(warm) - p.target.warm
    if excess <= 0:
        return Step()
    stoppable = [r for r in warm if refusal(r, COLD, p.now, p.dwell) is None]
    why = f"{len(warm)} WARM > target {p.target.warm}"
    if p.target.over_budget:
        why += ", over the budget: no WARM dwell"
    actions = tuple(move(r, COLD, why) for r in stoppable[:excess])
    if len(stoppable) >= excess:
        return Step(actions)
    held = tuple(
        f"stop: {refusal(r, COLD, p.now, p.dwell)}"
        for r in warm
        if r.managed and r not in stoppable
    )
    return Step(actions, deferred=held)
