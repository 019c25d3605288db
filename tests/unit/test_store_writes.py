"""While the store refuses writes (etcd's NOSPACE), nothing pretends: the reconcile loop
notices (the store's alarms on every replica; a refused write on the leader), status
shows every region's state UNKNOWN with the stored one beside it, and metrics say so.
A real loop, orchestrator and status reads on the in-memory store's simulated alarm."""

from __future__ import annotations

import asyncio
import contextlib

from controlplane.api.reads import Reads
from controlplane.cluster import Cluster
from controlplane.core.store_writes import StoreWrites
from controlplane.election import LeaderElection
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import RegionState
from controlplane.kernel.store.memory import MemoryStore
from controlplane.loop import ReconcileLoop
from controlplane.metrics import ControlPlaneMetrics
from controlplane.orchestrator import Orchestrator
from controlplane.prewarm import NoPrefixData
from tests.unit.test_loop_tick_duration import Leadership
from tests.unit.world import topology

TOPO = topology()


def test_an_alarm_or_a_refused_tick_makes_the_store_unwritable_until_it_ends() -> None:
    w = StoreWrites()
    assert w.view().writable
    w.alarms_read(["NOSPACE"], 100.0)
    v = w.view()
    assert not v.writable and v.alarms == ("NOSPACE",) and v.since == 100.0
    assert "NOSPACE" in v.reason
    w.tick_completed(101.0)  # a tick with nothing to write proves nothing: the alarm holds
    assert not w.writable and w.view().since == 100.0
    w.alarms_read([], 102.0)
    assert w.writable and w.view().since == 0.0
    w.tick_failed("etcd txn: request is too large", 103.0)  # a refusal without an alarm
    assert not w.writable and "too large" in w.view().reason
    w.tick_completed(104.0)
    assert w.writable


def test_alarms_that_do_not_refuse_writes_are_not_counted() -> None:
    w = StoreWrites()
    w.alarms_read(["SOMETHING_NEW"], 1.0)
    assert w.writable


async def test_status_and_metrics_show_unknown_while_etcd_is_full(keys: Keys) -> None:
    store = MemoryStore()
    clock = FakeClock(1000.0)
    orchestrator = Orchestrator(Cluster(store, keys, TOPO, clock), list, NoPrefixData(), "cp-test")
    metrics = ControlPlaneMetrics(TOPO.names, TOPO)
    loop = ReconcileLoop(orchestrator, Leadership(True), observer=metrics)
    reads = Reads(store, keys, TOPO, clock, "cp", lambda: True, store_writes=loop.writes.view)
    await loop.tick_once()
    status = await reads.status()
    assert status.store.writable
    assert {r.state for r in status.regions} == {RegionState.NORMAL}

    store.set_full(True)
    await loop.tick_once()
    status = await reads.status()
    assert not status.store.writable and status.store.alarms == ("NOSPACE",)
    assert {r.state for r in status.regions} == {"UNKNOWN"}
    assert {r.stored_state for r in status.regions} == {RegionState.NORMAL}
    text = metrics.scrape(leader=True, writable=loop.writes.writable).decode()
    assert "tectonic_store_writable 0.0" in text
    for region in TOPO.names:
        assert f'tectonic_region_state{{region="{region}",state="UNKNOWN"}} 1.0' in text
        assert f'tectonic_region_state{{region="{region}",state="NORMAL"}} 0.0' in text

    store.set_full(False)  # the operator freed space and disarmed the alarm
    await loop.tick_once()
    status = await reads.status()
    assert status.store.writable
    assert {r.state for r in status.regions} == {RegionState.NORMAL}
    text = metrics.scrape(leader=True, writable=loop.writes.writable).decode()
    assert "tectonic_store_writable 1.0" in text
    assert f'tectonic_region_state{{region="{TOPO.names[0]}",state="UNKNOWN"}} 0.0' in text


async def test_a_follower_stays_up_while_etcd_is_full(keys: Keys) -> None:
    """Its campaign's transaction is refused (StoreFull) every round: it keeps trying
    instead of ending (which took the whole replica down), and leads once there is room
    again and the leader is gone."""
    store = MemoryStore()
    a = LeaderElection(store, keys.leader(), "cp-a", 2)
    b = LeaderElection(store, keys.leader(), "cp-b", 2)
    ta = asyncio.create_task(a.run())
    async with asyncio.timeout(5):
        while not a.is_leader:  # noqa: ASYNC110 - polling the election is the point
            await asyncio.sleep(0.01)
    store.set_full(True)
    tb = asyncio.create_task(b.run())
    await asyncio.sleep(1.2)  # more than one campaign round
    assert not tb.done() and not b.is_leader and a.is_leader
    store.set_full(False)
    ta.cancel()  # the old leader dies ...
    with contextlib.suppress(asyncio.CancelledError):
        await ta
    held = await store.get(keys.leader())
    assert held is not None and held.value == b"cp-a"
    await store.revoke_lease(held.lease)  # ... and its lease ends
    async with asyncio.timeout(10):
        while not b.is_leader:  # noqa: ASYNC110 - polling the election is the point
            await asyncio.sleep(0.05)
    tb.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await tb
