"""The gateway's session resolver (regions.dataplane.sessions): an LRU of pins in front
of the real SessionStore on a MemoryStore, with routing from the real RoutingCache.
``set_available(False)`` on the store plays an etcd outage."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter as Tally
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.resolve import NoRegionServing, pick_region
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import KeyValue
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.routing_cache import RoutingCache
from regions.dataplane.sessions import SessionResolver

REGIONS = ("us-east", "us-west", "eu-west")
HOME = "us-east"
NORMAL = {r: Routing(targets={r: 1.0}) for r in REGIONS}
EAST_DOWN = {**NORMAL, HOME: Routing(targets={"us-west": 1.0}, epoch=1)}
T0 = 60.0 * 20_000


class CountingStore(MemoryStore):
    """A MemoryStore that counts reads per key and yields to the loop before each, as
    a network round trip would (so that concurrent callers really overlap)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock.now)
        self.reads: Tally[str] = Tally()

    async def get(self, key: str, *, revision: int = 0) -> KeyValue | None:
        self.reads[key] += 1
        await asyncio.sleep(0)
        return await super().get(key, revision=revision)


class World:
    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.clock = FakeClock(T0)
        self.mono = FakeClock(0.0)  # the resolver's monotonic time
        self.store = CountingStore(self.clock)
        self.sessions = SessionStore(
            self.store, keys, regions=REGIONS, clock=self.clock, writer="gw-test"
        )
        self.routing = RoutingCache(self.store, keys, retry_s=0.01, max_retry_s=0.02)
        self.metrics = DataPlaneMetrics()

    def resolver(self, *, max_pins: int = 1000, revalidate_s: float = 300.0) -> SessionResolver:
        return SessionResolver(
            self.sessions,
            self.routing,
            HOME,
            self.metrics,
            max_pins=max_pins,
            revalidate_s=revalidate_s,
            probe_every_s=0.01,
            clock=self.clock,
            monotonic=self.mono.now,
        )

    async def set_routing(self, routings: dict[str, Routing]) -> None:
        for region, routing in routings.items():
            await self.store.put(self.keys.routing(region), encode(routing))
        await self.routing.load()

    def reads(self, session_id: str) -> int:
        return self.store.reads[self.keys.session(session_id)]

    def metric(self, name: str) -> float:
        value = self.metrics.registry.get_sample_value(name)
        assert value is not None, name
        return value

    @property
    def moves(self) -> float:
        return self.metric("tectonic_gateway_session_moves_total")

    @property
    def fail_static(self) -> float:
        return self.metric("tectonic_gateway_fail_static_total")


@pytest.fixture
async def world(keys: Keys) -> World:
    w = World(keys)
    await w.set_routing(NORMAL)
    return w


@contextlib.asynccontextmanager
async def running(coro: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """A background loop (``resolver.run()``, ``routing.run()``) for the block's time."""
    task = asyncio.create_task(coro)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - polling plain properties is the point
            await asyncio.sleep(0.005)


# ---- the LRU in front of the store ----------------------------------------------------------


async def test_a_new_session_is_pinned_in_the_store_then_served_from_the_cache(
    world: World,
) -> None:
    r = world.resolver()
    assert await r.region_for("chat-1") == HOME
    for _ in range(5):
        assert await r.region_for("chat-1") == HOME
    assert world.reads("chat-1") == 1  # no I/O on a cached pin
    stored = await world.sessions.get("chat-1")
    assert stored is not None and stored[0].region == HOME and stored[0].home == HOME
    assert r.cached("chat-1") == stored[0]


async def test_the_cache_is_a_bounded_lru(world: World) -> None:
    r = world.resolver(max_pins=2)
    for sid in ("a", "b"):
        await r.region_for(sid)
    await r.region_for("a")  # a is now the most recently used
    await r.region_for("c")  # evicts b, the least recently used
    assert r.cached("b") is None and r.cached("a") is not None and r.cached("c") is not None
    assert world.reads("a") == 1
    assert await r.region_for("b") == HOME  # back from the store, where it still is
    assert world.reads("b") == 2 and r.cached("a") is None


async def test_a_pin_is_confirmed_by_the_store_every_revalidate_s(world: World) -> None:
    r = world.resolver(revalidate_s=10)
    await r.region_for("s")
    world.mono.advance(9)
    await r.region_for("s")
    assert world.reads("s") == 1
    world.mono.advance(2)
    await r.region_for("s")
    assert world.reads("s") == 2


async def test_a_pin_whose_region_stops_serving_is_moved_via_the_store(world: World) -> None:
    r = world.resolver()
    assert await r.region_for("s") == HOME
    await world.set_routing(EAST_DOWN)
    assert await r.region_for("s") == "us-west"
    stored = await world.sessions.get("s")
    assert stored is not None and stored[0].region == "us-west" and stored[0].moves == 1
    assert world.moves == 1


async def test_concurrent_requests_of_one_session_share_one_store_call(world: World) -> None:
    r = world.resolver()
    regions = await asyncio.gather(*(r.region_for("busy") for _ in range(20)))
    assert set(regions) == {HOME}
    assert world.reads("busy") == 1
    # While etcd is down, too: one fail-static resolution for all of them.
    world.store.set_available(False)
    regions = await asyncio.gather(*(r.region_for("new") for _ in range(20)))
    assert set(regions) == {HOME}
    assert world.reads("new") == 1 and world.fail_static == 1 and r.pending == 1


# ---- fail-static and reconciliation --------------------------------------------------------


async def test_fail_static_serves_cached_and_new_sessions_while_the_store_is_down(
    world: World,
) -> None:
    r = world.resolver(revalidate_s=10)
    await world.set_routing({**NORMAL, HOME: Routing(targets={HOME: 0.5, "eu-west": 0.5})})
    region = await r.region_for("known")
    assert region in (HOME, "eu-west")
    world.store.set_available(False)
    world.mono.advance(60)  # due for revalidation, but the store is down
    assert await r.region_for("known") == region
    assert not r.store_up and world.metric("tectonic_gateway_store_up") == 0
    new = [f"new-{i}" for i in range(10)]
    for sid in new:  # the same deterministic choice every gateway makes
        assert await r.region_for(sid) == pick_region(world.routing.routings, HOME, sid)
    assert r.pending == 10 and world.metric("tectonic_gateway_pending_pins") == 10
    assert all(world.reads(sid) == 0 for sid in new)  # the store is not asked while down
    assert {pick_region(world.routing.routings, HOME, sid) for sid in new} == {HOME, "eu-west"}
    world.store.set_available(True)
    for sid in new:  # nothing was written while down
        assert await world.sessions.get(sid) is None


async def test_pending_pins_are_written_when_the_store_returns(world: World) -> None:
    r = world.resolver()
    world.store.set_available(False)
    assert await r.region_for("s1") == HOME
    assert await r.region_for("s2") == HOME
    assert await r.reconcile() == 0  # still down: nothing settled, nothing lost
    assert r.pending == 2
    world.store.set_available(True)
    assert await r.reconcile() == 2
    assert r.pending == 0 and world.metric("tectonic_gateway_pending_pins") == 0
    for sid in ("s1", "s2"):
        stored = await world.sessions.get(sid)
        assert stored is not None and stored[0].region == HOME
        assert r.cached(sid) == stored[0]
    assert world.moves == 0


async def test_reconciliation_adopts_the_stores_answer_and_counts_a_move(world: World) -> None:
    other = SessionStore(world.store, world.keys, regions=REGIONS, clock=world.clock)
    await other.pin("s", "eu-west", home=HOME, actor="ops", reason="test")  # elsewhere
    r = world.resolver()
    world.store.set_available(False)
    assert await r.region_for("s") == HOME  # this gateway never saw the pin
    world.store.set_available(True)
    assert await r.reconcile() == 1
    assert world.moves == 1
    cached = r.cached("s")
    assert cached is not None and cached.region == "eu-west"
    reads = world.reads("s")
    assert await r.region_for("s") == "eu-west"
    assert world.reads("s") == reads  # adopted: served from the cache again
    stored = await world.sessions.get("s")
    assert stored is not None and stored[0].region == "eu-west"  # etcd's pin stands


async def test_the_background_loop_probes_and_reconciles(world: World) -> None:
    r = world.resolver()
    async with running(world.routing.run()), running(r.run()):
        await until(lambda: world.routing.connected)
        world.store.set_available(False)
        await until(lambda: not world.routing.connected)  # the routing watch broke
        assert await r.region_for("s") == HOME
        assert world.reads("s") == 0  # a broken routing watch means: do not ask etcd
        assert not r.store_up and r.pending == 1
        await asyncio.sleep(0.05)
        assert r.pending == 1  # probing a dead store settles nothing
        world.store.set_available(True)
        await until(lambda: r.pending == 0)
        assert r.store_up and world.routing.connected
    stored = await world.sessions.get("s")
    assert stored is not None and stored[0].region == HOME
    assert world.metric("tectonic_gateway_store_up") == 1


# ---- sessions another gateway moved (spills) ------------------------------------------------


def violations(world: World) -> float:
    return world.metric("tectonic_gateway_consistency_violations_total")


async def test_a_notice_makes_cached_pins_of_its_region_go_to_the_store(world: World) -> None:
    a, b = world.resolver(), world.resolver()
    for sid in ("moved", "stays"):
        assert await b.region_for(sid) == HOME
    # Gateway a: no replica of us-east answered, so it moved "moved" to us-west.
    assert await a.move("moved", HOME, "us-west") == "us-west"
    reads = {sid: world.reads(sid) for sid in ("moved", "stays")}
    assert await b.region_for("moved") == HOME  # b has not heard: its cache still says east
    b.sessions_moved_off(HOME)
    assert await b.region_for("moved") == "us-west"  # re-read: where a moved it
    assert await b.region_for("stays") == HOME  # re-read too: still east
    assert {sid: world.reads(sid) for sid in reads} == {sid: n + 1 for sid, n in reads.items()}
    assert await b.region_for("moved") == "us-west"  # and cached again
    assert world.reads("moved") == reads["moved"] + 1
    # The disagreement was announced before b served the session anywhere: no violation.
    assert violations(world) == 0
    assert (
        world.metrics.registry.get_sample_value(
            "tectonic_gateway_session_move_notices_total", {"region": HOME}
        )
        == 1
    )


async def test_a_notice_about_another_region_leaves_the_cache_alone(world: World) -> None:
    b = world.resolver()
    assert await b.region_for("s") == HOME
    b.sessions_moved_off("eu-west")
    assert await b.region_for("s") == HOME
    assert world.reads("s") == 1


async def test_without_a_notice_a_disagreement_found_later_is_a_violation(world: World) -> None:
    a, b = world.resolver(), world.resolver(revalidate_s=10)
    assert await b.region_for("s") == HOME
    assert await a.move("s", HOME, "us-west") == "us-west"
    world.mono.advance(11)  # b revalidates on its own, having served the old pin
    assert await b.region_for("s") == "us-west"
    assert violations(world) == 1


async def test_a_pin_cached_before_a_routing_change_is_read_again(world: World) -> None:
    """Gateway b served a session before a failover and not during it; gateway a moved
    it then. When its home comes back, b must not serve it at home from its cache (the
    session would bounce back): a newer routing epoch of its home makes b read it."""
    a, b = world.resolver(), world.resolver()
    assert await a.region_for("s") == HOME and await b.region_for("s") == HOME
    await world.set_routing(EAST_DOWN)  # epoch 1: east's sessions go west
    assert await a.region_for("s") == "us-west"  # a re-pins it (b sees no request)
    back = {**NORMAL, HOME: Routing(targets={HOME: 1.0}, epoch=2)}
    await world.set_routing(back)
    reads = world.reads("s")
    assert await b.region_for("s") == "us-west"  # stays where it moved
    assert world.reads("s") == reads + 1
    assert await b.region_for("s") == "us-west"  # and is cached again
    assert world.reads("s") == reads + 1
    assert violations(world) == 0  # caught before it was served at home: no violation


async def test_moving_a_session_off_a_region_is_announced(world: World) -> None:
    announced: list[str] = []
    r = SessionResolver(
        world.sessions,
        world.routing,
        HOME,
        world.metrics,
        clock=world.clock,
        monotonic=world.mono.now,
        on_moved=announced.append,
    )
    assert await r.region_for("s") == HOME
    assert await r.move("s", HOME, "us-west") == "us-west"
    assert announced == [HOME]
    world.store.set_available(False)  # etcd down: the move is pending, nothing to announce
    assert await r.region_for("t") == HOME
    assert await r.move("t", HOME, "us-west") == "us-west"
    assert announced == [HOME]


async def test_while_the_store_refuses_writes_no_session_is_moved(world: World) -> None:
    """etcd's NOSPACE: a pinned session is served where it is pinned, one that would
    have to move is refused (503) rather than served by a region its pin does not name,
    a spill's move is refused too, and once writes are taken again the move goes on."""
    r = world.resolver(revalidate_s=0.0)  # every request asks the store
    assert await r.region_for("s") == HOME
    assert await r.region_for("t") == HOME
    world.store.set_full(True)
    assert await r.region_for("s") == HOME  # pinned there, home serves: kept
    with pytest.raises(NoRegionServing):
        await r.move("t", HOME, "us-west")  # a spill it could not record
    assert r.writes_refused  # the picker offers no spill for sessions meanwhile
    world.store.set_full(False)
    await world.set_routing(EAST_DOWN)  # the routing switched just before etcd filled
    world.store.set_full(True)
    with pytest.raises(NoRegionServing):
        await r.region_for("s")
    stored = await world.sessions.get("s")
    assert stored is not None and stored[0].region == HOME  # nothing moved unrecorded
    assert world.moves == 0
    world.store.set_full(False)
    assert await r.region_for("s") == "us-west"
    assert not r.writes_refused
    stored = await world.sessions.get("s")
    assert stored is not None and stored[0].region == "us-west"


async def test_while_the_store_refuses_writes_a_gateway_new_to_a_session_reads_its_pin(
    world: World,
) -> None:
    """A gateway that never saw the session (restarted, or its LRU evicted it), in
    another home region, after the lease bucket rolled over (re-attaching the pin needs
    a lease grant, which a full etcd refuses): it serves the session where etcd pins
    it, never afresh in its own home."""
    first = world.resolver()
    assert await first.region_for("s") == HOME
    world.store.set_full(True)
    world.clock.advance(3600)  # a later lease bucket
    elsewhere = SessionResolver(
        world.sessions, world.routing, "us-west", world.metrics, clock=world.clock
    )
    assert await elsewhere.region_for("s") == HOME
    stored = await world.sessions.get("s")
    assert stored is not None and stored[0].region == HOME
