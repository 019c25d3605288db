"""The Store contract under outages: a store that cannot be reached raises
StoreUnavailable (retryable, never a permanent error) from calls and watches, and is
usable again once it is back. MemoryStore made unavailable; a real etcd killed and
restarted; a member cut off from its quorum. The suite on both adapters:
tests/test_store_contract.py.
"""

from __future__ import annotations

import asyncio

import pytest

from chaos.lab.local_etcd import EtcdCluster, EtcdServer
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.memory import ManualClock, MemoryStore
from controlplane.kernel.store.port import StoreUnavailable
from controlplane.kernel.store.settings import EtcdConfig
from tests.store_contract_helpers import eventually, next_events

# ---- outages -----------------------------------------------------------------------


async def test_memory_outage_breaks_calls_and_watches() -> None:
    store = MemoryStore(clock=ManualClock())
    rev = await store.put("/k", b"1")
    events = store.watch_prefix("/", start_revision=rev)
    await next_events(events, 1)
    store.set_available(False)
    with pytest.raises(StoreUnavailable):
        await next_events(events, 1)
    with pytest.raises(StoreUnavailable):
        await store.get("/k")
    store.set_available(True)
    assert await store.get("/k") is not None


@pytest.mark.etcd
async def test_etcd_outage_is_unavailable_then_recovers() -> None:
    server = EtcdServer()
    await asyncio.to_thread(server.start)
    store = EtcdStore(EtcdConfig(endpoints=server.endpoints, request_timeout_s=0.3))
    try:
        await store.connect()
        rev = await store.put("/k", b"1")
        events = store.watch_prefix("/", start_revision=rev)
        await next_events(events, 1)
        server.kill()
        with pytest.raises(StoreUnavailable):
            await next_events(events, 1)
        with pytest.raises(StoreUnavailable):  # after bounded retries (2 x 0.3 s)
            await store.get("/k")
        with pytest.raises(StoreUnavailable):
            await store.create("/new", b"1")
        # Cancellation goes through the retry loop untouched.
        blocked = asyncio.create_task(store.get("/k"))
        await asyncio.sleep(0.1)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        await asyncio.to_thread(server.restart)

        async def back() -> bool:
            try:
                return await store.get("/k") is not None
            except StoreUnavailable:
                return False

        await eventually(back, "store usable again after etcd restarts")
    finally:
        await store.close()
        await asyncio.to_thread(server.stop)


@pytest.mark.etcd
async def test_etcd_member_without_quorum_is_unavailable() -> None:
    """A member cut off from the quorum ends watches (etcd's require-leader) and times
    out writes: both must read as StoreUnavailable, not as permanent errors."""
    cluster = EtcdCluster(3)
    await asyncio.to_thread(cluster.start)
    store = EtcdStore(EtcdConfig(endpoints=cluster.endpoints[:1], request_timeout_s=0.3))
    try:
        rev = await store.put("/k", b"1")
        events = store.watch_prefix("/", start_revision=rev)
        await next_events(events, 1)
        cluster.kill_member(1)
        cluster.kill_member(2)
        with pytest.raises(StoreUnavailable):
            await next_events(events, 1)
        with pytest.raises(StoreUnavailable):
            await store.put("/k", b"2")
        with pytest.raises(StoreUnavailable):
            await store.cas("/k", b"3", rev)
    finally:
        await store.close()
        await asyncio.to_thread(cluster.stop)
