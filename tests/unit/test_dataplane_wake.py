"""The data plane's part of scale to zero (regions/dataplane/wake.py) and the agent's
(regions/agent/asleep.py): the hold's bounds, Retry-After, one wake request for a burst
of requests, a held request served once a replica appears or refused after the hold;
an agent whose pool sleeps on purpose says so, one whose pool died does not."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.kernel.codec import decode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Health
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.pool.scale import ASLEEP_SIGNAL, WakeRequest
from controlplane.kernel.store.memory import MemoryStore
from regions.agent.asleep import WAKE_GRACE_S, asleep_since, asleep_view
from regions.agent.verdict import RegionVerdict
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.options import DataPlaneOptions
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.wake import PATH_S, Waker, hold_s, retry_after
from regions.gateway.__main__ import parse_args as gateway_args
from regions.picker.__main__ import parse_args as picker_args

REPLICA = "http://127.0.0.1:1"


def members(
    active: tuple[str, ...] = (), p95: float | None = None, *, asleep: bool = True
) -> PoolMembers:
    return PoolMembers(
        region="east",
        active=active,
        warm=1,
        at=0.0,
        agent="a",
        activation_p95_s=p95,
        asleep=asleep and not active,
    )


def test_the_hold_is_the_measured_wake_and_its_path_else_the_default_capped() -> None:
    assert hold_s(members(p95=2.0), 30.0, 60.0) == 2.0 + PATH_S
    assert hold_s(members(), 30.0, 60.0) == 30.0
    assert hold_s(members(p95=200.0), 30.0, 60.0) == 60.0
    assert retry_after(members(p95=2.2), 30.0) == 3
    assert retry_after(members(), 30.0) == 30
    assert retry_after(members(p95=0.01), 30.0) == 1


def test_members_without_a_measured_wake_serialise_as_before() -> None:
    dumped = members(asleep=False).model_dump()
    assert "activation_p95_s" not in dumped and "asleep" not in dumped
    assert members(p95=1.5).model_dump()["activation_p95_s"] == 1.5
    assert members().model_dump()["asleep"] is True


class Lab:
    def __init__(self, *, default_s: float) -> None:
        self.store = MemoryStore()
        self.keys = Keys("t")
        self.balancers = {"east": ReplicaBalancer(())}
        self.pools = {"east": members()}
        self.metrics = DataPlaneMetrics()
        self.waker = Waker(
            self.store,
            self.keys,
            self.balancers,
            lambda: self.pools,
            self.metrics,
            default_s=default_s,
            most_s=60.0,
            writer=lambda: "gateway:test",
        )

    def wake_up(self) -> None:
        """What the pools watch does when the agent publishes a replica."""
        self.pools["east"] = members((REPLICA,))
        self.balancers["east"] = self.balancers["east"].rebuilt((REPLICA,))
        self.waker.changed()


async def test_a_burst_of_requests_writes_one_wake_and_is_served_when_a_replica_comes() -> None:
    lab = Lab(default_s=30.0)
    held = [asyncio.create_task(lab.waker.hold("east")) for _ in range(5)]
    await asyncio.sleep(0.05)
    kv = await lab.store.get(lab.keys.wake("east"))
    assert kv is not None and kv.mod_revision == kv.create_revision  # written once
    assert decode(WakeRequest, kv.value, kv.key).by == "gateway:test"
    assert not any(t.done() for t in held)  # held while the pool wakes
    lab.wake_up()
    got = await asyncio.gather(*held)
    assert all(h is not None and h.served for h in got)
    assert await lab.waker.hold("east") is None  # awake: nothing held


async def test_a_held_request_is_told_the_holds_length_before_it_waits() -> None:
    """The picker asks Envoy for that long before holding (regions/picker/service.py)."""
    lab = Lab(default_s=30.0)
    told: list[float] = []
    held = asyncio.create_task(lab.waker.hold("east", on_hold=told.append))
    await asyncio.sleep(0.05)
    assert told == [30.0] and not held.done()
    lab.wake_up()
    got = await held
    assert got is not None and got.served
    assert await lab.waker.hold("east", on_hold=told.append) is None
    assert told == [30.0]  # awake: neither held nor told


async def test_a_pool_that_does_not_wake_within_the_hold_is_refused_with_retry_after() -> None:
    lab = Lab(default_s=0.2)
    held = await lab.waker.hold("east")
    assert held is not None and not held.served and held.retry_after_s >= 1


async def test_a_region_without_a_pool_is_never_held() -> None:
    lab = Lab(default_s=30.0)
    del lab.pools["east"]
    assert await lab.waker.hold("east") is None
    assert await lab.store.get(lab.keys.wake("east")) is None


async def test_a_pool_with_no_replica_and_not_asleep_is_down_not_held() -> None:
    """Its replicas died: its requests spill to another region as before, at once."""
    lab = Lab(default_s=30.0)
    lab.pools["east"] = members(asleep=False)
    assert await lab.waker.hold("east") is None
    assert await lab.store.get(lab.keys.wake("east")) is None


def test_an_agent_whose_pool_sleeps_on_purpose_says_asleep_not_down() -> None:
    down = RegionVerdict(region="east", health=Health.UNHEALTHY, signals={}, detail="0/0 up")
    since = asleep_since(None, 0, 0.0, now=100.0)  # the leader asks 0 ACTIVE
    view = asleep_view(down, since, 100.0)
    assert view.health is Health.HEALTHY and view.signals[ASLEEP_SIGNAL] == 1.0
    # woken (the leader asks 1), the replica not up yet: waking, still not down
    since = asleep_since(since, 0, 1.0, now=103.0)
    assert asleep_view(down, since, 103.0).health is Health.HEALTHY
    # a wake that never serves is a pool down after the grace
    assert asleep_view(down, since, 100.0 + WAKE_GRACE_S + 1).health is Health.UNHEALTHY
    # serving again: the probes' verdict
    assert asleep_since(since, 1, 1.0, now=104.0) is None


def test_an_agent_whose_replicas_died_is_down() -> None:
    down = RegionVerdict(region="east", health=Health.UNHEALTHY, signals={}, detail="0/1 up")
    since = asleep_since(None, 0, 1.0, now=100.0)  # the leader asks 1: not asleep
    assert asleep_view(down, since, 100.0).health is Health.UNHEALTHY


@pytest.mark.parametrize("parse", ["gateway", "picker"])
def test_the_hold_is_set_on_both_command_lines_and_refused_when_inverted(parse: str) -> None:
    base = ["--topology", "examples/topology.yaml", "--region", "us-east"]

    def options(argv: list[str]) -> DataPlaneOptions:
        if parse == "gateway":
            return gateway_args([*base, *argv])[0]
        return picker_args([*base, *argv])[0].routing

    got = options(["--wake-hold", "12", "--wake-hold-max", "20"])
    assert (got.wake_hold_s, got.wake_hold_max_s) == (12.0, 20.0)
    assert (options([]).wake_hold_s, options([]).wake_hold_max_s) == (30.0, 60.0)
    with pytest.raises(SystemExit) as exited:
        options(["--wake-hold", "90"])
    assert exited.value.code == 2
