"""Every watch in Tectonic that starts from a revision relists when etcd answers that the
revision was compacted (docs/etcd.md, "Compaction"), on a real etcd.

The leader compacts etcd's history to the revision it had ``etcd.compact_retention_s``
ago; a watcher further behind than that gets etcd's "compacted" answer when it watches
again. ``CompactsFirst`` makes that happen on purpose: before the first watch that
starts from a revision under its prefix, it writes what the watcher must still learn
(``gap``), then compacts etcd past it, so the watch starts at a compacted revision.
Each watcher must then re-read (relist) and see the gap's write.

Watches that start "from now" (revision 0: the reconcile loop's wake-up hints, the drill
requests, the election's vacancy wait) cannot start at a compacted revision; an
established watch that etcd cancels for compaction raises the same StoreError, which
each of them catches and watches again (tests/unit/test_loop_watch_breaks.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from controlplane.api.reads import Reads
from controlplane.election import LeaderElection
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.cluster_spec import SpecDisagreement, cluster_spec
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditAction, AuditEntry, Routing
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import StoreError, StoreUnavailable, WatchEvent
from regions.dataplane.routing_cache import RoutingCache
from regions.dataplane.spec_watch import SpecWatch
from tests.unit.world import topology

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(60)]
LIVENESS_S = 15.0


class CompactsFirst:
    """A real EtcdStore whose first watch from a revision under ``prefix`` starts after
    ``gap`` was written and etcd was compacted past it. ``compacted`` counts the watches
    etcd refused for that (the StoreError each watcher must handle)."""

    def __init__(self, store: EtcdStore, prefix: str, gap: Callable[[], Awaitable[None]]):
        self._store, self._prefix, self._gap = store, prefix, gap
        self._done = False
        self.compacted = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def watch_prefix(
        self, prefix: str, *, start_revision: int = 0
    ) -> AsyncIterator[WatchEvent]:
        if start_revision and prefix.startswith(self._prefix) and not self._done:
            self._done = True
            await self._gap()
            # etcd keeps the compacted revision itself: compact one write past the gap.
            await self._store.compact(await self._store.put(f"/compacts-first{prefix}", b"x"))
        try:
            async for ev in self._store.watch_prefix(prefix, start_revision=start_revision):
                yield ev
        except StoreError as e:
            if not isinstance(e, StoreUnavailable) and "compacted" in str(e):
                self.compacted += 1
            raise


async def eventually(check: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(LIVENESS_S):
        while not check():  # noqa: ASYNC110 - polling a watcher's copy is the point
            await asyncio.sleep(0.05)
    assert check(), what


@contextlib.asynccontextmanager
async def running(coro: Awaitable[Any]) -> AsyncIterator[asyncio.Task[Any]]:
    task: asyncio.Task[Any] = asyncio.ensure_future(coro)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def test_a_watched_prefix_relists(etcd_store: EtcdStore, keys: Keys) -> None:
    """The gateway's and the picker's routing, pools, degradation and capacity copies."""
    await etcd_store.put(keys.routing("us-east"), encode(Routing(targets={"us-east": 1.0})))
    moved = Routing(targets={"us-west": 1.0}, epoch=1)

    async def gap() -> None:
        await etcd_store.put(keys.routing("us-east"), encode(moved))

    store = CompactsFirst(etcd_store, keys.root, gap)
    routing = RoutingCache(store, keys, retry_s=0.05, max_retry_s=0.1)
    async with running(routing.run()):
        await eventually(lambda: routing.routings.get("us-east") == moved, "relisted")
    assert store.compacted == 1


async def test_the_gateways_spec_watch_relists(etcd_store: EtcdStore, keys: Keys) -> None:
    mine = cluster_spec(topology())
    await etcd_store.put(keys.spec(), encode(mine))
    other = mine.model_copy(
        update={"prefixes": mine.prefixes.model_copy(update={"min_sessions": 9})}
    )

    async def gap() -> None:
        await etcd_store.put(keys.spec(), encode(other))

    store = CompactsFirst(etcd_store, keys.root, gap)
    watch = SpecWatch(store, keys, mine, ["prefixes"], retry_s=0.05, max_retry_s=0.1)
    with pytest.raises(SpecDisagreement):
        async with asyncio.timeout(LIVENESS_S):
            await watch.run()
    assert store.compacted == 1


async def test_the_audit_event_stream_relists_without_gap_or_repeat(
    etcd_store: EtcdStore, keys: Keys
) -> None:
    """failoverctl watch, GET /v1/events and StreamEvents: one entry before the stream,
    one in the compacted gap, one after; each is sent once, in order."""

    def entry(reason: str) -> bytes:
        return encode(AuditEntry(at=1.0, actor="t", action=AuditAction.TRANSITION, reason=reason))

    await etcd_store.put(keys.audit("0001-t-1"), entry("before"))

    async def gap() -> None:
        await etcd_store.put(keys.audit("0002-t-2"), entry("in the gap"))

    store = CompactsFirst(etcd_store, keys.root, gap)
    t = topology()
    reads = Reads(store, keys, t, FakeClock(), "cp", lambda: True)
    stream = reads.events(replay=1)
    got: list[str] = []
    async with asyncio.timeout(LIVENESS_S):
        got.append((await anext(stream)).entry.reason)
        got.append((await anext(stream)).entry.reason)
        await etcd_store.put(keys.audit("0003-t-3"), entry("after"))
        got.append((await anext(stream)).entry.reason)
    await stream.aclose()
    assert got == ["before", "in the gap", "after"]
    assert store.compacted == 1


async def test_the_leaders_watch_of_its_key_relists(etcd_store: EtcdStore, keys: Keys) -> None:
    """The leader watches its own key from the revision it wrote; when that revision was
    compacted it reads the key instead, and sees it was replaced while unwatched."""
    election: LeaderElection | None = None

    async def gap() -> None:  # someone replaced the key (an operator's etcdctl, say)
        await etcd_store.delete(keys.leader())
        await etcd_store.put(keys.leader(), b"someone-else")

    store = CompactsFirst(etcd_store, keys.leader(), gap)
    election = LeaderElection(store, keys.leader(), "cp-a", 5)
    async with running(election.run()):
        await eventually(lambda: store.compacted == 1, "the key's watch started compacted")
        await eventually(lambda: not election.is_leader, "leadership given up")
