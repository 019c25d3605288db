"""The local copy of a watched prefix (controlplane/kernel/watched.py) on the in-memory
store, which gives a transaction's writes one revision as etcd does: every key a
transaction writes reaches the copy through the watch, not at the next resync (the bug:
events at the copy's own revision were taken as already in, so a transaction's second
key waited up to ``resync_s``; two pool loans taken together, or two regions' routing
written in one transaction)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator

from chaos.lab.procs import until
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Frozen
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import Delete, EventType, Put, WatchEvent
from controlplane.kernel.watched import WatchedPrefix

KEYS = Keys(cluster="t")
PREFIX = KEYS.pool_loans_prefix("eu")


class Value(Frozen):
    n: int


@contextlib.asynccontextmanager
async def watching(store: MemoryStore) -> AsyncIterator[WatchedPrefix[Value]]:
    copy = WatchedPrefix(
        store,
        KEYS,
        PREFIX,
        Value,
        lambda _k, _v: None,
        log=logging.getLogger("test"),
        what="test",
        resync_s=3600.0,  # no resync heals a missed event within the test
    )
    task = asyncio.create_task(copy.run())
    try:
        await asyncio.wait_for(copy.loaded.wait(), 5)
        yield copy
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_every_key_a_transaction_writes_reaches_the_copy(
    memory_store: MemoryStore,
) -> None:
    async with watching(memory_store) as copy:
        puts = [Put(PREFIX + k, encode(Value(n=i))) for i, k in enumerate(("a", "b", "c"))]
        await memory_store.txn([], puts)

        async def all_in() -> bool:
            return dict(copy.values) == {"a": Value(n=0), "b": Value(n=1), "c": Value(n=2)}

        await until(all_in, within=5, what="the transaction's three keys in the copy")
        await memory_store.txn([], [Delete(PREFIX + "a"), Delete(PREFIX + "b")])

        async def both_gone() -> bool:
            return dict(copy.values) == {"c": Value(n=2)}

        await until(both_gone, within=5, what="both deleted keys gone from the copy")


async def test_an_event_at_or_below_the_reads_revision_is_already_in(
    memory_store: MemoryStore,
) -> None:
    await memory_store.put(PREFIX + "a", encode(Value(n=1)))
    async with watching(memory_store) as copy:
        read_at = copy.revision
        [kv] = (await memory_store.get_prefix(PREFIX)).kvs
        stale = dataclasses.replace(kv, value=encode(Value(n=9)))
        copy.apply(WatchEvent(EventType.PUT, stale))  # replayed: mod_revision <= read_at
        assert copy.values["a"] == Value(n=1) and copy.revision == read_at
