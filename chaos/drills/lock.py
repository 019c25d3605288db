"""The drill lock on ``drills/lock``: one drill at a time per deployment.

``DrillLocker`` creates the lock (txn on ``create_revision == 0``, as leader election
does) on a lease of its own, keeps that lease alive while a drill runs, records the
finished run (history row + audit entry, deleting the lock if still ours, in one
transaction) and frees the lock by revoking the lease. ``DrillBusy`` and ``LockLost``
are what the drill service raises when the lock is taken or lost; the service's
module docstring (chaos/drills/service.py) has the whole protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NoReturn

from chaos.drills.result import DrillSummary
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.details import json_list
from controlplane.kernel.drills import DrillLock
from controlplane.kernel.keys import Keys
from controlplane.kernel.leases import LeaseKeeper, LeaseLost
from controlplane.kernel.model import AuditAction, AuditEntry
from controlplane.kernel.store.port import (
    Compare,
    Delete,
    KeyValue,
    Put,
    Store,
    StoreError,
    StoreUnavailable,
)
from controlplane.kernel.store.retry import retry_call

log = logging.getLogger("tectonic.drills")


class DrillBusy(Exception):
    """Another drill holds the lock; nothing was started."""

    def __init__(self, lock: DrillLock | None, raw: str = "") -> None:
        self.lock = lock
        if lock is None:
            what = f"held with an unreadable value {raw!r}" if raw else "taken and freed repeatedly"
            super().__init__(f"the drill lock is {what}; not starting another drill")
            return
        since = datetime.fromtimestamp(lock.started_at, UTC)
        super().__init__(
            f"drill {lock.scenario} on {lock.region or '(default region)'} ({lock.trigger}) "
            f"is running, held by {lock.holder} since {since:%Y-%m-%d %H:%M:%S} UTC; "
            "one drill at a time: wait for it (if its process died, the lock frees itself "
            "when its lease expires)"
        )


class LockLost(Exception):
    """The lock's lease expired or was revoked while a drill ran: it was cancelled."""


@dataclass(frozen=True)
class HeldLock:
    keeper: LeaseKeeper  # the lock's lease, its deadline on the event loop's clock
    create_revision: int

    @property
    def lease(self) -> int:
        return self.keeper.id


class DrillLocker:
    """Takes, keeps alive, and frees ``drills/lock`` for one holder (a drill service)."""

    def __init__(
        self, store: Store, keys: Keys, clock: Clock, holder: str, ttl: int, deadline_s: float
    ) -> None:
        self._store = store
        self._keys = keys
        self._clock = clock
        self.holder = holder
        self._ttl = ttl
        self._deadline = deadline_s
        self._audit = AuditLog(keys, holder)

    @contextlib.asynccontextmanager
    async def locked(self, name: str, region: str, trigger: str) -> AsyncIterator[HeldLock]:
        """Hold the lock for drill ``name`` while the block runs (``region`` as the lock
        shows it: the scenario's default filled in); DrillBusy if another holds it."""
        held = await self._acquire(name, region, trigger)
        try:
            yield held
        finally:
            await held.keeper.revoke(ignore=(StoreError,))  # frees the lock (if record did not)

    async def _acquire(self, name: str, region: str, trigger: str) -> HeldLock:
        """Create the lock on a fresh lease, or raise DrillBusy (the lease revoked)."""
        keeper = LeaseKeeper(
            self._store,
            self._ttl,
            clock=asyncio.get_running_loop().time,
            name="the drill lock's lease",
            log=log,
        )
        lease = await retry_call(self._deadline, keeper.grant)
        lock = DrillLock(
            holder=self.holder,
            scenario=name,
            region=region,
            trigger=trigger,
            started_at=self._clock.now(),
            lease=lease,
        )
        key = self._keys.drill_lock()
        try:
            for _ in range(3):  # the holder may finish between our txn and our read
                revision = await self._try_create(key, lock)
                if revision:
                    return HeldLock(keeper, revision)
                kv = await retry_call(self._deadline, self._store.get, key)
                if kv is not None:
                    raise _busy(kv)
            raise DrillBusy(None)
        except BaseException:
            await keeper.revoke(ignore=(StoreError,))
            raise

    async def _try_create(self, key: str, lock: DrillLock) -> int:
        """create_revision of the lock if we created it, else 0."""
        try:
            result = await self._store.txn(
                [Compare.absent(key)], [Put(key, encode(lock), lock.lease)]
            )
            return result.revision if result.succeeded else 0
        except StoreUnavailable:
            # Outcome unknown (txn is not retried blindly): the key on our lease is ours.
            kv = await retry_call(self._deadline, self._store.get, key)
            return kv.create_revision if kv is not None and kv.lease == lock.lease else 0

    async def keep_alive(self, held: HeldLock) -> NoReturn:
        """Refresh the lease every ttl/3; raise LockLost when it is gone or when no
        refresh succeeded for ttl - ttl/5 (the server may expire it any moment)."""
        try:
            await held.keeper.keep_alive()
        except LeaseLost as e:
            if e.gone:
                raise LockLost(f"the drill lock's lease {e.lease:#x} is gone") from e
            lapse = self._ttl - held.keeper.margin
            raise LockLost(f"no keep-alive of the drill lock for {lapse:g} s") from e
        except StoreError as e:
            raise LockLost(f"cannot keep the drill lock: {e}") from e

    async def record(self, held: HeldLock, summary: DrillSummary, also: Sequence[Put] = ()) -> None:
        """History row + audit entry, one sortable id, ``also`` (a capacity probe's
        record and its audit entry), and the lock deleted if still ours, in one
        transaction (safe to retry: same keys, same values)."""
        entry = AuditEntry(
            at=summary.ended_at,
            actor=self.holder,
            action=AuditAction.DRILL_RUN,
            region=summary.region,
            reason=f"{summary.trigger} drill {summary.scenario}",
            result="passed" if summary.passed else "failed",
            details={
                "drill": summary.id,
                "aborted": summary.aborted,
                "failed": json_list(summary.failed),
            },
        )
        audit = self._audit.op(entry)
        sortable_id = audit.key.removeprefix(self._keys.audit_prefix())
        history = Put(self._keys.drill_history(sortable_id), encode(summary))
        lock = self._keys.drill_lock()
        await retry_call(
            self._deadline,
            self._store.txn,
            [Compare.created_at(lock, held.create_revision)],
            [audit, history, *also, Delete(lock)],
            [audit, history, *also],
        )


def _busy(kv: KeyValue) -> DrillBusy:
    try:
        return DrillBusy(decode(DrillLock, kv.value, kv.key))
    except CorruptValue:
        return DrillBusy(None, kv.value.decode(errors="replace"))
