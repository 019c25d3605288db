"""The planner's loans (``loans``: loan id -> the replica URL it names, or None for any
WARM one; see :mod:`regions.pool.planner`): which WARM replica each loan takes, after
scale-up's choice, why a loan cannot be served, and the LEND phase's moves. PURE."""

from __future__ import annotations

from regions.pool.plan_phases import Lift, PoolView, Step, move
from regions.pool.states import ACTIVE, COLD, IDLE, LENT, WARM, Replica, ReplicaState, is_stale


def lend(p: PoolView, lift: Lift) -> Lift:
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


def _named(p: PoolView, lift: Lift, url: str) -> Replica | str:
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


def _nothing_to_lend(p: PoolView, lift: Lift) -> str:
    """Why a loan for any replica finds none: what the pool holds instead."""
    held = ", ".join(f"{n} {s}" for s in ReplicaState if (n := sum(r.state is s for r in p.every)))
    why = f"no WARM replica to lend (the pool has {held or 'no replicas'})"
    if lift.woken:
        why += f"; {len(lift.woken)} WARM being woken into rotation"
    if p.launching:
        why += f"; {p.launching} launching"
    return why


def loans_step(p: PoolView, lift: Lift) -> Step:
    """Lend what the loans chose; return each LENT replica whose loan is gone (never
    held back: the borrower is done, or dead)."""
    lent = tuple(move(r, LENT, f"lent for loan {loan}", loan=loan) for r, loan in lift.lending)
    if p.loans is None:
        return Step(lent)  # loans not known: nothing ends
    back = tuple(
        move(r, WARM, f"loan {r.loan} ended", loan=r.loan) for r in p.lent if r.loan not in p.loans
    )
    return Step(lent + back)
