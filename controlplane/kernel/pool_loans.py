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
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from pydantic import Field

from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.leases import LeaseKeeper, LeaseLost
from controlplane.kernel.model import Frozen
from controlplane.kernel.pool_members import PoolMembers
from controlplane.kernel.store.port import Store, StoreError, StoreUnavailable

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
    reason = early_refusal(region, await read_members(store, keys, region), replica)
    if reason is not None:
        raise LoanRefused(region, reason)
    loan = PoolLoan(
        loan_id=secrets.token_hex(8),
        borrower=borrower,
        purpose=purpose,
        replica=replica,
        since=wall_clock(),
    )
    body = asyncio.current_task()
    if body is None:
        raise RuntimeError("borrow needs a running task")
    keeper = LeaseKeeper(store, ttl_s, name=f"pool loan {loan.loan_id}", log=log)
    await keeper.grant()
    guard = _Guard(body)
    guard.start(_keep(keeper, guard), f"loan-lease:{loan.loan_id}")
    url: str | None = None
    body_failed, cancelled = True, False
    try:
        await store.put(keys.pool_loan(region, loan.loan_id), encode(loan), lease=keeper.id)
        url = await _answer(store, keys, region, loan.loan_id, timeout_s, poll_s)
        log.info("loan %s: %s of %s lent to %s (%s)", loan.loan_id, url, region, borrower, purpose)
        guard.start(_follow(store, keys, region, loan.loan_id, url, guard, check_s), "loan-check")
        yield url
        body_failed = False
    except asyncio.CancelledError:
        if guard.why is not None and body.uncancel() == 0:  # our cancel, nobody else's
            raise LoanLost(region, loan.loan_id, url, guard.why) from None
        cancelled = True
        raise
    finally:
        await guard.disarm()
        await asyncio.shield(keeper.revoke())  # deletes the loan: the agent returns it
        if url is not None and not cancelled:
            await _await_return(
                store, keys, region, loan.loan_id, url, return_timeout_s, poll_s, body_failed
            )


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
    store: Store, keys: Keys, region: str, loan_id: str, url: str, guard: _Guard, every_s: float
) -> None:
    """Re-read ``pools/<region>``: the loan is lost once the agent lists another replica
    for it, or none (an agent restarted forgets what it lent; a lent replica that died
    is refused)."""
    while True:
        await asyncio.sleep(every_s)
        members = await _members_or_none(store, keys, region)
        if members is None or members.lent.get(loan_id) == url:
            continue  # unreadable now: the lease says whether the loan still holds
        refused = members.loan_refusals.get(loan_id)
        guard.lose(
            f"pools/{region} no longer lists {url} for it"
            + (f": {refused}" if refused else " (the agent restarted, or took it back)")
        )
        return


async def _answer(
    store: Store, keys: Keys, region: str, loan_id: str, timeout_s: float, poll_s: float
) -> str:
    """The URL the agent lent for ``loan_id``; raises its refusal, or the timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        members = await _members_or_none(store, keys, region)
        if members is not None and loan_id in members.lent:
            return members.lent[loan_id]
        if members is not None and loan_id in members.loan_refusals:
            raise LoanRefused(region, members.loan_refusals[loan_id], loan_id)
        if loop.time() >= deadline:
            raise LoanTimedOut(
                region,
                f"no agent answered within {timeout_s:g} s: is {region}'s agent running "
                "a warm pool that lends, and reaching etcd?",
                loan_id,
            )
        await asyncio.sleep(poll_s)


async def _await_return(
    store: Store,
    keys: Keys,
    region: str,
    loan_id: str,
    url: str,
    timeout_s: float,
    poll_s: float,
    body_failed: bool,
) -> None:
    """Until ``pools/<region>`` no longer lists the loan (the replica is asleep again)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        members = await _members_or_none(store, keys, region)
        if members is not None and loan_id not in members.lent:
            log.info("loan %s: %s of %s returned", loan_id, url, region)
            return
        if loop.time() >= deadline:
            break
        await asyncio.sleep(poll_s)
    problem = (
        f"{region}: the agent did not report {url} (loan {loan_id}) back asleep within "
        f"{timeout_s:g} s"
    )
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
