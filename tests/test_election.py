"""LeaderElection: lease + txn on create_revision == 0, on real etcd and on MemoryStore."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import pytest

from chaos.lab.local_etcd import EtcdCluster
from controlplane.election import LeaderElection, NotLeader
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.memory import ManualClock, MemoryStore
from controlplane.kernel.store.port import Put
from controlplane.kernel.store.settings import EtcdConfig

LIVENESS_S = 10.0
TTL = 2


async def until(check: Callable[[], bool], what: str, within: float = LIVENESS_S) -> None:
    """Poll ``check`` (a property read) until true; fail after ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            while not check():  # noqa: ASYNC110 - polling a plain property is the point
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {within:g}s: {what}") from None


@contextlib.asynccontextmanager
async def running(*elections: LeaderElection) -> AsyncIterator[dict[str, asyncio.Task[None]]]:
    """Run elections in the background; yield their tasks by holder; cancel on exit."""
    tasks = {e.holder: asyncio.create_task(e.run(), name=e.holder) for e in elections}
    try:
        yield tasks
    finally:
        for t in tasks.values():
            t.cancel()
        for t in tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await t


def leaders(*elections: LeaderElection) -> list[str]:
    return [e.holder for e in elections if e.is_leader]


async def watch_never_two(*elections: LeaderElection, seconds: float) -> None:
    """Sample is_leader for a while; at most one may ever be True."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        assert len(leaders(*elections)) <= 1, leaders(*elections)
        await asyncio.sleep(0.01)


@pytest.mark.etcd
async def test_exactly_one_leader(etcd_store: EtcdStore, keys: Keys) -> None:
    a = LeaderElection(etcd_store, keys.leader(), "a", TTL)
    b = LeaderElection(etcd_store, keys.leader(), "b", TTL)
    async with running(a, b):
        await until(lambda: len(leaders(a, b)) == 1, "one leader")
        winner = leaders(a, b)[0]
        await watch_never_two(a, b, seconds=1.5)  # a few keep-alive rounds
        assert leaders(a, b) == [winner]
        assert await a.current_leader() == winner
        leader = a if winner == "a" else b
        kv = await etcd_store.get(keys.leader())
        assert kv is not None and kv.lease == leader.lease_id
        assert leader.leader_create_revision == kv.create_revision


@pytest.mark.etcd
async def test_fence_fails_after_leadership_moves(etcd_store: EtcdStore, keys: Keys) -> None:
    a = LeaderElection(etcd_store, keys.leader(), "a", TTL)
    async with running(a):
        await until(lambda: a.is_leader, "a leads")
        fence = a.fence()
        ok = await etcd_store.txn(fence, [Put(keys.control(), b"from a")])
        assert ok.succeeded
        b = LeaderElection(etcd_store, keys.leader(), "b", TTL)
        async with running(b):
            # Revoke a's lease behind its back (an operator, or an expiry a never saw).
            await etcd_store.revoke_lease(a.lease_id)
            await until(lambda: b.is_leader, "b takes over after the revoke", TTL + 2)
            await until(lambda: not a.is_leader, "a notices")
            stale = await etcd_store.txn(fence, [Put(keys.control(), b"stale a")])
            assert not stale.succeeded
            with pytest.raises(NotLeader):
                a.fence()
            assert (await etcd_store.txn(b.fence(), [Put(keys.control(), b"b")])).succeeded
            kv = await etcd_store.get(keys.control())
            assert kv is not None and kv.value == b"b"


@pytest.mark.etcd
async def test_takeover_after_leader_stops_without_revoking(
    etcd_store: EtcdStore, keys: Keys
) -> None:
    a = LeaderElection(etcd_store, keys.leader(), "a", TTL)
    b = LeaderElection(etcd_store, keys.leader(), "b", TTL)
    async with running(a) as tasks:
        await until(lambda: a.is_leader, "a leads")
        async with running(b):
            await asyncio.sleep(0.2)
            assert leaders(a, b) == ["a"]
            tasks["a"].cancel()  # a dies: its lease is left to expire on the server
            with contextlib.suppress(asyncio.CancelledError):
                await tasks["a"]
            assert not a.is_leader
            await until(lambda: b.is_leader, "b leads once a's lease expires", TTL + 2)
            assert await b.current_leader() == "b"


@pytest.mark.etcd
async def test_resign_hands_over_at_once(etcd_store: EtcdStore, keys: Keys) -> None:
    a = LeaderElection(etcd_store, keys.leader(), "a", 10)
    b = LeaderElection(etcd_store, keys.leader(), "b", 10)
    async with running(a):
        await until(lambda: a.is_leader, "a leads")
        async with running(b):
            changed = asyncio.create_task(b.wait_changed())
            await asyncio.sleep(0.1)
            await a.resign()
            assert not a.is_leader
            # Far sooner than the 10 s ttl: b was watching the key.
            await until(lambda: b.is_leader, "b leads after a resigns", 5)
            assert await asyncio.wait_for(changed, 1) is True
            await watch_never_two(a, b, seconds=0.3)


async def test_is_leader_drops_before_the_server_lease_can_expire(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    a = LeaderElection(store, "/leader", "a", TTL, clock=clock)
    caplog.set_level(logging.INFO, logger="tectonic.election")
    async with running(a):
        await until(lambda: a.is_leader, "a leads")
        lease = a.lease_id
        lost = asyncio.create_task(a.wait_changed())
        store.set_available(False)  # keep-alives fail from now on
        server_expiry = store.lease_deadline(lease)
        assert server_expiry is not None
        dropped_at = None
        while clock() < server_expiry + 1:
            clock.advance(0.05)
            await asyncio.sleep(0.001)
            if dropped_at is None and not a.is_leader:
                dropped_at = clock()
            if clock() >= server_expiry:
                assert not a.is_leader, "leader past the server-side lease expiry"
        assert dropped_at is not None and dropped_at < server_expiry
        with pytest.raises(NotLeader):
            a.fence()
        assert await asyncio.wait_for(lost, LIVENESS_S) is False
        assert "lost leadership of /leader: keepalive failed for" in caplog.text

        # The store comes back: the old lease has expired there, a campaigns anew.
        store.set_available(True)
        await until(lambda: a.is_leader, "a leads again")
        assert a.lease_id != lease
    await store.close()


async def test_leadership_survives_a_short_outage_on_memory() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    a = LeaderElection(store, "/leader", "a", 3, clock=clock)  # deadline: refresh + 2.4 s
    async with running(a):
        await until(lambda: a.is_leader, "a leads")
        created = a.leader_create_revision
        store.set_available(False)
        clock.advance(1.5)
        await asyncio.sleep(1.2)  # a keep-alive (due after 1 s) fails meanwhile
        assert a.is_leader
        store.set_available(True)
        await until(lambda: a.valid_for_s > 2.0, "a refreshed its lease after the outage")
        assert a.is_leader and a.leader_create_revision == created


async def test_two_candidates_on_memory_store(memory_store: MemoryStore) -> None:
    a = LeaderElection(memory_store, "/leader", "a", TTL)
    b = LeaderElection(memory_store, "/leader", "b", TTL)
    async with running(a, b):
        await until(lambda: len(leaders(a, b)) == 1, "one leader")
        await watch_never_two(a, b, seconds=0.5)


@pytest.mark.etcd
async def test_three_member_cluster_survives_losing_the_raft_leader() -> None:
    cluster = EtcdCluster(3)
    await asyncio.to_thread(cluster.start)
    config = EtcdConfig(endpoints=cluster.endpoints, request_timeout_s=1.0)
    stores = [EtcdStore(config), EtcdStore(config)]
    try:
        for s in stores:
            await s.connect()
        keys = Keys("cluster-test")
        a = LeaderElection(stores[0], keys.leader(), "a", 5)
        b = LeaderElection(stores[1], keys.leader(), "b", 5)
        async with running(a, b):
            await until(lambda: len(leaders(a, b)) == 1, "one leader")
            winner = leaders(a, b)[0]
            changes = 0

            async def count_changes(e: LeaderElection) -> None:
                nonlocal changes
                while True:
                    await e.wait_changed()
                    changes += 1

            async with asyncio.TaskGroup() as tg:
                counters = [tg.create_task(count_changes(e)) for e in (a, b)]
                raft_leader = cluster.leader_index()
                assert raft_leader is not None
                cluster.kill_member(raft_leader)
                # Writes go through (the adapter retries onto live members).
                assert await stores[0].put(keys.control(), b"after kill") > 0
                await watch_never_two(a, b, seconds=2.5)  # > one keep-alive period
                for c in counters:
                    c.cancel()
            assert changes == 0, "leadership moved although a quorum stayed up"
            assert leaders(a, b) == [winner]
            await asyncio.to_thread(cluster.restart_member, raft_leader)
            assert await stores[1].put(keys.control(), b"after restart") > 0
            assert await a.current_leader() == winner
    finally:
        for s in stores:
            await s.close()
        await asyncio.to_thread(cluster.stop)
