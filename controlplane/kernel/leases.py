"""One lease on the store: grant, refresh, the local deadline, loss, revoke.

``LeaseKeeper`` holds at most one lease at a time. Its safety rule is the one leader
election rests on (controlplane/election.py):

* **Local deadline.** After each grant or refresh that the server answered, the
  lease is certainly alive until ``sent + ttl - margin`` on the keeper's clock, where
  ``sent`` is when that request *left* (the server extended the lease no earlier)
  and ``margin = ttl / 5`` absorbs clock-rate drift and scheduling delays. Past that
  deadline the server may expire the lease at any moment.
* **Keep-alive.** ``keep_alive()`` refreshes every ``ttl / 3`` (``ttl / 10`` after a
  failed try) and raises ``LeaseLost`` when the store says the lease is gone or when
  the deadline passes without a refresh; it never waits on the store past it.

``grant_and_put`` is the other common step: a fresh lease and one key recorded on it
in a guarded transaction, the lease revoked again when the write loses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn

from controlplane.kernel.store.port import (
    Compare,
    LeaseNotFound,
    Put,
    Store,
    StoreError,
    StoreUnavailable,
)

_log = logging.getLogger("tectonic.leases")

Sleep = Callable[[float], Awaitable[None]]


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(max(0.0, seconds))


def _no_check() -> None:
    pass


class LeaseLost(Exception):
    """The lease is gone (``gone``: the store said so) or its local deadline passed."""

    def __init__(self, lease: int, *, gone: bool, silent_s: float) -> None:
        self.lease, self.gone, self.silent_s = lease, gone, silent_s
        if gone:
            super().__init__(f"lease {lease:#x} expired or was revoked")
        else:
            super().__init__(f"keepalive failed for {silent_s:.1f}s")


class LeaseKeeper:
    """Holds one lease of ``ttl_s`` seconds on ``store`` (see the module doc).

    ``clock`` measures the deadline: use the clock the event loop runs on
    (``time.monotonic``) in production. ``sleep`` is how the keep-alive waits; pass
    one that can be woken early to cut the waits short. ``name`` and ``log`` say
    whose lease it is in log lines.
    """

    def __init__(
        self,
        store: Store,
        ttl_s: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = _sleep,
        name: str = "lease",
        log: logging.Logger = _log,
    ) -> None:
        self._store = store
        self.ttl_s = ttl_s
        self._clock = clock
        self._sleep = sleep
        self._name = name
        self._log = log
        self.margin = ttl_s / 5
        self.refresh_every = ttl_s / 3
        self.retry_every = max(ttl_s / 10, 0.1)
        self._id = 0
        self._sent = -math.inf  # when the last grant/refresh that succeeded was sent
        self._deadline = -math.inf

    @property
    def id(self) -> int:
        """The lease id, 0 while none is held."""
        return self._id

    @property
    def sent(self) -> float:
        """When the last grant or refresh that succeeded was sent (clock time)."""
        return self._sent

    @property
    def deadline(self) -> float:
        """Until when (clock time) the lease is certainly alive; -inf without one."""
        return self._deadline

    @property
    def valid(self) -> bool:
        return self._clock() < self._deadline

    @property
    def valid_for_s(self) -> float:
        """How long the lease is certainly alive without another refresh."""
        return max(0.0, self._deadline - self._clock())

    def check_deadline(self) -> None:
        """Raise LeaseLost once the local deadline has passed."""
        if self._clock() >= self._deadline:
            raise LeaseLost(self._id, gone=False, silent_s=self._clock() - self._sent)

    def forget(self) -> None:
        """The lease is known to be gone (e.g. a write on it got LeaseNotFound)."""
        self._id, self._sent, self._deadline = 0, -math.inf, -math.inf

    async def grant(self) -> int:
        """A new lease (the old one, if any, is forgotten, not revoked); its id."""
        self.forget()
        sent = self._clock()
        self._id = await self._store.grant_lease(self.ttl_s)
        self._extended(sent, self.ttl_s)
        return self._id

    async def refresh(self) -> None:
        """One keep-alive of the held lease. Raises LeaseNotFound if it is gone (and
        forgets it), StoreUnavailable if the store could not be reached."""
        sent = self._clock()
        try:
            ttl = await self._store.refresh_lease(self._id)
        except LeaseNotFound:
            self.forget()
            raise
        self._extended(sent, ttl)

    async def ensure(self, on_gone: Callable[[int], None] | None = None) -> bool:
        """Refresh the lease, or grant one when none is held or it is gone (after
        ``on_gone(old id)``). True when a new lease was granted."""
        if self._id:
            old = self._id
            try:
                await self.refresh()
                return False
            except LeaseNotFound:
                if on_gone is not None:
                    on_gone(old)
        await self.grant()
        return True

    async def keep_alive(self, check: Callable[[], None] = _no_check) -> NoReturn:
        """Refresh every ttl/3 until cancelled; raise LeaseLost when the lease is gone
        or the deadline passes. ``check`` runs after every wait and every refresh,
        before the deadline moves: it may raise to stop. Other StoreErrors propagate."""
        next_refresh = self._sent + self.refresh_every
        while True:
            await self._sleep(min(next_refresh, self._deadline) - self._clock())
            check()
            self.check_deadline()
            sent = self._clock()
            try:
                async with asyncio.timeout(max(self._deadline - sent, 0.0)):
                    ttl = await self._store.refresh_lease(self._id)
            except LeaseNotFound as e:
                lost = LeaseLost(self._id, gone=True, silent_s=sent - self._sent)
                self.forget()
                raise lost from e
            except (StoreUnavailable, TimeoutError) as e:
                self._log.warning(
                    "keep-alive of %s %#x failed (%.1fs since the last one): %s",
                    self._name,
                    self._id,
                    self._clock() - self._sent,
                    str(e) or type(e).__name__,
                )
                next_refresh = self._clock() + self.retry_every
                continue
            check()
            self._extended(sent, ttl)
            next_refresh = sent + self.refresh_every

    async def revoke(self, *, ignore: tuple[type[StoreError], ...] = (StoreUnavailable,)) -> None:
        """Revoke the lease now (deleting its keys) and forget it; a no-op without
        one. Errors in ``ignore`` are logged: the lease then expires within its ttl."""
        lease = self._id
        self.forget()
        if not lease:
            return
        try:
            await self._store.revoke_lease(lease)
        except ignore as e:
            self._log.warning(
                "could not revoke %s %#x (it expires within %ds): %s",
                self._name,
                lease,
                self.ttl_s,
                e,
            )

    def _extended(self, sent: float, ttl: int) -> None:
        """The server extended the lease by ``ttl`` no earlier than ``sent``."""
        self._sent = sent
        self._deadline = sent + min(ttl, self.ttl_s) - self.margin


async def grant_and_put(
    store: Store,
    ttl_s: int,
    compares: Sequence[Compare],
    key: str,
    value: Callable[[int], bytes],
) -> int:
    """Grant a lease and write ``key`` = ``value(lease id)`` on it if ``compares``
    hold, in one transaction. The lease id when written; else 0, the lease revoked
    (also, shielded from cancellation, when the transaction raised)."""
    lease = await store.grant_lease(ttl_s)
    try:
        won = (await store.txn(compares, [Put(key, value(lease), lease)])).succeeded
    except BaseException:
        await asyncio.shield(_revoke_quietly(store, lease))
        raise
    if won:
        return lease
    await _revoke_quietly(store, lease)
    return 0


async def _revoke_quietly(store: Store, lease: int) -> None:
    with contextlib.suppress(StoreUnavailable):  # an unused lease expires on its own
        await store.revoke_lease(lease)
