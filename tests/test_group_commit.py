"""Group commit of agents' reports (controlplane/kernel/store/group_commit.py) on the
session's real etcd, and its failures on the memory store."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.group_commit import GroupCommit
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import MAX_TXN_OPS, StoreUnavailable


async def test_concurrent_puts_share_commits_and_all_land(
    etcd_store: EtcdStore, keys: Keys
) -> None:
    writes = GroupCommit(etcd_store)
    n = 300
    await asyncio.gather(*(writes.put(f"{keys.root}g/{i:04d}", b"%d" % i) for i in range(n)))
    page = await etcd_store.get_prefix(f"{keys.root}g/")
    assert {kv.key: kv.value for kv in page.kvs} == {
        f"{keys.root}g/{i:04d}": b"%d" % i for i in range(n)
    }
    # all arrived before the first commit: full batches of etcd's limit
    assert writes.commits == -(-n // MAX_TXN_OPS)


async def test_two_puts_of_one_key_in_a_batch_keep_the_later(
    etcd_store: EtcdStore, keys: Keys
) -> None:
    """etcd refuses a transaction naming a key twice: the batch keeps one, the newest."""
    writes = GroupCommit(etcd_store)
    key = f"{keys.root}g/one"
    await asyncio.gather(
        writes.put(key, b"old"),
        writes.put(key, b"new"),
        writes.put(f"{keys.root}g/other", b"y"),
    )
    kv = await etcd_store.get(key)
    assert kv is not None and kv.value == b"new"
    assert writes.commits == 1


async def test_a_failed_batch_fails_each_of_its_callers_and_the_next_one_commits() -> None:
    store = MemoryStore()
    writes = GroupCommit(store)
    store.set_available(False)
    results = await asyncio.gather(
        writes.put("a", b"1"), writes.put("b", b"2"), return_exceptions=True
    )
    assert all(isinstance(r, StoreUnavailable) for r in results)
    store.set_available(True)
    assert await store.get("a") is None  # nothing of the failed batch was written
    await writes.put("a", b"1")
    kv = await store.get("a")
    assert kv is not None and kv.value == b"1"


async def test_a_caller_that_gives_up_leaves_the_batch_to_commit() -> None:
    store = MemoryStore()
    writes = GroupCommit(store)
    first = asyncio.create_task(writes.put("a", b"1"))
    second = asyncio.create_task(writes.put("b", b"2"))
    await asyncio.sleep(0)
    second.cancel()
    await first
    with pytest.raises(asyncio.CancelledError):
        await second
    for _ in range(3):  # the batch it was in still commits
        await asyncio.sleep(0)
    kv = await store.get("b")
    assert kv is not None and kv.value == b"2"


def test_a_batch_limit_beyond_etcds_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        GroupCommit(MemoryStore(), limit=MAX_TXN_OPS + 1)
