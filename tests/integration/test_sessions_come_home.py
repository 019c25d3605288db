"""A recovered region gets back the sessions that sent nothing during its failover
(issue 27), and keeps none of those its targets served.

Real parts: one etcd, a control-plane replica that leads (it fails east over and
recovers it in graduated steps, on the health reports the test sends), an in-process
gateway homed in east (its routing watch, its ``SessionResolver`` over the real
``SessionStore``), and a simulator replica per region, so that each answer names the
region whose replica gave it. Forty sessions start in east; during the failover half of
them send a request, which the target answers and the gateway re-pins them there;
the other half send nothing. Before, the leader re-pinned all forty in the background
right after the switch, and after recovery east answered none of them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import aiohttp
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators
from controlplane.kernel.codec import decode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.sessions.resolve import SessionPin, routing_of, self_routed
from regions.gateway.server import GatewayServer
from tests.integration.cp_harness import (
    fast_topology,
    region,
    reporting,
    running_gateway,
    running_replica,
)

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

SERVED = [f"served-{i:02d}" for i in range(20)]  # send a request during the failover
IDLE = [f"idle-{i:02d}" for i in range(20)]  # send nothing until east serves again
# Long enough that the checks at the first step (east at 50 %) run before the second.
STEP_INTERVAL_S = 5.0


@pytest.fixture
def sims() -> Iterator[list[Proc]]:
    procs = start_simulators(3)
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()


def topology(etcd: EtcdServer, sims: list[Proc]) -> Topology:
    """The harness's four regions, a replica each for east, west and central (eu, in
    another zone, is never a target of east), and a slow recovery pace."""
    data = fast_topology(etcd.endpoints, f"home{uuid.uuid4().hex[:8]}").model_dump(mode="json")
    urls = {"east": sims[0].url, "west": sims[1].url, "central": sims[2].url}
    data["regions"] = [
        {**r, "replicas": [urls[r["name"]]]} if r["name"] in urls else r for r in data["regions"]
    ]
    data["recovery"] = {"step_percent": 50, "step_interval_s": STEP_INTERVAL_S}
    return parse_topology(data)


async def ask(http: aiohttp.ClientSession, gw: GatewayServer, session: str) -> str:
    """One small completion for ``session`` through the gateway: the region that answered."""
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": 2}
    async with http.post(
        gw.url + "/v1/completions", json=body, headers={"x-session-id": session}
    ) as resp:
        await resp.read()
        assert resp.status == 200, (session, resp.status)
        return resp.headers["x-tectonic-region"]


async def answers(
    http: aiohttp.ClientSession, gw: GatewayServer, sessions: list[str]
) -> dict[str, str]:
    regions = await asyncio.gather(*(ask(http, gw, s) for s in sessions))
    return dict(zip(sessions, regions, strict=True))


async def wait_for(what: str, cond: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await cond():
        if loop.time() > deadline:
            raise AssertionError(f"not reached within {within:g}s: {what}")
        await asyncio.sleep(0.05)


def east_weight(gw: GatewayServer) -> float:
    """East's own share of its traffic, as this gateway's routing cache has it."""
    return routing_of(gw.routing.routings, "east").targets.get("east", 0.0)


async def pins(gw: GatewayServer, keys: Keys, sessions: list[str]) -> dict[str, SessionPin]:
    out = {}
    for s in sessions:
        kv = await gw.store.get(keys.session(s))
        assert kv is not None, s
        out[s] = decode(SessionPin, kv.value)
    return out


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_idle_sessions_come_home_and_served_ones_stay_where_they_were_served(
    etcd: EtcdServer, sims: list[Proc], http: aiohttp.ClientSession
) -> None:
    topo = topology(etcd, sims)
    keys = Keys(topo.cluster)
    async with (
        running_replica(topo) as run,
        reporting(run.stub, {}) as health,
        running_gateway(topo, "east", prefix_tracking=False) as gw,
    ):

        async def status() -> pb.StatusResponse:
            st: pb.StatusResponse = await run.stub.GetStatus(pb.GetStatusRequest())
            return st

        async def steady() -> bool:
            st = await status()
            return st.responder_is_leader and all(r.health == pb.HEALTHY for r in st.regions)

        await wait_for("a leader and every region HEALTHY", steady)
        assert set((await answers(http, gw, SERVED + IDLE)).values()) == {"east"}

        # east fails over: the routing switch reaches the gateway
        health["east"] = pb.UNHEALTHY

        async def switched() -> bool:
            st = await status()
            failing = region(st, "east").state == pb.FAILING_OVER
            return failing and not self_routed(gw.routing.routings, "east")

        await wait_for("east failed over, seen by the gateway", switched)
        during = await answers(http, gw, SERVED)
        assert set(during.values()) <= {"west", "central"}, during
        assert await answers(http, gw, SERVED) == during  # moved once, and stays

        # east serves again: graduated recovery, its first step
        health["east"] = pb.HEALTHY

        async def first_step() -> bool:
            return east_weight(gw) > 0.0

        await wait_for("east's first recovery step, seen by the gateway", first_step)
        assert east_weight(gw) == 0.5
        idle_back = await answers(http, gw, IDLE)
        served_back = await answers(http, gw, SERVED)
        assert east_weight(gw) == 0.5, "the checks outlasted the first step"
        assert set(idle_back.values()) == {"east"}, idle_back  # before: 0 of 20
        assert served_back == during  # no bounce

        # and once recovery is complete
        async def normal() -> bool:
            return region(await status(), "east").state == pb.NORMAL and east_weight(gw) == 1.0

        await wait_for("east NORMAL again, seen by the gateway", normal, within=STEP_INTERVAL_S * 4)
        assert set((await answers(http, gw, IDLE)).values()) == {"east"}
        assert await answers(http, gw, SERVED) == during

        # In etcd: the idle sessions were never written again, each served one once.
        idle_pins = await pins(gw, keys, IDLE)
        assert all((p.region, p.moves) == ("east", 0) for p in idle_pins.values()), idle_pins
        served_pins = await pins(gw, keys, SERVED)
        assert {s: (p.region, p.moves) for s, p in served_pins.items()} == {
            s: (r, 1) for s, r in during.items()
        }
        registry = gw.metrics.registry
        moves = registry.get_sample_value("tectonic_gateway_session_moves_total")
        violations = registry.get_sample_value("tectonic_gateway_consistency_violations_total")
        assert (moves, violations) == (len(SERVED), 0)
