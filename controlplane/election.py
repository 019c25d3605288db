"""Leader election on the store (docs/architecture.md §7.4): lease + txn on
``create_revision == 0``.

The leader is whoever created ``key`` (value = holder id, attached to the holder's
lease). Safety rests on two things:

* **Local deadline.** After each keep-alive that the server granted, the holder may
  act until ``sent + ttl - margin`` on its own clock, where ``sent`` is when that
  request *left* (the server extended the lease no earlier) and ``margin = ttl / 5``
  absorbs clock-rate drift and scheduling delays. ``is_leader`` compares against
  that deadline on every read, so it turns False before the server can expire the
  lease even if the event loop stalls, and even if nobody noticed a failed refresh.
  The lease's ``LeaseKeeper`` (controlplane/kernel/leases.py) keeps that deadline.
* **Fencing.** ``fence()`` returns compares (holder value and create_revision of the
  leader key) to put in every leader write, so a write from a deposed leader fails
  in etcd whatever its local clock believes.

Use the clock that the event loop runs on (``time.monotonic``) in production; a
manual clock is for tests and only moves ``is_leader`` and the deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import NoReturn

from controlplane.kernel.leases import LeaseKeeper, LeaseLost
from controlplane.kernel.store.port import (
    Compare,
    EventType,
    KeyValue,
    LeaseNotFound,
    Put,
    Store,
    StoreError,
    StoreFull,
    StoreUnavailable,
    WatchEvent,
)

log = logging.getLogger("tectonic.election")

_RESIGNED = "resigned"
_STOPPED = "election stopped"
_VOLUNTARY = (_RESIGNED, _STOPPED)


@contextlib.asynccontextmanager
async def _closing(events: AsyncIterator[WatchEvent]) -> AsyncIterator[AsyncIterator[WatchEvent]]:
    """``aclosing`` for the port's AsyncIterator: ends the watch (its gRPC stream) on
    exit, also when the consumer leaves early."""
    try:
        yield events
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


class NotLeader(Exception):
    """This instance does not (or no longer) hold leadership; do not act."""


class _Lost(Exception):
    """Internal: ends the leader's task group with the reason leadership ended."""


class LeaderElection:
    """Campaign for ``key`` as ``holder`` with a lease of ``ttl_s`` seconds.

    ``run()`` campaigns forever: it grants a lease and tries a compare-and-set create
    of ``key``; while someone else holds it, it watches the key for deletion (and
    polls every ttl/4); while leading, it refreshes the lease every ttl/3 and watches
    the key, and steps down as soon as the local deadline passes, the lease is gone,
    or the key is deleted or overwritten. Await ``wait_changed()`` to learn of changes.
    """

    def __init__(
        self,
        store: Store,
        key: str,
        holder: str,
        ttl_s: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s < 1:
            raise ValueError(f"ttl_s must be at least 1 s, got {ttl_s}")
        self._store = store
        self._key = key
        self._holder = holder
        self._holder_b = holder.encode()
        self._ttl = ttl_s
        self._clock = clock
        # The lease and its local deadline (module doc); resign() wakes its waits.
        self._lease = LeaseKeeper(store, ttl_s, clock=clock, sleep=self._nap, log=log)
        self._poll_every = ttl_s / 4
        self._full_logged = False  # one warning per stretch of a full store
        self._retry_every = self._lease.retry_every

        self._running = False
        self._leading = False
        self._create_revision = 0
        self._key_mod_revision = 0
        self._seen_leader: str | None = None
        self._hold_until = -math.inf
        self._resigns = 0  # bumped by resign(); a campaign that overlapped one is void
        self._changed = asyncio.Event()
        self._wakeup = asyncio.Event()

    # ---- what others read ----------------------------------------------------------

    @property
    def key(self) -> str:
        return self._key

    @property
    def holder(self) -> str:
        return self._holder

    @property
    def ttl_s(self) -> int:
        return self._ttl

    @property
    def is_leader(self) -> bool:
        """True only while leading and before the local deadline (see module doc)."""
        return self._leading and self._lease.valid

    @property
    def valid_for_s(self) -> float:
        """How long this leadership is certainly valid without another keep-alive."""
        return self._lease.valid_for_s if self._leading else 0.0

    @property
    def leader_create_revision(self) -> int:
        """create_revision of the leader key while leading, else 0."""
        return self._create_revision if self.is_leader else 0

    @property
    def lease_id(self) -> int:
        return self._lease.id

    def fence(self) -> list[Compare]:
        """Compares to add to every leader write: the key still holds our id and was
        created by our campaign. Raises NotLeader when not leading."""
        if not self.is_leader:
            raise NotLeader(f"{self._holder} is not the leader of {self._key}")
        return [
            Compare.value_is(self._key, self._holder_b),
            Compare.created_at(self._key, self._create_revision),
        ]

    async def current_leader(self) -> str | None:
        """The holder id stored in the key now (one read), or None if vacant."""
        kv = await self._store.get(self._key)
        return kv.value.decode(errors="replace") if kv is not None else None

    async def wait_changed(self) -> bool:
        """Wait for the next gain or loss of leadership; returns ``is_leader``."""
        await self._changed.wait()
        return self.is_leader

    # ---- campaign ------------------------------------------------------------------

    async def run(self) -> None:
        """Campaign, lead, step down, repeat; until cancelled. Cancelling drops
        leadership locally only: call ``resign()`` first for a fast handover.
        Temporary store errors are ridden out; a permanent StoreError (e.g. the store
        was closed) ends ``run()``, inside an ExceptionGroup if it came while leading."""
        if self._running:
            raise RuntimeError(f"election for {self._key} as {self._holder} already runs")
        self._running = True
        try:
            while True:
                await self._campaign()
                reason = "?"
                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self._keep_alive())
                        tg.create_task(self._watch_key())
                except* _Lost as group:
                    reason = str(group.exceptions[0])
                self._step_down(reason)
        finally:
            self._running = False
            self._step_down(_STOPPED)

    async def resign(self, *, hold_off_s: float | None = None) -> None:
        """Stop leading now, revoke the lease (deleting the key, so another candidate
        takes over at once) and stay out of the campaign for ``hold_off_s`` (default
        ``ttl_s``) while ``run()`` goes on."""
        self._resigns += 1
        self._hold_until = self._clock() + (self._ttl if hold_off_s is None else hold_off_s)
        self._step_down(_RESIGNED)
        self._wake()
        await self._lease.revoke()  # StoreUnavailable logged: the lease expires in ttl

    async def _campaign(self) -> None:
        """Return once leading."""
        while True:
            await self._nap(self._hold_until - self._clock())
            if self._clock() < self._hold_until:
                continue  # woken early by another resign()
            try:
                holder_kv = await self._try_acquire()
                if holder_kv is None:
                    return
                await self._wait_vacancy(holder_kv)
            except LeaseNotFound:
                self._lease.forget()  # expired or revoked under us: take a new one
            except StoreUnavailable as e:
                log.warning("campaign for %s: store unavailable: %s", self._key, e)
                await self._nap(self._retry_every)
            except StoreFull as e:
                # etcd is full (NOSPACE): no one can take the key, but this replica must
                # stay up to answer status truthfully; campaign again once it has room.
                if not self._full_logged:
                    log.warning("campaign for %s: the store refuses writes: %s", self._key, e)
                    self._full_logged = True
                await self._nap(self._retry_every)
            else:
                self._full_logged = False

    async def _try_acquire(self) -> KeyValue | None:
        """Compare-and-set create of the key; None when we lead, else the holder's kv."""
        resigns = self._resigns
        await self._lease.ensure()  # refreshed or granted: the deadline starts anew
        lease = self._lease.id
        result = await self._store.txn(
            [Compare.absent(self._key)], [Put(self._key, self._holder_b, lease)]
        )
        kv: KeyValue | None
        if result.succeeded:
            kv = KeyValue(self._key, self._holder_b, result.revision, result.revision, 1, lease)
        else:
            kv = await self._store.get(self._key)
            if kv is None:
                return await self._try_acquire()  # vacated in between: try again now
        if kv.value != self._holder_b or kv.lease != lease:
            self._note_leader(kv)
            return kv
        # Ours: just created, or created by an earlier attempt whose answer was lost.
        if resigns != self._resigns:
            await self._store.revoke_lease(lease)  # resign() raced the campaign
            self._lease.forget()
            return kv
        self._become_leader(kv)
        return None

    async def _wait_vacancy(self, holder_kv: KeyValue) -> None:
        """Until the key is deleted (watch) or ttl/4 passes (poll), whichever first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._poll_every):
                # A broken or refused watch leaves the poll: never spin on the store.
                with contextlib.suppress(StoreError):
                    start = holder_kv.mod_revision + 1
                    events = self._store.watch_prefix(self._key, start_revision=start)
                    async with _closing(events):
                        async for ev in events:
                            if ev.kv.key == self._key and ev.type is EventType.DELETE:
                                return
                await self._wakeup.wait()  # resign() or the poll period, whichever first

    # ---- leading -------------------------------------------------------------------

    async def _keep_alive(self) -> NoReturn:
        """Refresh every ttl/3; raise _Lost when the deadline passes or the lease is gone."""
        try:
            await self._lease.keep_alive(self._check_still_leading)
        except LeaseLost as e:
            raise _Lost(str(e)) from e

    def _check_still_leading(self) -> None:
        """After every wait and every refresh, before the deadline moves: a refresh
        that came back too late does not revive a leadership that had lapsed."""
        if not self._leading:
            raise _Lost(_RESIGNED)
        self._lease.check_deadline()

    async def _watch_key(self) -> NoReturn:
        """Raise _Lost when the key is deleted or overwritten by someone else."""
        start = self._key_mod_revision + 1
        while True:
            try:
                events = self._store.watch_prefix(self._key, start_revision=start)
                async with _closing(events):
                    async for ev in events:
                        if ev.kv.key != self._key:
                            continue
                        start = ev.kv.mod_revision + 1
                        if ev.type is EventType.DELETE:
                            raise _Lost("leader key was deleted (lease gone or removed by hand)")
                        if ev.kv.value != self._holder_b:
                            raise _Lost(f"leader key overwritten by {ev.kv.value!r}")
            except StoreUnavailable:
                pass  # the keep-alive deadline guards safety meanwhile; watch again
            except StoreError:
                # e.g. start revision compacted: look at the key itself instead.
                with contextlib.suppress(StoreUnavailable):
                    kv = await self._store.get(self._key)
                    if kv is None or kv.create_revision != self._create_revision:
                        raise _Lost("leader key was replaced while unwatched") from None
                    start = kv.mod_revision + 1
            await self._nap(self._retry_every)

    # ---- state changes -------------------------------------------------------------

    def _become_leader(self, kv: KeyValue) -> None:
        self._leading = True
        self._create_revision = kv.create_revision
        self._key_mod_revision = kv.mod_revision
        self._seen_leader = self._holder
        log.info(
            "became leader of %s (lease %#x, ttl %ds, create_revision %d)",
            self._key,
            self._lease.id,
            self._ttl,
            kv.create_revision,
        )
        self._notify()

    def _step_down(self, reason: str) -> None:
        if not self._leading:
            return
        self._leading = False
        self._seen_leader = None
        level = logging.INFO if reason in _VOLUNTARY else logging.WARNING
        log.log(level, "lost leadership of %s: %s", self._key, reason)
        self._notify()

    def _note_leader(self, kv: KeyValue) -> None:
        holder = kv.value.decode(errors="replace")
        if holder != self._seen_leader:
            self._seen_leader = holder
            log.info("%s follows %s as leader of %s", self._holder, holder, self._key)

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _wake(self) -> None:
        wakeup, self._wakeup = self._wakeup, asyncio.Event()
        wakeup.set()

    async def _nap(self, seconds: float) -> None:
        """Sleep up to ``seconds``; ``resign()`` wakes every nap early."""
        if seconds <= 0:
            return
        wakeup = self._wakeup
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await wakeup.wait()
