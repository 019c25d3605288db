"""Warm-pool replica states, their edges, dwell times and the planner. PURE: no I/O and
no clock; every function takes ``now`` (seconds on the caller's clock).

States: COLD (no process / static endpoint unreachable), WARM (up, model loaded,
asleep), ACTIVE (awake and routed), IDLE (awake, drained from routing), LENT (awake, out
of rotation, lent to a borrower such as the capacity probe).

Edges (anything else is refused, with a reason)::

    COLD --launch--> WARM --wake--> ACTIVE --drain--> IDLE --sleep--> WARM --stop--> COLD
                                      ^                 |
                                      +-----resume------+
    WARM --lend--> LENT --return--> WARM
    any --died (observed)--> COLD

- never COLD -> ACTIVE: a launched replica is put to sleep first and woken like any
  other, so every activation goes through ``/wake_up`` + ``/reset_prefix_cache``;
- IDLE -> WARM only after the IDLE dwell, WARM -> COLD only after the WARM dwell;
- anti-flap: ACTIVE -> IDLE only after the minimum ACTIVE dwell. Waking and resuming are
  never held back (capacity comes first; scaling down is what waits), so a replica
  changes routing at most once per ``active_min_s`` in the down direction.

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

:func:`plan` turns the replicas and a :class:`PoolTarget` into a :class:`Plan` of
actions, phase by phase (:data:`PHASES`: activate, lend, drain, retire, sleep, launch, stop;
each a small function of the pool as read and of scale-up's choice); the I/O adapter
(:mod:`regions.pool.manager`) carries them out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Literal, NamedTuple

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen


class ReplicaState(StrEnum):
    COLD = "COLD"
    WARM = "WARM"
    ACTIVE = "ACTIVE"
    IDLE = "IDLE"
    LENT = "LENT"


COLD, WARM = ReplicaState.COLD, ReplicaState.WARM  # short names for the tables below
ACTIVE, IDLE, LENT = ReplicaState.ACTIVE, ReplicaState.IDLE, ReplicaState.LENT

ActionKind = Literal["launch", "wake", "drain", "resume", "sleep", "stop", "lend", "return"]
EDGES: dict[tuple[ReplicaState, ReplicaState], ActionKind] = {
    (COLD, WARM): "launch",  # managed: launch + sleep; static: reachable again + sleep
    (WARM, ACTIVE): "wake",  # /wake_up then /reset_prefix_cache, then routed
    (ACTIVE, IDLE): "drain",  # out of routing, kept awake
    (IDLE, ACTIVE): "resume",  # back into routing, no wake needed
    (IDLE, WARM): "sleep",  # /sleep?level=1 after the IDLE dwell
    (WARM, COLD): "stop",  # managed only, after the WARM dwell
    (WARM, LENT): "lend",  # /wake_up then /reset_prefix_cache, never routed
    (LENT, WARM): "return",  # /reset_prefix_cache then /sleep?level=1, once the loan is gone
}


class DwellPolicy(Frozen):
    """Minimum time in a state before the planner moves a replica on (seconds)."""

    warm_min_s: float = Field(300.0, ge=0)  # WARM before stop: launches are expensive
    idle_min_s: float = Field(1800.0, ge=0)  # IDLE before sleep: instant return to ACTIVE
    active_min_s: float = Field(120.0, ge=0)  # ACTIVE before drain: the anti-flap rule
    # IDLE before a stale replica (another variant) is retired: requests routed to it
    # before gateways saw it drained finish first (sleep aborts running requests).
    drain_s: float = Field(10.0, ge=0)


class PoolTarget(Frozen):
    """How many replicas should be ACTIVE, and how many kept in standby (WARM);
    ``variant``: the one replicas should run (None: any, the launcher has one kind)."""

    active: int = Field(ge=0)
    warm: int = Field(ge=0)
    variant: str | None = None


class PoolConfig(Frozen):
    """Sizes and dwell times of one region's pool. ``size`` is the number of managed
    replica slots (default ``active + warm``); slots beyond that stay COLD until a
    burst needs them."""

    active: int = Field(1, ge=0)
    warm: int = Field(1, ge=0)
    size: int | None = Field(None, ge=0)
    dwell: DwellPolicy = DwellPolicy()

    @model_validator(mode="after")
    def _fits(self) -> PoolConfig:
        if self.size is not None and self.size < self.active + self.warm:
            raise ValueError(
                f"size {self.size} < active {self.active} + warm {self.warm}: "
                "the pool cannot hold its own targets"
            )
        return self

    @property
    def slots(self) -> int:
        return self.active + self.warm if self.size is None else self.size

    @property
    def target(self) -> PoolTarget:
        return PoolTarget(active=self.active, warm=self.warm)


class Replica(Frozen):
    """One replica slot. ``since`` is when it entered ``state``; ``url`` is None while a
    managed slot has no process; ``busy`` while an action on it is in flight (the
    planner leaves it alone and counts a busy COLD slot as becoming WARM); ``variant``
    is what it was launched as (None: unknown or the launcher's only kind); ``loan`` the
    loan a LENT replica serves."""

    name: str
    url: str | None = None
    state: ReplicaState = COLD
    since: float = 0.0
    managed: bool = True
    busy: bool = False
    variant: str | None = None
    loan: str | None = None


def is_stale(r: Replica, target: PoolTarget) -> bool:
    """Whether ``r`` runs (or is being launched as) another variant than the target
    wants; unknown ones never, and an empty slot is free for any."""
    if r.state is COLD and not r.busy:
        return False
    return target.variant is not None and r.variant is not None and r.variant != target.variant


class TransitionRefused(ValueError):
    """An edge the table or a dwell time forbids; ``reason`` says which and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def refusal(
    r: Replica, to: ReplicaState, now: float, dwell: DwellPolicy, *, retiring: bool = False
) -> str | None:
    """Why ``r`` may not move to ``to`` at ``now``, or None when it may. ``retiring``: a
    stale replica on its way out, held only by ``drain_s`` in IDLE (the standby dwells
    keep capacity for a burst, and a stale replica is no one's standby)."""
    here = f"{r.name} is {r.state}"
    if r.busy:
        return f"{here} with an action in flight"
    if r.state is to:
        return f"{here} already"
    if (r.state, to) not in EDGES:
        if (r.state, to) == (COLD, ACTIVE):
            return f"{here}: COLD -> ACTIVE is never allowed; launch to WARM, then wake"
        allowed = ", ".join(str(b) for a, b in EDGES if a is r.state)
        return f"{here}: {r.state} -> {to} is not an edge (from {r.state}: {allowed})"
    if (r.state, to) == (WARM, COLD) and not r.managed:
        return f"{here}: a static endpoint is stopped by whoever manages it"
    minimum = {
        (WARM, COLD): dwell.warm_min_s,
        (IDLE, WARM): dwell.idle_min_s,
        (ACTIVE, IDLE): dwell.active_min_s,
    }.get((r.state, to))
    if retiring:
        minimum = {(IDLE, WARM): dwell.drain_s, (ACTIVE, IDLE): dwell.active_min_s}.get(
            (r.state, to)
        )
    held = now - r.since
    if minimum is not None and held < minimum:
        what = "drain" if retiring and r.state is IDLE else f"{r.state} dwell"
        return f"{here} for {held:.0f} s < {what} {minimum:g} s"
    return None


def transition(
    r: Replica,
    to: ReplicaState,
    now: float,
    dwell: DwellPolicy,
    url: str | None = None,
    *,
    retiring: bool = False,
    loan: str | None = None,
) -> Replica:
    """``r`` in state ``to`` since ``now``; raises :class:`TransitionRefused`. ``url``
    gives a freshly launched replica its address; stopping clears a managed url (and
    its variant: the slot is empty). ``loan``: the loan a replica going LENT serves
    (any other move ends it)."""
    reason = refusal(r, to, now, dwell, retiring=retiring)
    if reason is not None:
        raise TransitionRefused(reason)
    emptied = to is COLD and r.managed
    new_url = url if url is not None else (None if emptied else r.url)
    variant = None if emptied else r.variant
    update = {"state": to, "since": now, "url": new_url, "variant": variant}
    return r.model_copy(update={**update, "loan": loan if to is LENT else None})


def died(r: Replica, now: float) -> Replica:
    """Any -> COLD, observed: the process is gone (a static endpoint keeps its url)."""
    url, variant = (r.url, r.variant) if not r.managed else (None, None)
    return r.model_copy(
        update={
            "state": COLD,
            "since": now,
            "url": url,
            "busy": False,
            "variant": variant,
            "loan": None,
        }
    )


class Action(Frozen):
    kind: ActionKind
    replica: str
    to: ReplicaState
    reason: str
    retire: bool = False  # a stale replica leaving: see ``refusal(retiring=True)``
    loan: str | None = None  # the loan a lend serves, or a return ends


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
    STOP = "stop"  # WARM beyond the standby target, past its dwell


class _Pool(NamedTuple):
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


class _Lift(NamedTuple):
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


class _Step(NamedTuple):
    """What one phase plans."""

    actions: tuple[Action, ...] = ()
    deferred: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def plan(
    replicas: Sequence[Replica],
    target: PoolTarget,
    now: float,
    dwell: DwellPolicy,
    loans: Mapping[str, str | None] | None = None,
) -> Plan:
    """Decide which replicas to wake, resume, drain, sleep, stop or launch to reach
    ``target``. Scale-up is immediate (IDLE first: they are awake), scale-down waits
    for the dwell times; COLD slots are launched to WARM for the standby target and
    for any ACTIVE shortfall. Replicas of another variant than the target's are rolled
    out one at a time; ``loans`` lend WARM standby out of rotation (module docstring).
    The phases (:data:`PHASES`) run in order, each on the pool as it was read and on
    scale-up's and the loans' choice."""
    pool = _read(replicas, target, now, dwell, loans)
    lift = _lend(pool, _lift(pool))
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
) -> _Pool:
    free = sorted((r for r in replicas if not r.busy), key=lambda r: (r.since, r.name))
    stale = [r for r in free if is_stale(r, target)]
    return _Pool(
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


def _lift(p: _Pool) -> _Lift:
    """How many to bring ACTIVE, and which: the target's shortfall and, while stale
    replicas serve, the roll's surge (one of the wanted variant beyond the target, so
    that draining a stale one keeps ACTIVE at the target)."""
    surge = 1 if p.n_stale_active else 0
    t = p.target.active
    up = max(0, min(t - (p.n_active - p.n_stale_active), t + surge - p.n_active))
    resumed = p.of[IDLE][::-1][:up]  # most recently drained first: warmest cache
    woken = p.of[WARM][: up - len(resumed)]
    brought = len(resumed) + len(woken)
    return _Lift(
        resumed=resumed,
        woken=woken,
        still_idle=[r for r in p.of[IDLE] if r not in resumed],
        still_warm=[r for r in p.of[WARM] if r not in woken],
        to_bring_up=up - brought,  # >= shortfall: the roll's surge too
        shortfall=max(p.need - brought, 0),
    )


def _lend(p: _Pool, lift: _Lift) -> _Lift:
    """The loans' choice, after scale-up's (capacity first): each loan not served yet
    takes the WARM replica it names, or else the longest WARM one that scale-up left;
    what cannot be served is refused with the reason. Loans naming a replica choose
    first, so that a loan for any replica never takes one another loan names."""
    if not p.loans:
        return lift
    served = {r.loan for r in p.lent}
    pending = sorted(
        ((loan, url) for loan, url in p.loans.items() if loan not in served),
        key=lambda lu: (lu[1] is None, lu[0]),
    )
    free = list(lift.still_warm)
    lending: list[tuple[Replica, str]] = []
    refused: dict[str, str] = {}
    for loan, url in pending:
        if url is None:
            if free:
                lending.append((free.pop(0), loan))
            else:
                refused[loan] = _nothing_to_lend(p, lift)
            continue
        r = _named(p, lift, url)
        if isinstance(r, str):
            refused[loan] = r
        elif r not in free:
            refused[loan] = f"{url} ({r.name}) is named by another loan, lent in this plan"
        else:
            free.remove(r)
            lending.append((r, loan))
    return lift._replace(still_warm=free, lending=tuple(lending), loan_refusals=refused)


def _named(p: _Pool, lift: _Lift, url: str) -> Replica | str:
    """The WARM replica a loan names, or why it cannot be lent."""
    found = [r for r in p.every if r.url is not None and r.url.rstrip("/") == url.rstrip("/")]
    if not found:
        urls = ", ".join(sorted(r.url for r in p.every if r.url is not None)) or "none"
        return f"{url} is not a replica of this pool (its replicas: {urls})"
    r = found[0]
    here = f"{url} ({r.name}) is {r.state}"
    if r.state in (ACTIVE, IDLE):
        return f"{here}: in rotation; only a WARM replica out of rotation is lent"
    if r.state is LENT:
        return f"{here}: lent already (loan {r.loan})"
    if r.busy:
        return f"{here} with an action in flight"
    if r.state is COLD:
        return f"{here}: not running"
    if r in lift.woken:
        return f"{here}: being woken into rotation (ACTIVE target {p.target.active})"
    if is_stale(r, p.target):
        return f"{here}: runs {r.variant}, being retired ({p.target.variant} wanted)"
    return r


def _nothing_to_lend(p: _Pool, lift: _Lift) -> str:
    """Why a loan for any replica finds none: what the pool holds instead."""
    held = ", ".join(f"{n} {s}" for s in ReplicaState if (n := sum(r.state is s for r in p.every)))
    why = f"no WARM replica to lend (the pool has {held or 'no replicas'})"
    if lift.woken:
        why += f"; {len(lift.woken)} WARM being woken into rotation"
    if p.launching:
        why += f"; {p.launching} launching"
    return why


def _move(
    r: Replica, to: ReplicaState, why: str, *, retire: bool = False, loan: str | None = None
) -> Action:
    """``r`` to ``to``; the edge table names the action."""
    kind = EDGES[(r.state, to)]
    return Action(kind=kind, replica=r.name, to=to, reason=why, retire=retire, loan=loan)


def _activate(p: _Pool, lift: _Lift) -> _Step:
    why = (
        f"{p.n_active} ACTIVE < target {p.target.active}"
        if p.need > 0
        else f"roll to {p.target.variant}: replaces one of {p.n_stale_active} ACTIVE "
        "on another variant"
    )
    return _Step(actions=tuple(_move(r, ACTIVE, why) for r in (*lift.resumed, *lift.woken)))


def _loans(p: _Pool, lift: _Lift) -> _Step:
    """Lend what the loans chose; return each LENT replica whose loan is gone (never
    held back: the borrower is done, or dead)."""
    lend = tuple(_move(r, LENT, f"lent for loan {loan}", loan=loan) for r, loan in lift.lending)
    if p.loans is None:
        return _Step(lend)  # loans not known: nothing ends
    back = tuple(
        _move(r, WARM, f"loan {r.loan} ended", loan=r.loan) for r in p.lent if r.loan not in p.loans
    )
    return _Step(lend + back)


def _drain(p: _Pool, lift: _Lift) -> _Step:
    """Drain the ACTIVE replicas beyond the target: stale ones first (that is the roll,
    and only ever once a replacement is ACTIVE), then the longest ACTIVE; each once its
    anti-flap dwell is over."""
    excess = p.n_active - p.target.active
    if excess <= 0:
        return _Step()
    stale_active = [r for r in p.stale if r.state is ACTIVE]
    candidates = stale_active + p.of[ACTIVE]
    drainable = [r for r in candidates if refusal(r, IDLE, p.now, p.dwell) is None]
    why = f"{p.n_active} ACTIVE > target {p.target.active}"
    actions = tuple(
        _move(r, IDLE, _drain_reason(p, r, why) if r in stale_active else why)
        for r in drainable[:excess]
    )
    if len(drainable) >= excess:
        return _Step(actions)
    held = tuple(
        f"drain: {refusal(r, IDLE, p.now, p.dwell)}" for r in candidates if r not in drainable
    )
    return _Step(actions, deferred=held)


def _drain_reason(p: _Pool, r: Replica, why: str) -> str:
    return f"roll to {p.target.variant}: replaced ({why}); runs {r.variant}"


def _retire(p: _Pool, lift: _Lift) -> _Step:
    """Stale standby leaves: IDLE ones sleep once drained (``drain_s``), WARM managed
    ones stop, freeing their slots for the wanted variant. Static ones stay asleep."""
    actions: list[Action] = []
    held: list[str] = []
    for r in p.stale:
        why = f"retiring: runs {r.variant}, {p.target.variant} wanted"
        if r.state is IDLE:
            reason = refusal(r, WARM, p.now, p.dwell, retiring=True)
            if reason is None:
                actions.append(_move(r, WARM, why, retire=True))
            else:
                held.append(f"retire: {reason}")
        elif r.state is WARM and r.managed:
            actions.append(_move(r, COLD, why, retire=True))
    return _Step(tuple(actions), deferred=tuple(held))


def _sleep(p: _Pool, lift: _Lift) -> _Step:
    why = f"IDLE dwell {p.dwell.idle_min_s:g} s over"
    over = [r for r in lift.still_idle if refusal(r, WARM, p.now, p.dwell) is None]
    return _Step(actions=tuple(_move(r, WARM, why) for r in over))


def _launch(p: _Pool, lift: _Lift) -> _Step:
    """Re-probe static COLD endpoints (reachable ones join as WARM) and launch managed
    COLD slots up to the standby wanted: the target's WARM and what scale-up could not
    bring ACTIVE. IDLE counts as standby here (it is ready at once) but not when
    stopping (it may be resumed): a hysteresis that avoids launch/stop churn."""
    standby = len(lift.still_warm) + len(lift.still_idle) + p.launching
    wanted = p.target.warm + lift.to_bring_up
    cold = p.of[COLD]
    managed = [r for r in cold if r.managed]
    adopt = "static endpoint: adopt when reachable"
    actions = tuple(_move(r, WARM, adopt) for r in cold if not r.managed) + tuple(
        _move(r, WARM, f"standby {standby} < wanted {wanted}")
        for r in managed[: max(wanted - standby, 0)]
    )
    return _Step(actions, notes=_slot_notes(p, wanted, standby, len(managed)))


def _slot_notes(p: _Pool, wanted: int, standby: int, n_cold: int) -> tuple[str, ...]:
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


def _stop(p: _Pool, lift: _Lift) -> _Step:
    """Stop the WARM replicas beyond the standby target once their dwell is over."""
    warm = lift.still_warm
    excess = len(warm) - p.target.warm
    if excess <= 0:
        return _Step()
    stoppable = [r for r in warm if refusal(r, COLD, p.now, p.dwell) is None]
    why = f"{len(warm)} WARM > target {p.target.warm}"
    actions = tuple(_move(r, COLD, why) for r in stoppable[:excess])
    if len(stoppable) >= excess:
        return _Step(actions)
    held = tuple(
        f"stop: {refusal(r, COLD, p.now, p.dwell)}"
        for r in warm
        if r.managed and r not in stoppable
    )
    return _Step(actions, deferred=held)


def _outlook(p: _Pool, lift: _Lift) -> tuple[str, ...]:
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
PHASES: Mapping[PlanPhase, Callable[[_Pool, _Lift], _Step]] = {
    PlanPhase.ACTIVATE: _activate,
    PlanPhase.LEND: _loans,
    PlanPhase.DRAIN: _drain,
    PlanPhase.RETIRE: _retire,
    PlanPhase.SLEEP: _sleep,
    PlanPhase.LAUNCH: _launch,
    PlanPhase.STOP: _stop,
}
