"""``MemoryStore``: an in-process Store with etcd v3 semantics, for unit tests and demos.

Faithful to what the etcd adapter shows (measured against etcd 3.4, see
``tests/test_store_contract*.py``, which run the same suite against both):

* one global revision, starting at 1; a write bumps it once, however many keys a txn
  touches; a txn or delete that changes nothing does not bump it;
* ``create_revision`` 0 / ``mod_revision`` 0 / ``version`` 0 for an absent key, and a
  VALUE compare on an absent key is false whatever the operator;
* at most MAX_TXN_OPS compares and ops per branch, no key twice in one branch, and a
  put on an unknown lease fails with LeaseNotFound (only for the branch taken);
* leases expire ``ttl`` seconds after their grant / last refresh on the injected
  ``clock``; expiry is checked lazily on every call (and by ``expire_leases()``) and
  deletes all the lease's keys at one revision;
* ``watch_prefix`` replays history from ``start_revision`` (inclusive) and then
  streams live events; like the etcd adapter it registers on first iteration;
* reads at a past revision see the keys as they were then (the history replayed onto
  what compaction folded away), down to the compacted revision.

``set_available(False)`` simulates a partition: every call raises StoreUnavailable
and open watches break, while leases keep expiring on the clock as they would on
the server.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace

from controlplane.kernel.store.port import (
    MAX_TXN_OPS,
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    EventType,
    KeyValue,
    LeaseNotFound,
    Op,
    Page,
    Put,
    RevisionCompacted,
    StoreError,
    StoreFull,
    StoreUnavailable,
    TxnResult,
    WatchEvent,
)

Clock = Callable[[], float]


class ManualClock:
    """A clock that only moves when told to; pass it as ``clock=`` to MemoryStore and
    LeaderElection to drive lease expiry deterministically."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self.now += seconds


@dataclass
class _Lease:
    id: int
    ttl: int
    expires_at: float
    keys: set[str] = field(default_factory=set)


_WatchItem = WatchEvent | StoreError | None  # None: the store closed, end quietly


@dataclass(eq=False)
class _Watcher:
    prefix: str
    min_revision: int
    queue: asyncio.Queue[_WatchItem] = field(default_factory=asyncio.Queue)


def _compare_holds(c: Compare, kv: KeyValue | None) -> bool:
    if c.target is CompareTarget.VALUE:
        if not isinstance(c.value, bytes):
            raise StoreError(f"compare on value of {c.key!r} needs bytes, got {c.value!r}")
        if kv is None:
            return False  # etcd: a value compare on an absent key is always false
        actual: int | bytes = kv.value
    else:
        if not isinstance(c.value, int) or isinstance(c.value, bool):
            raise StoreError(f"compare on {c.target} of {c.key!r} needs int, got {c.value!r}")
        if kv is None:
            actual = 0
        elif c.target is CompareTarget.MOD:
            actual = kv.mod_revision
        elif c.target is CompareTarget.CREATE:
            actual = kv.create_revision
        else:
            actual = kv.version
    expected = c.value
    if c.op is CompareOp.EQ:
        return actual == expected
    if c.op is CompareOp.NE:
        return actual != expected
    if c.op is CompareOp.LT:
        return actual < expected  # type: ignore[operator]  # same type, checked above
    return actual > expected  # type: ignore[operator]


class MemoryStore:
    """In-memory Store (see the module docstring). ``txn``, ``create`` and ``cas`` are
    the compare-and-set operations; ``put`` and ``delete`` are unconditional."""

    def __init__(self, *, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._kvs: dict[str, KeyValue] = {}
        self._sorted: list[str] = []  # keys in byte order (== code point order for str)
        self._revision = 1  # a fresh etcd cluster is at revision 1
        self._compacted = 0
        self._history: list[WatchEvent] = []  # in revision order, for watch replay
        self._history_revs: list[int] = []
        self._base: dict[str, KeyValue] = {}  # the keys as compaction left them
        self._leases: dict[int, _Lease] = {}
        self._next_lease_id = 0x7E570001
        self._watchers: set[_Watcher] = set()
        self._available = True
        self._full = False  # etcd's NOSPACE alarm, simulated
        self._closed = False

    # ---- test controls -------------------------------------------------------------

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def available(self) -> bool:
        return self._available

    def set_available(self, available: bool) -> None:
        """False: every call raises StoreUnavailable and open watches break."""
        self._available = available
        if not available:
            for w in list(self._watchers):
                w.queue.put_nowait(StoreUnavailable("memory store: unavailable (simulated)"))
            self._watchers.clear()

    def expire_leases(self) -> list[int]:
        """Expire every lease whose deadline has passed on the clock; returns their ids.
        Works while unavailable too: expiry is server-side."""
        now = self._clock()
        due = sorted(
            (le for le in self._leases.values() if le.expires_at <= now),
            key=lambda le: le.expires_at,
        )
        for lease in due:
            self._drop_lease(lease)
        return [le.id for le in due]

    def lease_deadline(self, lease_id: int) -> float | None:
        """When (on the clock) the lease expires unless refreshed; None if unknown."""
        lease = self._leases.get(lease_id)
        return lease.expires_at if lease is not None else None

    def set_full(self, full: bool) -> None:
        """True: raise the NOSPACE alarm, as etcd does at its quota: puts, transactions
        that put and lease grants raise StoreFull; reads, deletes and compaction work.
        False: the operator freed space and disarmed the alarm."""
        self._full = full

    # ---- Store ---------------------------------------------------------------------

    async def get(self, key: str, *, revision: int = 0) -> KeyValue | None:
        self._check()
        if revision and revision != self._revision:
            return self._as_of(revision, key, exact=True).get(key)
        return self._kvs.get(key)

    async def get_prefix(self, prefix: str, *, page_size: int = 10_000, revision: int = 0) -> Page:
        """Consistent snapshot at one revision. Yields to the loop between pages, as the
        etcd adapter does, so concurrent writes interleave but are not seen."""
        if page_size < 1:
            raise StoreError(f"page_size must be at least 1, got {page_size}")
        self._check()
        if revision and revision != self._revision:
            then = self._as_of(revision, prefix, exact=False)
            snapshot = [then[k] for k in sorted(then)]
        else:
            revision = self._revision
            snapshot = [self._kvs[k] for k in self._keys_with_prefix(prefix)]
        for _ in range(page_size, len(snapshot), page_size):
            await asyncio.sleep(0)
            self._check()
        return Page(kvs=snapshot, revision=revision)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Unconditional write; returns the new revision. Not compare-and-set."""
        self._check()
        self._check_space()
        self._apply([Put(key, value, lease)])
        return self._revision

    async def delete(self, key: str) -> bool:
        """Unconditional delete; True if the key existed. Not compare-and-set."""
        self._check()
        existed = key in self._kvs
        self._apply([Delete(key)])
        return existed

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Compare-and-set: all compares hold → apply ``success``, else ``failure``."""
        self._check()
        if max(len(compares), len(success), len(failure)) > MAX_TXN_OPS:
            raise StoreError("too many operations in txn request")
        for branch in (success, failure):
            keys = [op.key for op in branch]
            if len(set(keys)) != len(keys):
                raise StoreError("duplicate key given in txn request")
        if any(isinstance(op, Put) for op in (*success, *failure)):
            self._check_space()  # etcd refuses a transaction that may write
        ok = all(_compare_holds(c, self._kvs.get(c.key)) for c in compares)
        self._apply(success if ok else failure)
        return TxnResult(succeeded=ok, revision=self._revision)

    async def create(self, key: str, value: bytes, *, lease: int = 0) -> bool:
        """Compare-and-set: write only if ``key`` is absent (create_revision == 0)."""
        result = await self.txn([Compare.absent(key)], [Put(key, value, lease)])
        return result.succeeded

    async def cas(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Compare-and-set on ``mod_revision`` (0 = the key must be absent)."""
        result = await self.txn([Compare.mod_revision(key, mod_revision)], [Put(key, value)])
        return result.succeeded

    async def grant_lease(self, ttl: int) -> int:
        if ttl < 1:
            raise StoreError(f"lease ttl must be at least 1 s, got {ttl}")
        self._check()
        self._check_space()
        lease_id = self._next_lease_id
        self._next_lease_id += 1
        self._leases[lease_id] = _Lease(lease_id, ttl, self._clock() + ttl)
        return lease_id

    async def refresh_lease(self, lease_id: int) -> int:
        self._check()
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseNotFound(f"lease {lease_id:#x} not found")
        lease.expires_at = self._clock() + lease.ttl
        return lease.ttl

    async def revoke_lease(self, lease_id: int) -> None:
        self._check()
        lease = self._leases.get(lease_id)
        if lease is not None:
            self._drop_lease(lease)

    async def compact(self, revision: int) -> None:
        """Forget history before ``revision``; older watch start revisions then fail."""
        self._check()
        if revision > self._revision:
            raise StoreError(
                f"compact {revision}: required revision is a future revision ({self._revision})"
            )
        self._compacted = max(self._compacted, revision)
        cut = bisect.bisect_left(self._history_revs, self._compacted)
        for ev in self._history[:cut]:
            _replay(self._base, ev)
        del self._history[:cut], self._history_revs[:cut]

    async def alarms(self) -> list[str]:
        self._check()
        return ["NOSPACE"] if self._full else []

    async def watch_prefix(
        self, prefix: str, *, start_revision: int = 0
    ) -> AsyncIterator[WatchEvent]:
        """Events under ``prefix`` from ``start_revision`` (inclusive; 0 = from the first
        iteration on). Raises StoreUnavailable when the store becomes unavailable, and
        StoreError when ``start_revision`` was compacted; ends when the store closes."""
        self._check()
        if 0 < start_revision < self._compacted:  # etcd keeps the compacted revision
            raise RevisionCompacted(f"required revision {start_revision} has been compacted")
        watcher = _Watcher(prefix, start_revision or self._revision + 1)
        first = bisect.bisect_left(self._history_revs, watcher.min_revision)
        for ev in self._history[first:]:
            if ev.kv.key.startswith(prefix):
                watcher.queue.put_nowait(ev)
        self._watchers.add(watcher)
        try:
            while True:
                item = await watcher.queue.get()
                if item is None:
                    return
                if isinstance(item, StoreError):
                    raise item
                yield item
        finally:
            self._watchers.discard(watcher)

    async def close(self) -> None:
        self._closed = True
        for w in list(self._watchers):
            w.queue.put_nowait(None)
        self._watchers.clear()

    # ---- internals -----------------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise StoreError("memory store is closed")
        if not self._available:
            raise StoreUnavailable("memory store: unavailable (simulated)")
        self.expire_leases()

    def _check_space(self) -> None:
        if self._full:
            raise StoreFull("memory store: database space exceeded (simulated NOSPACE)")

    def _as_of(self, revision: int, key: str, *, exact: bool) -> dict[str, KeyValue]:
        """The keys equal to ``key`` (``exact``) or under it as they were at ``revision``."""
        if revision > self._revision:
            raise StoreError(
                f"required revision {revision} is a future revision ({self._revision})"
            )
        if revision < self._compacted:
            raise RevisionCompacted(f"required revision {revision} has been compacted")

        def wanted(k: str) -> bool:
            return k == key if exact else k.startswith(key)

        then = {k: kv for k, kv in self._base.items() if wanted(k)}
        end = bisect.bisect_right(self._history_revs, revision)
        for ev in self._history[:end]:
            if wanted(ev.kv.key):
                _replay(then, ev)
        return then

    def _keys_with_prefix(self, prefix: str) -> list[str]:
        i = bisect.bisect_left(self._sorted, prefix)
        j = i
        while j < len(self._sorted) and self._sorted[j].startswith(prefix):
            j += 1
        return self._sorted[i:j]

    def _drop_lease(self, lease: _Lease) -> None:
        del self._leases[lease.id]
        self._apply([Delete(k) for k in sorted(lease.keys)])

    def _apply(self, ops: Sequence[Op]) -> None:
        """Apply ops at one new revision (none if nothing changes); the caller checked
        for duplicates. Unknown leases fail the whole batch before anything changes."""
        for op in ops:
            if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                raise LeaseNotFound(f"lease {op.lease:#x} not found")
        rev = self._revision + 1
        events: list[WatchEvent] = []
        for op in ops:
            old = self._kvs.get(op.key)
            if isinstance(op, Put):
                if old is None:
                    kv = KeyValue(op.key, op.value, rev, rev, 1, op.lease)
                    bisect.insort(self._sorted, op.key)
                else:
                    kv = replace(
                        old,
                        value=op.value,
                        mod_revision=rev,
                        version=old.version + 1,
                        lease=op.lease,
                    )
                self._move_lease(op.key, old.lease if old else 0, op.lease)
                self._kvs[op.key] = kv
                events.append(WatchEvent(EventType.PUT, kv))
            elif old is not None:
                del self._kvs[op.key]
                del self._sorted[bisect.bisect_left(self._sorted, op.key)]
                self._move_lease(op.key, old.lease, 0)
                events.append(WatchEvent(EventType.DELETE, KeyValue(op.key, b"", rev, 0, 0)))
        if not events:
            return
        self._revision = rev
        self._history.extend(events)
        self._history_revs.extend([rev] * len(events))
        for w in self._watchers:
            for ev in events:
                if ev.kv.key.startswith(w.prefix) and rev >= w.min_revision:
                    w.queue.put_nowait(ev)

    def _move_lease(self, key: str, old: int, new: int) -> None:
        if old and old in self._leases:
            self._leases[old].keys.discard(key)
        if new:
            self._leases[new].keys.add(key)


def _replay(kvs: dict[str, KeyValue], ev: WatchEvent) -> None:
    if ev.type is EventType.PUT:
        kvs[ev.kv.key] = ev.kv
    else:
        kvs.pop(ev.kv.key, None)
