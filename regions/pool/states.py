"""Warm-pool replica states, their edges, dwell times and the planner. PURE: no I/O and
no clock; every function takes ``now`` (seconds on the caller's clock).

States: COLD (no process / static endpoint unreachable), WARM (up, model loaded,
asleep), ACTIVE (awake and routed), IDLE (awake, drained from routing).

Edges (anything else is refused, with a reason)::

    COLD --launch--> WARM --wake--> ACTIVE --drain--> IDLE --sleep--> WARM --stop--> COLD
                                      ^                 |
                                      +-----resume------+
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

:func:`plan` turns the replicas and a :class:`PoolTarget` into a :class:`Plan` of
actions; the I/O adapter (:mod:`regions.pool.manager`) carries them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Literal, Protocol

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen


class ReplicaState(StrEnum):
    COLD = "COLD"
    WARM = "WARM"
    ACTIVE = "ACTIVE"
    IDLE = "IDLE"


COLD, WARM = ReplicaState.COLD, ReplicaState.WARM  # short names for the tables below
ACTIVE, IDLE = ReplicaState.ACTIVE, ReplicaState.IDLE

ActionKind = Literal["launch", "wake", "drain", "resume", "sleep", "stop"]
EDGES: dict[tuple[ReplicaState, ReplicaState], ActionKind] = {
    (COLD, WARM): "launch",  # managed: launch + sleep; static: reachable again + sleep
    (WARM, ACTIVE): "wake",  # /wake_up then /reset_prefix_cache, then routed
    (ACTIVE, IDLE): "drain",  # out of routing, kept awake
    (IDLE, ACTIVE): "resume",  # back into routing, no wake needed
    (IDLE, WARM): "sleep",  # /sleep?level=1 after the IDLE dwell
    (WARM, COLD): "stop",  # managed only, after the WARM dwell
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
    is what it was launched as (None: unknown or the launcher's only kind)."""

    name: str
    url: str | None = None
    state: ReplicaState = COLD
    since: float = 0.0
    managed: bool = True
    busy: bool = False
    variant: str | None = None


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
) -> Replica:
    """``r`` in state ``to`` since ``now``; raises :class:`TransitionRefused`. ``url``
    gives a freshly launched replica its address; stopping clears a managed url (and
    its variant: the slot is empty)."""
    reason = refusal(r, to, now, dwell, retiring=retiring)
    if reason is not None:
        raise TransitionRefused(reason)
    emptied = to is COLD and r.managed
    new_url = url if url is not None else (None if emptied else r.url)
    variant = None if emptied else r.variant
    return r.model_copy(update={"state": to, "since": now, "url": new_url, "variant": variant})


def died(r: Replica, now: float) -> Replica:
    """Any -> COLD, observed: the process is gone (a static endpoint keeps its url)."""
    url, variant = (r.url, r.variant) if not r.managed else (None, None)
    return r.model_copy(
        update={"state": COLD, "since": now, "url": url, "busy": False, "variant": variant}
    )


class Action(Frozen):
    kind: ActionKind
    replica: str
    to: ReplicaState
    reason: str
    retire: bool = False  # a stale replica leaving: see ``refusal(retiring=True)``


class Plan(Frozen):
    """What to do now. ``deferred`` says which wanted moves a dwell holds back and why;
    ``shortfall`` is how many ACTIVE replicas the target wants beyond what this plan
    reaches (launched slots are woken by a later plan)."""

    actions: tuple[Action, ...] = ()
    deferred: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    shortfall: int = 0

    def of(self, *kinds: ActionKind) -> list[Action]:
        return [a for a in self.actions if a.kind in kinds]


def plan(replicas: Sequence[Replica], target: PoolTarget, now: float, dwell: DwellPolicy) -> Plan:
    """Decide which replicas to wake, resume, drain, sleep, stop or launch to reach
    ``target``. Scale-up is immediate (IDLE first: they are awake), scale-down waits
    for the dwell times; COLD slots are launched to WARM for the standby target and
    for any ACTIVE shortfall. Replicas of another variant than the target's are rolled
    out one at a time (module docstring)."""
    free = sorted((r for r in replicas if not r.busy), key=lambda r: (r.since, r.name))
    stale = [r for r in free if is_stale(r, target)]
    of = {s: [r for r in free if r.state is s and r not in stale] for s in ReplicaState}
    launching = sum(1 for r in replicas if r.busy and r.state is COLD and not is_stale(r, target))
    n_active = sum(1 for r in replicas if r.state is ACTIVE)
    n_stale_active = sum(1 for r in replicas if r.state is ACTIVE and is_stale(r, target))
    actions: list[Action] = []
    deferred: list[str] = []
    notes: list[str] = []

    def act(kind: ActionKind, r: Replica, to: ReplicaState, why: str, retire: bool = False) -> None:
        actions.append(Action(kind=kind, replica=r.name, to=to, reason=why, retire=retire))

    need = target.active - n_active
    # The roll's surge: while stale replicas serve, one replica of the wanted variant
    # beyond the target, so that draining a stale one keeps ACTIVE at the target.
    surge = 1 if n_stale_active else 0
    up = max(0, min(target.active - (n_active - n_stale_active), target.active + surge - n_active))
    why_up = (
        f"{n_active} ACTIVE < target {target.active}"
        if need > 0
        else f"roll to {target.variant}: replaces one of {n_stale_active} ACTIVE on another variant"
    )
    resumed = of[IDLE][::-1][:up]  # most recently drained first: warmest cache
    woken = of[WARM][: up - len(resumed)]
    for r in resumed:
        act("resume", r, ACTIVE, why_up)
    for r in woken:
        act("wake", r, ACTIVE, why_up)
    shortfall = max(need - len(resumed) - len(woken), 0)
    to_bring_up = up - len(resumed) - len(woken)  # >= shortfall: the roll's surge too
    if need < 0:
        _drain(
            of[ACTIVE],
            [r for r in stale if r.state is ACTIVE],
            target,
            n_active,
            now,
            dwell,
            act,
            deferred,
        )
    _retire(stale, target, now, dwell, act, deferred)

    still_idle = [r for r in of[IDLE] if r not in resumed]
    for r in still_idle:
        if refusal(r, WARM, now, dwell) is None:
            act("sleep", r, WARM, f"IDLE dwell {dwell.idle_min_s:g} s over")
    still_warm = [r for r in of[WARM] if r not in woken]

    # Standby: IDLE counts when deciding to launch (it is ready at once) but not when
    # deciding to stop (it may be resumed) - a hysteresis that avoids launch/stop churn.
    standby = len(still_warm) + len(still_idle) + launching
    wanted = target.warm + to_bring_up
    deficit = wanted - standby
    cold = of[COLD]
    for r in [r for r in cold if not r.managed]:  # re-probe: reachable ones join as WARM
        act("launch", r, WARM, "static endpoint: adopt when reachable")
    managed_cold = [r for r in cold if r.managed]
    for r in managed_cold[: max(deficit, 0)]:
        act("launch", r, WARM, f"standby {standby} < wanted {wanted}")
    retiring = sum(1 for r in stale if r.state in (IDLE, WARM) and r.managed)
    if deficit > len(managed_cold) + retiring:
        notes.append(
            f"pool too small: wanted {wanted} in standby, "
            f"have {standby} and {len(managed_cold)} COLD slots to launch"
        )
    elif deficit > len(managed_cold):
        notes.append(
            f"roll to {target.variant}: {deficit - len(managed_cold)} launch(es) "
            "wait for the slot of a replica being retired"
        )
    if shortfall:
        notes.append(
            f"{shortfall} ACTIVE short of {target.active}: COLD slots launch to "
            "WARM first and are woken by a later plan (never COLD -> ACTIVE)"
        )
    if stale:
        notes.append(
            f"roll to {target.variant}: {n_stale_active} ACTIVE and "
            f"{len(stale) - n_stale_active} other replica(s) on another variant"
        )

    excess = len(still_warm) - target.warm
    if excess > 0:
        stoppable = [r for r in still_warm if refusal(r, COLD, now, dwell) is None]
        for r in stoppable[:excess]:
            act("stop", r, COLD, f"{len(still_warm)} WARM > target {target.warm}")
        if len(stoppable) < excess:
            deferred += [
                f"stop: {refusal(r, COLD, now, dwell)}"
                for r in still_warm
                if r.managed and r not in stoppable
            ]
    return Plan(
        actions=tuple(actions), deferred=tuple(deferred), notes=tuple(notes), shortfall=shortfall
    )


class _Act(Protocol):
    def __call__(
        self, kind: ActionKind, r: Replica, to: ReplicaState, why: str, retire: bool = False
    ) -> None: ...


def _drain(
    fresh_active: list[Replica],
    stale_active: list[Replica],
    target: PoolTarget,
    n_active: int,
    now: float,
    dwell: DwellPolicy,
    act: _Act,
    deferred: list[str],
) -> None:
    """Drain the ACTIVE replicas beyond the target: stale ones first (that is the roll,
    and only ever once a replacement is ACTIVE), then the longest ACTIVE; each once its
    anti-flap dwell is over."""
    excess = n_active - target.active
    candidates = stale_active + fresh_active
    drainable = [r for r in candidates if refusal(r, IDLE, now, dwell) is None]
    for r in drainable[:excess]:
        why = f"{n_active} ACTIVE > target {target.active}"
        if r in stale_active:
            why = f"roll to {target.variant}: replaced ({why}); runs {r.variant}"
        act("drain", r, IDLE, why)
    if len(drainable) < excess:
        deferred += [
            f"drain: {refusal(r, IDLE, now, dwell)}" for r in candidates if r not in drainable
        ]


def _retire(
    stale: list[Replica],
    target: PoolTarget,
    now: float,
    dwell: DwellPolicy,
    act: _Act,
    deferred: list[str],
) -> None:
    """Stale standby leaves: IDLE ones sleep once drained (``drain_s``), WARM managed
    ones stop, freeing their slots for the wanted variant. Static ones stay asleep."""
    for r in stale:
        why = f"retiring: runs {r.variant}, {target.variant} wanted"
        if r.state is IDLE:
            reason = refusal(r, WARM, now, dwell, retiring=True)
            if reason is None:
                act("sleep", r, WARM, why, retire=True)
            else:
                deferred.append(f"retire: {reason}")
        elif r.state is WARM and r.managed:
            act("stop", r, COLD, why, retire=True)
