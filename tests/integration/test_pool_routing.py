"""The warm pool end to end on a real etcd: an agent runs a simulator pool (one ACTIVE,
one WARM) and publishes ``pools/<region>``; an in-process gateway homed in that region
routes only to the ACTIVE simulator (the WARM one sleeps: a request there would hang).
A ``Prewarm`` with ``activate=2`` wakes the second, the agent republishes, and the
gateway, through its watch, spreads new prompts over both."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
from tectonic_api.v1 import agent_pb2 as apb
from tectonic_api.v1 import agent_pb2_grpc as apb_grpc

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import until
from controlplane.kernel.codec import decode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.vllm.metrics import parse_gauges
from regions.agent.pool_config import AgentPoolConfig
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from regions.agent.warm_pool import AgentPool
from regions.gateway.server import GatewayServer
from regions.pool.states import ReplicaState
from tests.integration.cp_harness import fast_topology, running_gateway

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
QUERIES = "vllm:prefix_cache_queries_total"  # prompt tokens looked up: >0 once served
REGION = "east"


@pytest.fixture
async def agent(etcd: EtcdServer, cluster_name: str) -> AsyncIterator[AgentHandle]:
    pool = AgentPoolConfig.model_validate(
        {"launcher": {"kind": "simulator"}, "active": 1, "warm": 1, "reconcile_interval_s": 0.5}
    )
    config = AgentConfig(
        region=REGION, pool=pool, etcd=etcd.endpoints, cluster=cluster_name, interval=0.5
    )
    handle = await serve_agent(config)
    try:
        store = pool_of(handle).store

        async def published_once() -> bool:
            return await store.get(Keys(cluster_name).pool(REGION)) is not None

        # before any gateway starts, so that the gateway's first read must find it
        await until(published_once, within=20, every=0.05, what="the agent publishing")
        yield handle
    finally:
        await handle.stop(grace=0)


def topology(etcd: EtcdServer, cluster: str) -> Topology:
    """East has no static replicas: the pool is all it routes to."""
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [{**r, "replicas": []} for r in data["regions"][:2]]
    return parse_topology(data)


@pytest.fixture
async def gateway(
    etcd: EtcdServer, cluster_name: str, agent: AgentHandle
) -> AsyncIterator[GatewayServer]:
    async with running_gateway(topology(etcd, cluster_name), REGION, prefix_tracking=False) as gw:
        yield gw


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # A request routed to a sleeping replica would wait forever: fail instead.
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


def pool_of(handle: AgentHandle) -> AgentPool:
    assert handle.pool is not None
    return handle.pool


async def published(store: EtcdStore, keys: Keys) -> PoolMembers | None:
    kv = await store.get(keys.pool(REGION))
    return None if kv is None else decode(PoolMembers, kv.value, kv.key)


async def queries(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as r:
        return parse_gauges(await r.text(), frozenset({QUERIES})).get(QUERIES, 0.0)


async def is_sleeping(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.get(url + "/is_sleeping") as r:
        return bool((await r.json())["is_sleeping"])


async def send(http: aiohttp.ClientSession, gw: GatewayServer, prompts: range) -> None:
    for i in prompts:  # distinct first characters: each prompt hashes on its own
        body = {"model": "tiny", "prompt": f"{i:04d} question about rockets", "max_tokens": 1}
        headers = {"x-session-id": f"s{i}"}
        async with http.post(gw.url + "/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            assert r.headers["x-tectonic-region"] == REGION


async def test_gateway_routes_only_to_active_pool_replicas_and_follows_activation(
    agent: AgentHandle,
    gateway: GatewayServer,
    etcd_store: EtcdStore,
    keys: Keys,
    http: aiohttp.ClientSession,
) -> None:
    pool = pool_of(agent).pool
    [active] = pool.active()
    [warm] = pool.snapshot().urls(ReplicaState.WARM)
    members = await published(etcd_store, keys)
    assert members is not None and members.active == (active,) and members.warm == 1
    assert members.region == REGION and members.agent.startswith(f"agent:{REGION}@")
    assert agent.view.signals["replicas_warm"] == 1 and agent.view.signals["pool_shortfall"] == 0
    assert agent.view.signals["replicas_total"] == 1  # the agent probes ACTIVE ones only
    assert gateway.balancers[REGION].replicas == (active,)  # read at start

    await send(http, gateway, range(20))
    assert await queries(http, active) > 0
    assert await queries(http, warm) == 0 and await is_sleeping(http, warm)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{agent.port}") as ch:
        stub = apb_grpc.RegionAgentStub(ch)  # type: ignore[no-untyped-call]
        req = apb.PrewarmRequest(failover_id="burst-1", source="west", budget_s=30, activate=2)
        [*_, last] = [m async for m in stub.Prewarm(req, timeout=60)]
    assert last.done and last.replicas_active == 2, last
    assert sorted(pool.active()) == sorted([active, warm])
    assert not await is_sleeping(http, warm)

    async def both_published() -> bool:
        m = await published(etcd_store, keys)
        return m is not None and sorted(m.active) == sorted([active, warm]) and m.warm == 0

    await until(both_published, within=20, every=0.1, what="pools/east listing both replicas")

    async def gateway_follows() -> bool:
        return sorted(gateway.balancers[REGION].replicas) == sorted([active, warm])

    await until(gateway_follows, within=20, every=0.05, what="the gateway's balancer update")

    async def signals_follow() -> bool:
        s = agent.view.signals
        return s["replicas_total"] == 2 and s["replicas_warm"] == 0

    await until(signals_follow, within=20, every=0.1, what="the agent probing both replicas")

    await send(http, gateway, range(100, 160))
    assert await queries(http, warm) > 0  # 60 prompts on 2 replicas: both take some

    # Stopping the agent stops its managed replicas, and it says so in pools/east.
    await agent.stop(grace=0)
    members = await published(etcd_store, keys)
    assert members is not None and members.active == ()

    async def gateway_empty() -> bool:
        return gateway.balancers[REGION].replicas == ()

    await until(gateway_empty, within=20, every=0.05, what="the gateway dropping both replicas")
    body = {"model": "tiny", "prompt": "anyone?", "max_tokens": 1}
    async with http.post(gateway.url + "/v1/completions", json=body) as r:
        assert r.status == 503, await r.text()  # NoReplica: nothing ACTIVE to route to
