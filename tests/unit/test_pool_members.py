"""``pools/<region>`` on the in-memory store: the agent side publishes in the background
and keeps retrying while the store is down; the gateway side reads, then watches, and
calls back once per region whose members changed."""

from __future__ import annotations

import asyncio
import contextlib

from chaos.lab.procs import until
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.store.memory import MemoryStore
from regions.agent.pool_config import AgentPoolConfig
from regions.agent.warm_pool import AgentPool, PoolPublishing
from regions.dataplane.pool_cache import PoolCache
from regions.pool.processes import free_port

KEYS = Keys("unit")


def members(region: str, *active: str, warm: int = 0) -> PoolMembers:
    return PoolMembers(region=region, active=active, warm=warm, at=1.0, agent=f"agent:{region}")


async def test_agent_pool_publishes_in_the_background_while_the_store_is_down(
    memory_store: MemoryStore,
) -> None:
    # A static endpoint nobody serves: the pool starts at once, with nothing ACTIVE.
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    config = AgentPoolConfig.model_validate(
        {"launcher": {"kind": "static", "urls": [url]}, "active": 1, "warm": 0}
    )
    pool = AgentPool(
        "eu", config, PoolPublishing("unit", memory_store, retry_s=0.01), interval_s=0.05
    )
    memory_store.set_available(False)
    await pool.start("agent:eu@test")
    assert pool.active() == [] and pool.signals() == {"replicas_warm": 0.0, "pool_shortfall": 1.0}
    task = asyncio.create_task(pool.run())
    try:
        await asyncio.sleep(0.1)  # a few failed tries: nothing published, nothing raised
        assert pool.published is None and not task.done()
        memory_store.set_available(True)

        async def published() -> bool:
            return await memory_store.get(KEYS.pool("eu")) is not None

        await until(published, within=10, what="the publish after the store came back")
        kv = await memory_store.get(KEYS.pool("eu"))
        assert kv is not None and kv.lease == 0  # the replicas outlive the agent
        value = decode(PoolMembers, kv.value)
        assert (value.active, value.warm, value.agent) == ((), 0, "agent:eu@test")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await pool.stop()
    assert await memory_store.get(KEYS.pool("eu")) is not None  # static: left as it was


async def test_pool_cache_reads_then_watches_and_reports_each_change_once(
    memory_store: MemoryStore,
) -> None:
    await memory_store.put(KEYS.pool("eu"), encode(members("eu", "http://a:1")))
    seen: list[tuple[str, PoolMembers | None]] = []
    cache = PoolCache(memory_store, KEYS, lambda r, m: seen.append((r, m)), retry_s=0.01)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.loaded.wait(), 5)
        assert seen == [("eu", members("eu", "http://a:1"))]

        await memory_store.put(KEYS.pool("us"), encode(members("us", "http://b:1", "http://c:1")))
        await memory_store.put(KEYS.pool("eu"), b"{not json")  # ignored: last good value kept
        await memory_store.delete(KEYS.pool("eu"))

        async def caught_up() -> bool:
            return cache.revision == memory_store.revision

        await until(caught_up, within=5, what="the watch catching up")
        assert seen[1:] == [("us", members("us", "http://b:1", "http://c:1")), ("eu", None)]
        assert dict(cache.members) == {"us": members("us", "http://b:1", "http://c:1")}

        async def connected() -> bool:
            return cache.connected

        async def disconnected() -> bool:
            return not cache.connected

        memory_store.set_available(False)  # fail-static: members kept while etcd is away
        await until(disconnected, within=5, what="the watch breaking")
        assert "us" in cache.members
        memory_store.set_available(True)
        await until(connected, within=5, what="the re-read")
        assert len(seen) == 3  # a re-read of unchanged values calls back for nothing
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
