"""Warm-pool replica states, their edges and dwell times. PURE: no I/O and no clock;
every function takes ``now`` (seconds on the caller's clock).

States: COLD (no process / static endpoint unreachable), WARM (up, model loaded,
asleep), ACTIVE (awake and routed), IDLE (awake, drained from routing), LENT (awake, out
of rotation, lent to a borrower such as the capacity probe).

Edges (anything else is refused, with a reason)::

    COLD --launch--> WARM --wake--> ACTIVE --drain--> IDLE --sleep--> WARM --stop--> COLD
                                      ^                 |
                                      +-----resume------+
    WARM --lend--> LENT --return--> WARM
    any --died (observed)--> COLD
    COLD (launching) --cancel--> COLD: a launch the targets no longer want, abandoned

- never COLD -> ACTIVE: a launched replica is put to sleep first and woken like any
  other, so every activation goes through ``/wake_up`` + ``/reset_prefix_cache``;
- IDLE -> WARM only after the IDLE dwell, WARM -> COLD only after the WARM dwell
  (waived while the leader says the pool is over its budget: ``PoolTarget.over_budget``);
- anti-flap: ACTIVE -> IDLE only after the minimum ACTIVE dwell. Waking and resuming are
  never held back (capacity comes first; scaling down is what waits), so a replica
  changes routing at most once per ``active_min_s`` in the down direction.

An :class:`Action` is one move along an edge; the planner (:mod:`regions.pool.planner`)
decides which to make.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

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

ActionKind = Literal[
    "launch", "wake", "drain", "resume", "sleep", "stop", "lend", "return", "cancel"
]
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
# "cancel" is no edge: a slot being launched is COLD before and after (what the launch
# started is stopped); only the planner's CANCEL phase asks for it


class DwellPolicy(Frozen):
    """Minimum time in a state before the planner moves a replica on (seconds)."""

    warm_min_s: float = Field(300.0, ge=0)  # WARM before stop: launches are expensive
    idle_min_s: float = Field(1800.0, ge=0)  # IDLE before sleep: instant return to ACTIVE
    # IDLE before sleep while the leader's scaler sizes the pool (``scale/<unit>``): its
    # stable window is the hysteresis already, and an awake IDLE replica costs what an
    # ACTIVE one does; never below ``drain_s`` (sleep aborts what a replica still runs)
    scaled_idle_min_s: float = Field(10.0, ge=0)
    # WARM before stop while the scaler sizes the pool: its WARM target already holds
    # what the forecast needs two horizons ahead and the planned burst, so WARM beyond
    # it is a forecast since revised (a ramp's knee); kept about a launch's time
    # (60-180 s), not the pool file's 300 s, at 0.6 of ACTIVE's price
    scaled_warm_min_s: float = Field(120.0, ge=0)
    active_min_s: float = Field(120.0, ge=0)  # ACTIVE before drain: the anti-flap rule
    # IDLE before a stale replica (another variant) is retired: requests routed to it
    # before gateways saw it drained finish first (sleep aborts running requests).
    drain_s: float = Field(10.0, ge=0)


class PoolTarget(Frozen):
    """How many replicas should be ACTIVE, and how many kept in standby (WARM);
    ``variant``: the one replicas should run (None: any, the launcher has one kind);
    ``scaled``: the sizes are the leader's scaler's (IDLE sleeps after
    ``DwellPolicy.scaled_idle_min_s``), not the pool file's; ``over_budget``: the
    leader's budget says the pool spends past it now (``scale/<unit>``'s
    ``budget.over``): WARM beyond the sizes stops without the WARM dwell."""

    active: int = Field(ge=0)
    warm: int = Field(ge=0)
    variant: str | None = None
    scaled: bool = False
    over_budget: bool = False


def dwell_for(dwell: DwellPolicy, target: PoolTarget) -> DwellPolicy:
    """The dwell times that hold for ``target``: a scaled pool's IDLE sleeps after
    ``scaled_idle_min_s`` (never under ``drain_s``) and its WARM beyond the target stops
    after ``scaled_warm_min_s`` (at most ``warm_min_s``); an over-budget pool's WARM
    stops at once. The WARM dwell guards against launch churn (a replica stopped and
    launched again minutes later, paid at ACTIVE's price while it loads); standby the
    budget cut from a pool paying past it is not churn, and kept for the dwell it would
    be paid past the budget all that time. The IDLE dwell stays: it lets what a drained
    replica still runs finish before it sleeps. The planner plans with these and the
    pool checks its moves with them: one rule for both."""
    update: dict[str, float] = {}
    if target.scaled:
        update["idle_min_s"] = max(dwell.scaled_idle_min_s, dwell.drain_s)
        update["warm_min_s"] = min(dwell.warm_min_s, dwell.scaled_warm_min_s)
    if target.over_budget:
        update["warm_min_s"] = 0.0
    return dwell.model_copy(update=update) if update else dwell


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


def cancel_refusal(r: Replica) -> str | None:
    """Why ``r``'s launch may not be cancelled (only a managed slot being launched may),
    or None when it may."""
    if r.state is COLD and r.busy and r.managed:
        return None
    return f"{r.name} is {r.state}{' (busy)' if r.busy else ''}: no launch of ours in flight"


def cancelled(r: Replica) -> Replica:
    """``r`` once its launch is cancelled: an empty COLD slot, free for the next launch."""
    if (why := cancel_refusal(r)) is not None:
        raise TransitionRefused(why)
    return r.model_copy(update={"busy": False, "variant": None, "url": None})


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
