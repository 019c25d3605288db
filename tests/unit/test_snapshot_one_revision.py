"""A tick's snapshot is read at one revision: a write that lands between two of its
reads (here a failover's one transaction: the region's state and its routing) is in
none of them, so the leader never decides on half of one state and half of another."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings

from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import RegionRecord, RegionState, Routing
from controlplane.kernel.snapshot_reader import Decoded, read_snapshot
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import Page, Put
from tests.unit.world import topology

KEYS = Keys("t")
REGION = "us-east"


class WriteBetweenReads(MemoryStore):
    """Runs one transaction right after the first prefix read, as a concurrent writer
    whose write lands while a snapshot is being read."""

    def __init__(self, ops: list[Put]) -> None:
        super().__init__()
        self.pending = ops
        self.reads = 0

    async def get_prefix(self, prefix: str, *, page_size: int = 10_000, revision: int = 0) -> Page:
        page = await super().get_prefix(prefix, page_size=page_size, revision=revision)
        self.reads += 1
        if self.pending:
            ops, self.pending = self.pending, []
            await self.txn([], ops)
        return page


def failover_of(region: str) -> list[Put]:
    failing = RegionRecord(region=region, state=RegionState.FAILING_OVER, epoch=1, since=2.0)
    away = Routing(targets={"us-west": 1.0}, epoch=1)
    return [
        Put(KEYS.region_state(region), encode(failing)),
        Put(KEYS.routing(region), encode(away)),
    ]


async def test_a_write_between_two_reads_is_in_none_of_them() -> None:
    store = WriteBetweenReads(failover_of(REGION))
    normal = RegionRecord(region=REGION, state=RegionState.NORMAL, since=1.0)
    home = Routing(targets={REGION: 1.0}, epoch=0)
    before = await store.put(KEYS.region_state(REGION), encode(normal))
    await store.put(KEYS.routing(REGION), encode(home))

    snap = await read_snapshot(store, KEYS, topology(), now=3.0)

    assert store.reads > 1 and not store.pending  # the failover landed mid-read
    view = snap.regions[REGION]
    # read apart, the state would be NORMAL and the routing already away: both before
    assert view.record.state is RegionState.NORMAL and view.record_rev == before
    assert view.routing is not None and view.routing.targets == {REGION: 1.0}
    assert snap.revision == before + 1  # the revision it was read at, not the store's now
    assert store.revision == snap.revision + 1

    later = await read_snapshot(store, KEYS, topology(), now=4.0)  # the next tick sees both
    assert later.regions[REGION].record.state is RegionState.FAILING_OVER
    routing = later.regions[REGION].routing
    assert routing is not None and routing.targets == {"us-west": 1.0}


async def test_a_reader_parses_again_only_what_changed_since_its_last_read() -> None:
    store = MemoryStore()
    decoded = Decoded()
    normal = RegionRecord(region=REGION, state=RegionState.NORMAL, since=1.0)
    await store.put(KEYS.region_state(REGION), encode(normal))
    await store.put(KEYS.routing(REGION), encode(Routing(targets={REGION: 1.0}, epoch=0)))
    first = await read_snapshot(store, KEYS, topology(), now=2.0, decoded=decoded)

    away = Routing(targets={"us-west": 1.0}, epoch=1)
    await store.put(KEYS.routing(REGION), encode(away))
    second = await read_snapshot(store, KEYS, topology(), now=3.0, decoded=decoded)

    # unchanged: the same (frozen) value; changed: the new one, not the remembered one
    assert second.regions[REGION].record is first.regions[REGION].record
    assert second.regions[REGION].routing == away
    # a value rewritten with the same content at a new revision is parsed again
    await store.put(KEYS.region_state(REGION), encode(normal))
    third = await read_snapshot(store, KEYS, topology(), now=4.0, decoded=decoded)
    assert third.regions[REGION].record is not first.regions[REGION].record
    assert third.regions[REGION].record == normal
    # a corrupt value is absent as before, however often it is read
    await store.put(KEYS.routing(REGION), b"{not json")
    for now in (5.0, 6.0):
        snap = await read_snapshot(store, KEYS, topology(), now=now, decoded=decoded)
        assert snap.regions[REGION].routing is None


async def test_a_read_cancelled_before_its_pinned_reads_start_leaves_none_unawaited() -> None:
    """Cancelled once the first read is back and the pinned reads are handed out, but
    before any of them runs (a tick stopped, a leader stepping down): every read is
    still awaited or closed; Python's "coroutine ... was never awaited" warning, which
    failed whichever test the collector ran in, does not come."""
    store = MemoryStore()
    task = asyncio.ensure_future(read_snapshot(store, KEYS, topology(), now=3.0))
    await asyncio.sleep(0)  # the first read (MemoryStore answers at once) and the gather
    task.cancel()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with contextlib.suppress(asyncio.CancelledError):
            await task
        gc.collect()
    assert not [w for w in seen if "never awaited" in str(w.message)], seen
