"""The warm pool's planner: :func:`plan` turns the replicas (regions/pool/states.py) and
a :class:`PoolTarget` into a :class:`Plan` of actions. PURE: no I/O and no clock.

Variants (a launch-time property, e.g. with or without ``--speculative-config``): when
the target names a ``variant``, replicas of another one are *stale*. The planner rolls
them out one at a time: it wakes (or launches, then wakes) one replica of the wanted
variant beyond the ACTIVE target, drains a stale ACTIVE one only while the ACTIVE count
stays at or above the target, and retires stale standby replicas (IDLE -> WARM after
``drain_s``, then WARM -> COLD without the standby dwells: they are no one's standby).
Stale replicas are never woken, resumed or counted as standby.

Loans (``loans``: loan id -> the replica URL it names, or None for any WARM one): a loan
takes a WARM standby replica out of rotation (woken, never routed) and gives it back
(asleep again) when the loan is gone. Lending comes after scale-up, so it never takes a
replica the ACTIVE target needs; a named replica in rotation (ACTIVE or IDLE), unknown,
COLD, being retired or lent already is refused with the reason, and so is a loan for any
replica when no WARM one is left. A LENT replica is never woken, drained, stopped or
counted as standby. ``loans=None`` (not known yet, e.g. before the agent first read
them): nothing is lent or returned.

Launches in flight that the targets no longer want (they fell while the replicas load)
are cancelled, newest first: a replica loading is paid like an ACTIVE one.

The plan is made phase by phase (:data:`PHASES`: activate, lend, drain, retire, sleep,
launch, cancel, stop; each a small function of the pool as read and of scale-up's choice, in
regions/pool/plan_phases.py and regions/pool/lending.py); the I/O adapter
(:mod:`regions.pool.manager`) carries it out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum

from pydantic import Field

from controlplane.kernel.model import Frozen
from regions.pool.lending import lend, loans_step
from regions.pool.plan_phases import (
    Lift,
    PoolView,
    Step,
    activate,
    cancel,
    drain,
    launch,
    retire,
    sleep,
    stop,
)
from regions.pool.states import (
    ACTIVE,
    COLD,
    IDLE,
    LENT,
    WARM,
    Action,
    ActionKind,
    DwellPolicy,
    PoolTarget,
    Replica,
    ReplicaState,
    dwell_for,
    is_stale,
)


class Plan(Frozen):
    """What to do now. ``deferred`` says which wanted moves a dwell holds back and why;
    ``shortfall`` is how many ACTIVE replicas the target wants beyond what this plan
    reaches (launched slots are woken by a later plan); ``loan_refusals`` the loans
    this plan cannot serve, each with its reason (loan id -> reason)."""

    actions: tuple[Action, ...] = ()
    deferred: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    shortfall: int = 0
    loan_refusals: dict[str, str] = Field(default_factory=dict)

    def of(self, *kinds: ActionKind) -> list[Action]:
        return [a for a in self.actions if a.kind in kinds]


class PlanPhase(StrEnum):
    """The planner's phases, in the order their moves come in a :class:`Plan`."""

    ACTIVATE = "activate"  # scale-up: resume IDLE, then wake WARM; never held back
    LEND = "lend"  # loans: WARM standby out of rotation, and back once a loan is gone
    DRAIN = "drain"  # scale-down: ACTIVE beyond the target, after the anti-flap dwell
    RETIRE = "retire"  # the roll: stale standby sleeps (after drain_s) or stops
    SLEEP = "sleep"  # IDLE past its dwell back to WARM
    LAUNCH = "launch"  # COLD slots for the standby target and the ACTIVE shortfall
    CANCEL = "cancel"  # launches in flight beyond what the targets want now
    STOP = "stop"  # WARM beyond the standby target, past its dwell


def plan(
    replicas: Sequence[Replica],
    target: PoolTarget,
    now: float,
    dwell: DwellPolicy,
    loans: Mapping[str, str | None] | None = None,
) -> Plan:
    """Decide which replicas to wake, resume, drain, sleep, stop or launch (and which
    launches to cancel) to reach ``target``. Scale-up is immediate (IDLE first: they
    are awake), scale-down waits for the dwell times; COLD slots are launched to WARM
    for the standby target and for any ACTIVE shortfall, and launches beyond both are
    cancelled. Replicas of another variant than the target's are rolled
    out one at a time; ``loans`` lend WARM standby out of rotation (module docstring).
    The phases (:data:`PHASES`) run in order, each on the pool as it was read and on
    scale-up's and the loans' choice."""
    pool = _read(replicas, target, now, dwell, loans)
    lift = lend(pool, _lift(pool))
    steps = [phase(pool, lift) for phase in PHASES.values()]
    return Plan(
        actions=tuple(a for s in steps for a in s.actions),
        deferred=tuple(d for s in steps for d in s.deferred),
        notes=tuple(n for s in steps for n in s.notes) + _outlook(pool, lift),
        shortfall=lift.shortfall,
        loan_refusals=dict(lift.loan_refusals),
    )


def _read(
    replicas: Sequence[Replica],
    target: PoolTarget,
    now: float,
    dwell: DwellPolicy,
    loans: Mapping[str, str | None] | None,
) -> PoolView:
    free = sorted((r for r in replicas if not r.busy), key=lambda r: (r.since, r.name))
    stale = [r for r in free if is_stale(r, target)]
    dwell = dwell_for(dwell, target)
    return PoolView(
        target=target,
        now=now,
        dwell=dwell,
        every=sorted(replicas, key=lambda r: (r.since, r.name)),
        stale=stale,
        of={s: [r for r in free if r.state is s and r not in stale] for s in ReplicaState},
        lent=[r for r in free if r.state is LENT],
        launching=sum(
            1 for r in replicas if r.busy and r.state is COLD and not is_stale(r, target)
        ),
        n_active=sum(1 for r in replicas if r.state is ACTIVE),
        n_stale_active=sum(1 for r in replicas if r.state is ACTIVE and is_stale(r, target)),
        loans=loans,
    )


def _lift(p: PoolView) -> Lift:
    """How many to bring ACTIVE, and which: the target's shortfall and, while stale
    replicas serve, the roll's surge (one of the wanted variant beyond the target, so
    that draining a stale one keeps ACTIVE at the target)."""
    surge = 1 if p.n_stale_active else 0
    t = p.target.active
    up = max(0, min(t - (p.n_active - p.n_stale_active), t + surge - p.n_active))
    resumed = p.of[IDLE][::-1][:up]  # most recently drained first: warmest cache
    woken = p.of[WARM][: up - len(resumed)]
    brought = len(resumed) + len(woken)
    return Lift(
        resumed=resumed,
        woken=woken,
        still_idle=[r for r in p.of[IDLE] if r not in resumed],
        still_warm=[r for r in p.of[WARM] if r not in woken],
        to_bring_up=up - brought,  # >= shortfall: the roll's surge too
        shortfall=max(p.need - brought, 0),
    )


def _outlook(p: PoolView, lift: Lift) -> tuple[str, ...]:
    """Where the pool stands against the target once this plan is carried out."""
    notes: list[str] = []
    if lift.shortfall:
        notes.append(
            f"{lift.shortfall} ACTIVE short of {p.target.active}: COLD slots launch to "
            "WARM first and are woken by a later plan (never COLD -> ACTIVE)"
        )
    if p.stale:
        notes.append(
            f"roll to {p.target.variant}: {p.n_stale_active} ACTIVE and "
            f"{sum(r.state is not ACTIVE for r in p.stale)} other replica(s) on another variant"
        )
    if p.lent:
        loans = ", ".join(f"{r.name} for loan {r.loan}" for r in p.lent)
        notes.append(f"{len(p.lent)} LENT out of rotation, not standby: {loans}")
    return tuple(notes)


# The phases in order (an edge table for the plan: what runs after what); each one
# returns its own moves, so a phase added or moved is one row here.
PHASES: Mapping[PlanPhase, Callable[[PoolView, Lift], Step]] = {
    PlanPhase.ACTIVATE: activate,
    PlanPhase.LEND: loans_step,
    PlanPhase.DRAIN: drain,
    PlanPhase.RETIRE: retire,
    PlanPhase.SLEEP: sleep,
    PlanPhase.LAUNCH: launch,
    PlanPhase.CANCEL: cancel,
    PlanPhase.STOP: stop,
}
