"""Loans of a warm-pool replica out of rotation (``pool-loans/<region>/<loan_id>``).

A borrower that must load one replica without loading production (the capacity probe)
asks the region agent for one. It writes a :class:`PoolLoan` on a lease of its own; the
agent lends a WARM standby replica (woken, its prefix cache reset, never listed in
``pools/<region>.active``, so no gateway routes to it) and says so in ``pools/<region>``
(``PoolMembers.lent``: loan id -> URL), or says why not (``PoolMembers.loan_refusals``).
The loan ends when its key goes: the borrower revokes its lease when done, or the lease
expires when the borrower dies; either way the agent puts the replica back to sleep.

::

    async with borrow(store, keys, "eu", borrower="capacity-probe@host") as url:
        ...  # load url: awake, out of rotation, nobody else's

``borrow`` refuses at once, before it writes anything, a region without a published pool
and a named replica that ``pools/<region>`` lists as ACTIVE or lent. While borrowed it
keeps the lease alive and re-reads ``pools/<region>`` every ``check_s``: if the lease is
lost (etcd unreachable past its deadline: the agent may already be putting the replica
to sleep) or the agent no longer lists the replica for the loan (it restarted, or the
replica died), the body is cancelled and :class:`LoanLost` raised, so that no
measurement is taken on a replica that is no longer the borrower's.

``borrow_together`` borrows several replicas at once (the capacity probe's pair, for
the scaling efficiency): one loan each, so the agent lends and refuses each as it does
one loan, but all on one lease and written in one transaction. They reach the agent
together, are held together (one lost: the body is cancelled) and returned together:
the lease's end, however the borrow ends, deletes every loan. ``at_least`` says how many
must be lent for the body to run; the loans not served are dropped at once, with the
agent's reasons in :class:`Borrowed`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.leases import LeaseKeeper, LeaseLost
from controlplane.kernel.model import Frozen
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.store.port import Delete, Put, Store, StoreError, StoreUnavailable

log = logging.getLogger("tectonic.pool_loans")
LOAN_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"  # one key segment


class PoolLoan(Frozen):
    """One loan, as the borrower writes it (on its lease)."""

    loan_id: str = Field(pattern=LOAN_ID)
    borrower: str = Field(min_length=1, max_length=200)  # who, for the agent's log
    purpose: str = ""  # e.g. "capacity probe"
    replica: str | None = None  # the base URL of the replica wanted; None: any WARM one
    since: float  # wall-clock seconds, on the borrower's clock: for operators


class LoanRefused(Exception):
    """No replica is lent: ``reason`` says why (the agent's words, or the borrower's)."""

    def __init__(self, region: str, reason: str, loan_id: str | None = None) -> None:
        self.region, self.reason, self.loan_id = region, reason, loan_id
        loan = f" (loan {loan_id})" if loan_id else ""
        super().__init__(f"{region}: no replica lent{loan}: {reason}")


class LoanTimedOut(LoanRefused):
    """No agent answered the loan in time."""


class LoanLost(Exception):
    """The replica stopped being the borrower's while borrowed; ``reason`` says how."""

    def __init__(self, region: str, loan_id: str, url: str | None, reason: str) -> None:
        self.region, self.loan_id, self.url, self.reason = region, loan_id, url, reason
        super().__init__(f"{region}: loan {loan_id} ({url or 'not lent yet'}) lost: {reason}")


class LoanNotReturned(Exception):
    """The agent did not report the replica back asleep within the bound."""


def early_refusal(region: str, members: PoolMembers | None, replica: str | None) -> str | None:
    """Why a loan cannot be served, from ``pools/<region>`` alone (None: ask the agent)."""
    if members is None:
        return (
            f"pools/{region} is absent: no agent publishes a warm pool there, so there "
            "is no WARM replica to lend"
        )
    if replica is None:
        return None
    wanted = replica.rstrip("/")
    if wanted in {u.rstrip("/") for u in members.active}:
        return (
            f"{replica} is ACTIVE in pools/{region}: in rotation, serving production; "
            "only a WARM replica out of rotation is lent"
        )
    if wanted in {u.rstrip("/") for u in members.lent.values()}:
        return f"{replica} is lent already (pools/{region})"
    return None


def early_refusals(
    region: str, members: PoolMembers | None, wanted: Sequence[str | None]
) -> str | None:
    """``early_refusal`` for loans taken together: the first reason, or a replica named
    twice (one replica cannot serve two loans)."""
    named = [u.rstrip("/") for u in wanted if u is not None]
    twice = sorted({u for u in named if named.count(u) > 1})
    if twice:
        return f"{', '.join(twice)} named twice: loans taken together need distinct replicas"
    for replica in wanted:
        reason = early_refusal(region, members, replica)
        if reason is not None:
            return reason
    return None


@dataclass(frozen=True, slots=True)
class Borrowed:
    """What ``borrow_together`` got: the URLs lent, in the order of ``wanted``, and why
    the loans not served were not (the agent's words)."""

    urls: tuple[str, ...]
    refused: tuple[str, ...] = ()


async def read_members(store: Store, keys: Keys, region: str) -> PoolMembers | None:
    kv = await store.get(keys.pool(region))
    return None if kv is None else decode(PoolMembers, kv.value, kv.key)


@asynccontextmanager
async def borrow(
    store: Store,
    keys: Keys,
    region: str,
    *,
    borrower: str,
    replica: str | None = None,
    purpose: str = "capacity probe",
    ttl_s: int = 10,
    timeout_s: float = 60.0,
    return_timeout_s: float = 30.0,
    poll_s: float = 0.2,
    check_s: float = 1.0,
    wall_clock: Callable[[], float] = time.time,
) -> AsyncIterator[str]:
    """Borrow a replica of ``region``'s warm pool (``replica``: that base URL, else any
    WARM one) and yield its URL; see the module docstring. Raises :class:`LoanRefused`
    with the reason, :class:`LoanTimedOut` when no agent answers within ``timeout_s``
    (a GPU wake takes seconds), :class:`LoanLost` when the replica stops being the
    borrower's (the body is cancelled).
    On exit the loan is deleted (its lease revoked) and the agent's report of the
    replica back asleep awaited for ``return_timeout_s``: :class:`LoanNotReturned`
    when it does not come (only logged if the body raised)."""
    async with borrow_together(
        store,
        keys,
        region,
        borrower=borrower,
        wanted=(replica,),
        purpose=purpose,
        ttl_s=ttl_s,
        timeout_s=timeout_s,
        return_timeout_s=return_timeout_s,
        poll_s=poll_s,
        check_s=check_s,
        wall_clock=wall_clock,
    ) as got:
        yield got.urls[0]


@asynccontextmanager
async def borrow_together(
    store: Store,
    keys: Keys,
    region: str,
    *,
    borrower: str,
    wanted: Sequence[str | None],
    at_least: int | None = None,
    purpose: str = "capacity probe",
    ttl_s: int = 10,
    timeout_s: float = 60.0,
    return_timeout_s: float = 30.0,
    poll_s: float = 0.2,
    check_s: float = 1.0,
    wall_clock: Callable[[], float] = time.time,
) -> AsyncIterator[Borrowed]:
    """Borrow ``len(wanted)`` replicas at once (each: that base URL, or None for any
    WARM one) on one lease, as ``borrow`` borrows one; ``at_least`` of them (default:
    all) must be lent, else :class:`LoanRefused` (:class:`LoanTimedOut` when no agent
    answered at all), and the replicas lent meanwhile go back. The agent's answers are
    awaited for every loan, up to ``timeout_s``; a loan unanswered then counts as
    refused. Yields a :class:`Borrowed`. Any loan lost cancels the body
    (:class:`LoanLost`); on exit every loan ends and each replica's return is awaited."""
    need = len(wanted) if at_least is None else at_least
    if not wanted or not 1 <= need <= len(wanted):
        raise ValueError(f"at_least must be within 1..{len(wanted)} (loans wanted), got {need}")
    reason = early_refusals(region, await read_members(store, keys, region), wanted)
    if reason is not None:
        raise LoanRefused(region, reason)
    since = wall_clock()
    loans = [
        PoolLoan(
            loan_id=secrets.token_hex(8),
            borrower=borrower,
            purpose=purpose,
            replica=replica,
            since=since,
        )
        for replica in wanted
    ]
    ids = [loan.loan_id for loan in loans]
    body = asyncio.current_task()
    if body is None:
        raise RuntimeError("borrow needs a running task")
    keeper = LeaseKeeper(store, ttl_s, name=f"pool loan {','.join(ids)}", log=log)
    await keeper.grant()
    guard = _Guard(body)
    guard.start(_keep(keeper, guard), f"loan-lease:{ids[0]}")
    lent: dict[str, str] = {}  # loan id -> URL: what must come back
    body_failed, cancelled = True, False
    try:
        # One transaction: the agent sees the loans together and answers them in one plan.
        puts = [Put(keys.pool_loan(region, x.loan_id), encode(x), keeper.id) for x in loans]
        await store.txn([], puts)
        lent, refused = await _answers(store, keys, region, ids, timeout_s, poll_s)
        if len(lent) < need:
            raise _refusal(region, ids, len(lent), need, refused, timeout_s)
        dropped = [x for x in ids if x not in lent]
        if dropped:  # a refused loan holds nothing; one unanswered yet must not be served
            await store.txn([], [Delete(keys.pool_loan(region, x)) for x in dropped])
        for x, url in lent.items():
            log.info("loan %s: %s of %s lent to %s (%s)", x, url, region, borrower, purpose)
        guard.start(_follow(store, keys, region, lent, guard, check_s), "loan-check")
        reasons = tuple(refused.get(x, f"no answer within {timeout_s:g} s") for x in dropped)
        yield Borrowed(tuple(lent[x] for x in ids if x in lent), reasons)
        body_failed = False
    except asyncio.CancelledError:
        if guard.why is not None and body.uncancel() == 0:  # our cancel, nobody else's
            urls = ", ".join(lent.values()) or None
            raise LoanLost(region, ",".join(lent) or ids[0], urls, guard.why) from None
        cancelled = True
        raise
    finally:
        await guard.disarm()
        await asyncio.shield(keeper.revoke())  # deletes the loans: the agent returns them
        if lent and not cancelled:
            await _await_return(store, keys, region, lent, return_timeout_s, poll_s, body_failed)


def _refusal(
    region: str,
    ids: Sequence[str],
    lent: int,
    need: int,
    refused: Mapping[str, str],
    timeout_s: float,
) -> LoanRefused:
    """Too few loans lent: the agent's reasons, or the timeout when it gave none."""
    if not refused and not lent:
        return LoanTimedOut(
            region,
            f"no agent answered within {timeout_s:g} s: is {region}'s agent running "
            "a warm pool that lends, and reaching etcd?",
            ids[0] if len(ids) == 1 else None,
        )
    if not refused:  # the agent answered some: the others are still waking, or stuck
        return LoanTimedOut(
            region, f"{lent} of {len(ids)} lent within {timeout_s:g} s, {need} needed"
        )
    first = next(x for x in ids if x in refused)
    if len(ids) == 1:
        return LoanRefused(region, refused[first], first)
    why = "; ".join(f"loan {x}: {refused[x]}" for x in ids if x in refused)
    return LoanRefused(region, f"{lent} of {len(ids)} lent, {need} needed; {why}", first)


class _Guard:
    """Cancels the borrower's body, once, when the loan stops being its own; ``why``
    says how. Its watchers run until ``disarm``."""

    def __init__(self, body: asyncio.Task[Any]) -> None:
        self.body = body
        self.why: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._armed = True

    def start(self, watcher: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.create_task(watcher, name=name))

    def lose(self, why: str) -> None:
        if not self._armed or self.why is not None:
            return
        self.why = why
        log.error("loan lost (%s): cancelling the borrower", why)
        self.body.cancel()

    async def disarm(self) -> None:
        self._armed = False  # first, synchronously: no cancel after the body is done
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _keep(keeper: LeaseKeeper, guard: _Guard) -> None:
    """Keep the loan's lease alive; lost, the loan is."""
    try:
        await keeper.keep_alive()
    except (LeaseLost, StoreError) as e:
        guard.lose(str(e) or type(e).__name__)


async def _follow(
    store: Store,
    keys: Keys,
    region: str,
    lent: Mapping[str, str],
    guard: _Guard,
    every_s: float,
) -> None:
    """Re-read ``pools/<region>``: the loans are lost once the agent lists another
    replica for one of them, or none (an agent restarted forgets what it lent; a lent
    replica that died is refused)."""
    while True:
        await asyncio.sleep(every_s)
        members = await _members_or_none(store, keys, region)
        if members is None:
            continue  # unreadable now: the lease says whether the loans still hold
        gone = [(x, url) for x, url in lent.items() if members.lent.get(x) != url]
        if not gone:
            continue
        loan_id, url = gone[0]
        refused = members.loan_refusals.get(loan_id)
        guard.lose(
            f"pools/{region} no longer lists {url} for it"
            + (f": {refused}" if refused else " (the agent restarted, or took it back)")
        )
        return


async def _answers(
    store: Store,
    keys: Keys,
    region: str,
    loan_ids: Sequence[str],
    timeout_s: float,
    poll_s: float,
) -> tuple[dict[str, str], dict[str, str]]:
    """The agent's answers (loan id -> URL lent, loan id -> why refused), once every
    loan has one or ``timeout_s`` has passed (those unanswered are in neither)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        lent: dict[str, str] = {}
        refused: dict[str, str] = {}
        members = await _members_or_none(store, keys, region)
        if members is not None:
            lent = {x: members.lent[x] for x in loan_ids if x in members.lent}
            refused = {
                x: members.loan_refusals[x]
                for x in loan_ids
                if x in members.loan_refusals and x not in lent
            }
        if len(lent) + len(refused) == len(loan_ids) or loop.time() >= deadline:
            return lent, refused
        await asyncio.sleep(poll_s)


async def _await_return(
    store: Store,
    keys: Keys,
    region: str,
    lent: Mapping[str, str],
    timeout_s: float,
    poll_s: float,
    body_failed: bool,
) -> None:
    """Until ``pools/<region>`` lists none of the loans (their replicas asleep again)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        members = await _members_or_none(store, keys, region)
        if members is not None and not any(x in members.lent for x in lent):
            for x, url in lent.items():
                log.info("loan %s: %s of %s returned", x, url, region)
            return
        if loop.time() >= deadline:
            break
        await asyncio.sleep(poll_s)
    which = ", ".join(f"{url} (loan {x})" for x, url in lent.items())
    problem = f"{region}: the agent did not report {which} back asleep within {timeout_s:g} s"
    if body_failed:  # the body's exception is the one to see; this one is logged
        log.warning("%s", problem)
        return
    raise LoanNotReturned(problem)


async def _members_or_none(store: Store, keys: Keys, region: str) -> PoolMembers | None:
    """``pools/<region>``; None while etcd is unreachable or the value unreadable (the
    callers poll until their deadline)."""
    try:
        return await read_members(store, keys, region)
    except (StoreUnavailable, CorruptValue) as e:
        log.debug("reading pools/%s: %s", region, e)
        return None
