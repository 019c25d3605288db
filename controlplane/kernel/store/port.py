"""The one store port (docs/architecture.md §7.3). Adapters: ``EtcdStore`` and ``MemoryStore``.

Semantics follow etcd v3 exactly so that the in-memory adapter is a faithful
stand-in for unit tests:

* every successful write bumps one global revision; ``mod_revision`` is the
  revision of a key's last write, ``create_revision`` that of its creation
  (0 for an absent key), ``version`` the number of writes since creation;
* ``txn`` is the only compare-and-set primitive: all compares are evaluated
  atomically and either every ``success`` op or every ``failure`` op is applied;
  ``create`` and ``cas`` are conveniences built on it;
* a key attached to a lease is deleted when the lease expires or is revoked.

Errors: ``StoreUnavailable`` is temporary (retry within a deadline);
``LeaseNotFound`` and ``StoreError`` are permanent for the call; ``StoreFull`` says the
store refuses every write until an operator frees space (etcd's NOSPACE alarm).

History: every write keeps the old value as a revision until ``compact`` drops those
before a revision; a watch that would start at a compacted revision fails with
StoreError, and its owner re-reads (relists) and watches again from the read's revision.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class StoreError(Exception):
    """A permanent store failure (bad request, too many ops, ...)."""


class StoreUnavailable(StoreError):
    """The store could not be reached in time; temporary, safe to retry."""


class LeaseNotFound(StoreError):
    """The lease expired or was revoked."""


class RevisionCompacted(StoreError):
    """A read or watch asked for a revision the store's history no longer holds
    (compacted away). Its owner starts again from the current revision."""


class StoreFull(StoreError):
    """The store refuses writes: its database reached its quota (etcd raises the NOSPACE
    alarm). Reads, deletes and compaction still work; writes fail until an operator
    compacts, defragments and disarms the alarm (runbooks/etcd-space.md)."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    version: int
    lease: int = 0


class CompareTarget(StrEnum):
    VALUE = "value"
    MOD = "mod_revision"
    CREATE = "create_revision"
    VERSION = "version"


class CompareOp(StrEnum):
    EQ = "=="
    NE = "!="
    LT = "<"
    GT = ">"


@dataclass(frozen=True)
class Compare:
    key: str
    target: CompareTarget
    op: CompareOp
    value: int | bytes

    @classmethod
    def absent(cls, key: str) -> Compare:
        return cls(key, CompareTarget.CREATE, CompareOp.EQ, 0)

    @classmethod
    def mod_revision(cls, key: str, revision: int) -> Compare:
        """``revision == 0`` means the key must be absent."""
        return cls(key, CompareTarget.MOD, CompareOp.EQ, revision)

    @classmethod
    def created_at(cls, key: str, revision: int) -> Compare:
        return cls(key, CompareTarget.CREATE, CompareOp.EQ, revision)

    @classmethod
    def value_is(cls, key: str, value: bytes) -> Compare:
        return cls(key, CompareTarget.VALUE, CompareOp.EQ, value)


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: str


Op = Put | Delete


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int


class EventType(StrEnum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True)
class WatchEvent:
    type: EventType
    kv: KeyValue  # for DELETE, value is b"" and mod_revision is the delete's revision


@dataclass(frozen=True)
class Page:
    kvs: list[KeyValue] = field(default_factory=list)
    revision: int = 0


MAX_TXN_OPS = 128  # etcd's default --max-txn-ops


class Store(Protocol):
    """Key-value store with etcd v3 semantics. All methods may raise StoreUnavailable."""

    async def get(self, key: str, *, revision: int = 0) -> KeyValue | None:
        """Read one key (linearizable); at ``revision`` if given (0: the latest), as it
        was then. A compacted revision raises RevisionCompacted; a future one StoreError."""
        ...

    async def get_prefix(self, prefix: str, *, page_size: int = 10_000, revision: int = 0) -> Page:
        """All keys under ``prefix`` in key order, read in pages of ``page_size`` at one
        revision (the first page's, or ``revision`` if given), so the result is a
        consistent snapshot; ``Page.revision`` is the revision read. Several reads pinned
        to the first one's revision make one snapshot of several prefixes."""
        ...

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Unconditional write; returns the new revision. Not compare-and-set."""
        ...

    async def delete(self, key: str) -> bool:
        """Unconditional delete; True if the key existed. Not compare-and-set."""
        ...

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Compare-and-set: atomically apply ``success`` if every compare holds, else
        ``failure``. At most MAX_TXN_OPS ops per branch (StoreError beyond)."""
        ...

    async def create(self, key: str, value: bytes, *, lease: int = 0) -> bool:
        """Compare-and-set: write only if the key is absent. True if written."""
        ...

    async def cas(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Compare-and-set on mod_revision (0 = absent). True if written."""
        ...

    async def grant_lease(self, ttl: int) -> int:
        """A new lease of ``ttl`` whole seconds; returns its id."""
        ...

    async def refresh_lease(self, lease_id: int) -> int:
        """One keep-alive; returns the remaining TTL. Raises LeaseNotFound if expired."""
        ...

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease, deleting its keys. Unknown leases are ignored."""
        ...

    async def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (keys keep their latest values). A
        revision already compacted is a no-op; one past the current revision is a
        StoreError. Watches that would start before it then fail with StoreError."""
        ...

    async def alarms(self) -> list[str]:
        """The store's raised alarms, by name (etcd's ``NOSPACE``, ``CORRUPT``), sorted
        and without repeats; empty when none is raised."""
        ...

    def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Events under ``prefix`` after ``start_revision`` (0 = from now), until the
        iterator is closed. Raises StoreUnavailable when the stream breaks."""
        ...

    async def close(self) -> None: ...
