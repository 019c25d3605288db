"""The Store contract's watches and history, run against MemoryStore and a real etcd
(EtcdStore), as tests/test_store_contract.py is: a watch replays from a revision, goes
on live and resumes; compaction keeps the latest values and fails watches from before
it; reads at a revision see the keys as they were then; a watch ends when its store
closes.
"""

from __future__ import annotations

import asyncio

import pytest

from controlplane.kernel.store.port import (
    Delete,
    EventType,
    RevisionCompacted,
    StoreError,
    StoreUnavailable,
)
from tests.store_contract_helpers import (  # noqa: F401 - fixtures h, *_harness: found by name
    LIVENESS_S,
    Harness,
    etcd_harness,
    fixture_h,
    memory_harness,
    next_events,
)

# ---- watches -----------------------------------------------------------------------


async def test_watch_sees_puts_and_deletes_in_order_and_resumes(h: Harness) -> None:
    a, b = h.k("w/a"), h.k("w/b")
    r1 = await h.store.put(a, b"1")
    r2 = await h.store.put(b, b"2")
    await h.store.put(h.k("elsewhere"), b"not watched")
    r3 = await h.store.txn([], [Delete(a)])
    events = h.store.watch_prefix(h.k("w/"), start_revision=r1)
    got = await next_events(events, 3)
    assert [(e.type, e.kv.key, e.kv.mod_revision) for e in got] == [
        (EventType.PUT, a, r1),
        (EventType.PUT, b, r2),
        (EventType.DELETE, a, r3.revision),
    ]
    assert got[0].kv.value == b"1" and got[2].kv.value == b""
    # Live events follow the replay on the same stream.
    r4 = await h.store.put(b, b"3")
    (live,) = await next_events(events, 1)
    assert (live.type, live.kv.key, live.kv.value, live.kv.version) == (EventType.PUT, b, b"3", 2)
    assert live.kv.mod_revision == r4
    await events.aclose()  # type: ignore[attr-defined]

    # A caller that saw up to r2 resumes from r2 + 1 and misses nothing.
    resumed = h.store.watch_prefix(h.k("w/"), start_revision=r2 + 1)
    got = await next_events(resumed, 2)
    assert [(e.type, e.kv.mod_revision) for e in got] == [
        (EventType.DELETE, r3.revision),
        (EventType.PUT, r4),
    ]
    await resumed.aclose()  # type: ignore[attr-defined]


async def test_compaction_keeps_values_and_fails_watches_from_before_it(h: Harness) -> None:
    """After ``compact(r)`` every key keeps its latest value, a watch from r or later
    works, one from before r fails with StoreError (its owner relists), compacting
    again at or below r changes nothing and a future revision is refused."""
    a, b = h.k("c/a"), h.k("c/b")
    r1 = await h.store.put(a, b"1")
    r2 = await h.store.put(a, b"2")
    r3 = await h.store.put(b, b"3")
    await h.store.compact(r2)
    page = await h.store.get_prefix(h.k("c/"))
    assert [(kv.key, kv.value) for kv in page.kvs] == [(a, b"2"), (b, b"3")]
    old = h.store.watch_prefix(h.k("c/"), start_revision=r1)
    with pytest.raises(StoreError) as err:
        await next_events(old, 1)
    assert not isinstance(err.value, StoreUnavailable)  # permanent: relist, not retry
    kept = h.store.watch_prefix(h.k("c/"), start_revision=r2)
    got = await next_events(kept, 2)
    assert [(e.kv.key, e.kv.mod_revision) for e in got] == [(a, r2), (b, r3)]
    await kept.aclose()  # type: ignore[attr-defined]
    await h.store.compact(r1)  # already compacted past it: a no-op
    await h.store.compact(r2)
    with pytest.raises(StoreError):
        await h.store.compact(r3 + 1_000_000)


async def test_reads_at_a_revision_see_the_keys_as_they_were_then(h: Harness) -> None:
    """``get`` and ``get_prefix`` at a revision: the keys as they were at it (a later
    put, delete and new key unseen), ``Page.revision`` the one asked for; a revision
    compacted away raises RevisionCompacted, a future one StoreError."""
    a, b, c = h.k("v/a"), h.k("v/b"), h.k("v/c")
    await h.store.put(a, b"a1")
    r1 = await h.store.put(b, b"b1")
    r2 = await h.store.put(a, b"a2")
    await h.store.delete(b)
    await h.store.put(c, b"c1")
    then = await h.store.get_prefix(h.k("v/"), revision=r1, page_size=1)
    assert [(kv.key, kv.value) for kv in then.kvs] == [(a, b"a1"), (b, b"b1")]
    assert then.revision == r1
    got = await h.store.get(a, revision=r1)
    assert got is not None and (got.value, got.mod_revision, got.version) == (b"a1", r1 - 1, 1)
    assert await h.store.get(c, revision=r2) is None  # created later
    now = await h.store.get_prefix(h.k("v/"))
    assert [(kv.key, kv.value) for kv in now.kvs] == [(a, b"a2"), (c, b"c1")]
    await h.store.compact(r2)
    at = await h.store.get_prefix(h.k("v/"), revision=r2)  # the compacted one is kept
    assert [(kv.key, kv.value) for kv in at.kvs] == [(a, b"a2"), (b, b"b1")]
    with pytest.raises(RevisionCompacted):
        await h.store.get_prefix(h.k("v/"), revision=r1)
    with pytest.raises(RevisionCompacted):
        await h.store.get(a, revision=r1)
    with pytest.raises(StoreError):
        await h.store.get(a, revision=now.revision + 1_000_000)


async def test_watch_ends_when_store_closes(h: Harness) -> None:
    rev = await h.store.put(h.k("x"), b"1")
    events = h.store.watch_prefix(h.prefix, start_revision=rev)
    await next_events(events, 1)
    pending = asyncio.create_task(next_events(events, 1))
    await asyncio.sleep(0.1)
    await h.store.close()
    with pytest.raises(StopAsyncIteration):
        async with asyncio.timeout(LIVENESS_S):
            await pending
