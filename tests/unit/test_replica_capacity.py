"""Replica choice bounded by what each replica bears (regions.dataplane.replicas), the
slots learned from the replicas' running/waiting, and the poller that reads them
(regions.dataplane.replica_load)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.config import parse_topology
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.store.memory import MemoryStore
from regions.dataplane.core import DataPlaneCore
from regions.dataplane.off import Off
from regions.dataplane.options import DataPlaneOptions, RequestConfig
from regions.dataplane.replica_load import ReplicaLoadPoller
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.ring import prefix_key

REPLICAS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
keys = st.integers(min_value=0, max_value=2**64 - 1)


def replicas_and_slots() -> st.SearchStrategy[dict[str, int]]:
    return st.lists(st.integers(1, 6), min_size=2, max_size=4).map(
        lambda ns: {REPLICAS[i]: n for i, n in enumerate(ns)}
    )


# ---- the rule --------------------------------------------------------------------------


@settings(max_examples=200)
@given(replicas_and_slots(), st.lists(st.tuples(keys, st.booleans()), max_size=60))
def test_no_request_queues_on_a_replica_while_another_has_a_free_slot(
    slots: dict[str, int], steps: list[tuple[int, bool]]
) -> None:
    """Requests start (and, with the flag, the oldest one ends) in any order: the
    chosen replica has a free slot whenever any replica has one."""
    b = ReplicaBalancer(list(slots), slots=slots)
    held: list[str] = []
    for key, end_one in steps:
        if end_one and held:
            b.release(held.pop(0))
        chosen = b.choose(key)
        assert chosen is not None
        if any(b.inflight[r] < n for r, n in slots.items()):
            assert b.inflight[chosen] < slots[chosen]
        b.acquire(chosen)
        held.append(chosen)


@settings(max_examples=200)
@given(replicas_and_slots(), keys, st.data())
def test_a_prefix_keeps_its_replica_while_that_one_has_a_free_slot(
    slots: dict[str, int], key: int, data: st.DataObject
) -> None:
    b = ReplicaBalancer(list(slots), slots=slots)
    owner = b.ring.owner(key)
    assert owner is not None
    for r, n in slots.items():  # any load, the owner's below its slots
        top = n - 1 if r == owner else n + 3
        for _ in range(data.draw(st.integers(0, top), label=r)):
            b.acquire(r)
    assert b.choose(key) == owner


@settings(max_examples=200)
@given(replicas_and_slots(), keys, st.data())
def test_when_every_replica_is_full_the_request_queues_where_fewest_wait_per_slot(
    slots: dict[str, int], key: int, data: st.DataObject
) -> None:
    b = ReplicaBalancer(list(slots), slots=slots)
    for r, n in slots.items():
        for _ in range(n + data.draw(st.integers(0, 4), label=r)):
            b.acquire(r)
    chosen = b.choose(key)
    assert chosen is not None

    def per_slot(r: str) -> float:
        return (b.inflight[r] + 1) / slots[r]

    best = min(per_slot(r) for r in slots)
    assert per_slot(chosen) == best
    ties = [r for r in b.ring.walk(key) if per_slot(r) == best]
    assert chosen == ties[0]  # among equals, the first in ring order: affinity


def test_sixteen_requests_of_one_prefix_fill_two_replicas_of_eight_evenly() -> None:
    """The colleague's measurement: the bounded-load ring (c = 1.25) let 10 of the 16
    land on the prefix's owner, which runs 8 at a time; with the replicas' slots it
    takes 8 and the other 8 go to the second choice."""
    key = prefix_key("the same long system prompt for everyone")
    for slots, most in ((None, 10), (8, 8)):
        b = ReplicaBalancer(REPLICAS[:2], slots=slots)
        for _ in range(16):
            chosen = b.choose(key)
            assert chosen is not None
            b.acquire(chosen)
        assert max(b.inflight.values()) == most
        assert b.inflight[b.ring.owner(key) or ""] == most


def test_ejected_and_excluded_replicas_are_skipped_with_slots_too() -> None:
    b = ReplicaBalancer(REPLICAS[:2], slots=2)
    key = prefix_key("retry me")
    first, second = b.ring.walk(key)
    assert b.choose(key, exclude={first}) == second
    b.eject(first, until=10.0)
    assert b.choose(key, now=5.0) == second
    for _ in range(2):
        b.acquire(second)
    assert b.choose(key, now=5.0) == second  # full, but the only live one
    assert b.choose(key, exclude={first, second}) is None
    b.eject(second, until=10.0)
    assert b.choose(key, now=5.0) == first  # all ejected: ejection ignored, room wins


def test_given_slots_are_checked() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ReplicaBalancer(REPLICAS[:2], slots=0)
    with pytest.raises(ValueError, match="at least 1"):
        ReplicaBalancer(REPLICAS[:2], slots={REPLICAS[0]: 0})
    b = ReplicaBalancer(REPLICAS[:2], slots={REPLICAS[0]: 3, "http://elsewhere:1": 9})
    assert (b.slots(REPLICAS[0]), b.slots(REPLICAS[1])) == (3, None)


# ---- learning what a replica bears ------------------------------------------------------


def test_a_queue_in_two_reports_in_a_row_is_the_replicas_limit() -> None:
    b = ReplicaBalancer(REPLICAS[:2])
    a = REPLICAS[0]
    b.observe(a, running=5, waiting=1)  # maybe a request between engine steps
    assert b.slots(a) is None
    b.observe(a, running=3, waiting=0)
    b.observe(a, running=6, waiting=2)
    assert b.slots(a) is None  # the queue did not last: still unknown
    b.observe(a, running=8, waiting=3)
    assert b.slots(a) == 8  # the more of the two: it ran 8 while others waited
    b.observe(a, running=6, waiting=1)
    b.observe(a, running=6, waiting=4)
    assert b.slots(a) == 6  # a lasting queue at 6 (e.g. a short KV cache): 6 now
    b.observe(a, running=7, waiting=0)
    assert b.slots(a) == 7  # ran more without a queue: bears at least that
    b.observe(a, running=0, waiting=5)
    b.observe(a, running=0, waiting=5)
    assert b.slots(a) == 7  # nothing running (asleep, paused): says nothing


def test_an_unread_report_breaks_the_run_of_queued_reports() -> None:
    b = ReplicaBalancer(REPLICAS[:2])
    a = REPLICAS[0]
    b.observe(a, running=8, waiting=1)
    b.unreported(a)
    b.observe(a, running=8, waiting=1)
    assert b.slots(a) is None


def test_a_replica_not_seen_at_its_limit_bears_what_the_fewest_of_its_region_bore() -> None:
    b = ReplicaBalancer(REPLICAS[:3], slots={REPLICAS[2]: 12})
    assert b.slots(REPLICAS[1]) is None
    for r, running in ((REPLICAS[0], 8), (REPLICAS[2], 10)):
        for _ in range(2):
            b.observe(r, running=running, waiting=1)
    # its own beats the region's, learned beats given, the fewest learned for the rest
    assert [b.slots(r) for r in REPLICAS[:3]] == [8, 8, 10]


def test_other_gateways_requests_count_against_a_replica() -> None:
    b = ReplicaBalancer(REPLICAS[:2], slots=4)
    key = prefix_key("shared")
    owner = b.ring.owner(key)
    assert owner is not None
    b.acquire(owner)
    b.observe(owner, running=4, waiting=0)  # 1 of ours, 3 of others'
    assert b.load(owner) == 4
    assert b.choose(key) != owner
    b.unreported(owner)  # no report: others unknown again, counted as none
    assert b.load(owner) == 1 and b.choose(key) == owner


def test_our_own_requests_that_ended_while_the_report_travelled_are_not_others() -> None:
    b = ReplicaBalancer(REPLICAS[:2], slots=4)
    a = REPLICAS[0]
    for _ in range(3):
        b.acquire(a)
    asked = b.inflight[a]
    b.release(a)  # ended after the replica counted it, before its report came back
    b.observe(a, running=3, waiting=0, ours_asked=asked)
    assert b.load(a) == 2


def test_the_unknown_bound_counts_the_others_in_the_mean() -> None:
    b = ReplicaBalancer(REPLICAS[:2])
    assert b.capacity() == 1  # ceil(1.25 x 1 / 2)
    b.observe(REPLICAS[0], running=6, waiting=0)
    assert b.capacity() == 5  # ceil(1.25 x 7 / 2)
    assert b.bound(REPLICAS[0]) == 5


def test_a_rebuilt_balancer_keeps_what_it_learned_of_the_replicas_that_stay() -> None:
    b = ReplicaBalancer(REPLICAS[:2], load_factor=1.5, slots={REPLICAS[1]: 5})
    for _ in range(2):
        b.observe(REPLICAS[0], running=8, waiting=1)
    new = b.rebuilt([REPLICAS[0], REPLICAS[2]])
    assert new.replicas == (REPLICAS[0], REPLICAS[2])
    assert new.load_factor == 1.5 and new.slots(REPLICAS[0]) == 8
    assert new.slots(REPLICAS[2]) == 8  # a newcomer: what its region bore
    assert b.rebuilt([REPLICAS[1]]).slots(REPLICAS[1]) == 5  # given stays given


# ---- the poller ------------------------------------------------------------------------


def metrics_page(running: int, waiting: int) -> str:
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}.0\n'
    )


@pytest.fixture
async def replica() -> AsyncIterator[tuple[str, Callable[[int, int], None]]]:
    """A fake replica's /metrics; the callable sets what it reports."""
    state = {"running": 0, "waiting": 0}

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=metrics_page(state["running"], state["waiting"]))

    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]

    def report(running: int, waiting: int) -> None:
        state.update(running=running, waiting=waiting)

    yield f"http://127.0.0.1:{port}", report
    await runner.cleanup()


async def test_the_poller_teaches_each_balancer_its_replicas_slots(
    replica: tuple[str, Callable[[int, int], None]],
) -> None:
    url, report = replica
    dead = "http://127.0.0.1:9"  # nothing listens: unreported
    balancers = {"east": ReplicaBalancer([url, dead])}
    poller = ReplicaLoadPoller(balancers, interval_s=0.01, timeout_s=0.5)
    report(8, 2)
    async with aiohttp.ClientSession() as http:
        await poller.poll(http)
        assert balancers["east"].slots(url) is None
        await poller.poll(http)
        assert balancers["east"].slots(url) == 8
        balancers["east"] = balancers["east"].rebuilt([url])  # read anew each round
        report(9, 0)
        await poller.poll(http)
    assert balancers["east"].slots(url) == 9
    assert balancers["east"].load(url) == 9  # none of them ours


async def test_the_poller_runs_until_cancelled(
    replica: tuple[str, Callable[[int, int], None]],
) -> None:
    url, report = replica
    balancers = {"east": ReplicaBalancer([url])}
    report(4, 1)
    task = asyncio.create_task(ReplicaLoadPoller(balancers, interval_s=0.01).run())
    for _ in range(200):
        if balancers["east"].slots(url) == 4:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert balancers["east"].slots(url) == 4
    with pytest.raises(ValueError):
        ReplicaLoadPoller(balancers, interval_s=0)


# ---- wiring ----------------------------------------------------------------------------


def _options(**more: object) -> DataPlaneOptions:
    topology = parse_topology(
        {
            "cluster": "t",
            "regions": [
                {
                    "name": "east",
                    "zone": "us",
                    "agent": "127.0.0.1:9",
                    "capacity_rps": 10,
                    "replicas": REPLICAS[:2],
                }
            ],
        }
    )
    return DataPlaneOptions(topology=topology, app=RequestConfig(home="east"), **more)


def test_the_data_plane_gives_its_balancers_the_slots_and_a_poller() -> None:
    core = DataPlaneCore(_options(replica_slots=6), store=MemoryStore(), observer=None)
    assert isinstance(core.replica_load, ReplicaLoadPoller)
    assert core.replica_load.interval_s == 1.0
    assert [core.balancers["east"].slots(r) for r in REPLICAS[:2]] == [6, 6]
    off = DataPlaneCore(_options(replica_poll_s=0), store=MemoryStore())
    assert isinstance(off.replica_load, Off)
    assert off.balancers["east"].slots(REPLICAS[0]) is None


def test_a_pool_change_keeps_what_the_region_learned() -> None:
    core = DataPlaneCore(_options(), store=MemoryStore())
    for _ in range(2):
        core.balancers["east"].observe(REPLICAS[0], running=8, waiting=1)
    active = (REPLICAS[0], REPLICAS[2])
    members = PoolMembers(region="east", active=active, warm=0, at=1.0, agent="a")
    core._pool_changed("east", members)
    balancer = core.balancers["east"]
    assert balancer.replicas == (REPLICAS[0], REPLICAS[2])
    assert balancer.slots(REPLICAS[0]) == 8
