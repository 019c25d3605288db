"""Two regions ``a`` and ``b`` wired for pre-warm: agents reporting to an in-process
control plane on a real etcd, and a gateway homed in ``a`` that counts prefixes.
Replicas are given (real vLLM or simulator processes); faults are the caller's."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators, until
from controlplane.kernel.codec import decode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import FailoverStep, RegionRecord
from controlplane.kernel.prefix.catalog import PrefixCatalog
from controlplane.kernel.store.etcd import EtcdStore
from regions.agent.prewarm_executor import cache_counters
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer
from regions.pool.processes import free_port
from tests.integration.cp_harness import Running, fast_topology, running_replica

REGIONS = ("a", "b")


@contextlib.contextmanager
def two_regions(block_size: int) -> Iterator[dict[str, list[Proc]]]:
    """Regions ``a`` and ``b`` of two simulators each, killed on the way out."""
    procs = start_simulators(4, block_size=block_size)
    try:
        yield {"a": procs[:2], "b": procs[2:]}
    finally:
        for p in procs:
            p.kill()


def prewarm_topology(
    etcd: EtcdServer,
    cluster: str,
    agent_ports: Mapping[str, int],
    replicas: Mapping[str, Sequence[str]],
    *,
    prefixes: dict[str, object],
    prewarm: dict[str, object],
    recovery: dict[str, object] | None = None,
) -> Topology:
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [
        {
            "name": r,
            "zone": "eu",
            "agent": f"127.0.0.1:{agent_ports[r]}",
            "capacity_rps": 100,
            "replicas": list(replicas[r]),
        }
        for r in REGIONS
    ]
    data["timing"]["quorum"] = 1  # only the agents observe
    data["prefixes"] = {"export_interval_s": 0.3, "aggregate_interval_s": 0.3, **prefixes}
    data["prewarm"] = prewarm
    if recovery is not None:
        data["recovery"] = {**data["recovery"], **recovery}
    return parse_topology(data)


@dataclass
class Wired:
    topology: Topology
    gateway: GatewayServer
    agents: dict[str, AgentHandle]
    control_plane: Running


@contextlib.asynccontextmanager
async def wired_regions(
    etcd: EtcdServer,
    cluster: str,
    replicas: Mapping[str, Sequence[str]],
    *,
    prefixes: dict[str, object],
    prewarm: dict[str, object],
    recovery: dict[str, object] | None = None,
    warm_first: bool = True,
) -> AsyncIterator[Wired]:
    ports = {r: free_port() for r in REGIONS}
    topo = prewarm_topology(
        etcd, cluster, ports, replicas, prefixes=prefixes, prewarm=prewarm, recovery=recovery
    )
    async with running_replica(topo) as cp:
        agents: dict[str, AgentHandle] = {}
        app = AppConfig(home="a", warm_first=warm_first)
        gw = GatewayServer(GatewayOptions(topology=topo, app=app))
        try:
            for r in REGIONS:
                agents[r] = await serve_agent(
                    AgentConfig(
                        region=r,
                        replicas=tuple(replicas[r]),
                        control_planes=(cp.target,),
                        interval=0.25,
                        timeout=0.25,
                        listen=f"127.0.0.1:{ports[r]}",
                    )
                )
            await gw.start()
            yield Wired(topo, gw, agents, cp)
        finally:
            await gw.stop()
            for h in agents.values():
                await h.stop(grace=0)


async def tokens(http: aiohttp.ClientSession, url: str, prompt: str) -> int:
    async with http.post(url + "/tokenize", json={"model": "tiny", "prompt": prompt}) as r:
        assert r.status == 200, await r.text()
        return int((await r.json())["count"])


async def send_usage(
    http: aiohttp.ClientSession, gw: GatewayServer, session: str, prompt: str
) -> tuple[str, int]:
    """One completion through the gateway; the region that served it and its prompt
    tokens."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    async with http.post(
        gw.url + "/v1/completions", json=body, headers={"x-session-id": session}
    ) as r:
        assert r.status == 200, await r.text()
        return r.headers["x-tectonic-region"], int((await r.json())["usage"]["prompt_tokens"])


async def send(http: aiohttp.ClientSession, gw: GatewayServer, session: str, prompt: str) -> str:
    """One completion through the gateway; the region that served it."""
    return (await send_usage(http, gw, session, prompt))[0]


async def first_hits(
    http: aiohttp.ClientSession,
    gw: GatewayServer,
    session: str,
    prompt: str,
    replicas: Sequence[str],
) -> tuple[str, float]:
    """Send one request through the gateway (nothing else may run on ``replicas``); the
    region that served it and how far ``vllm:prefix_cache_hits_total`` moved on
    ``replicas``, read once the queries counter has counted the request (vLLM updates
    its counters as it processes outputs, which may trail the answer). Sent once the
    gateway's own view of ``replicas`` is idle too: a load report read during a
    pre-warm's replays holds until its next poll, and an owner seen busy sends its
    prefix's request elsewhere (the bounded-load rule)."""
    ours = {r.rstrip("/") for r in replicas}

    async def seen_idle() -> bool:  # seen at all, too: a name no balancer holds never is
        loads = [
            b.load(r) for b in gw.balancers.values() for r in b.replicas if r.rstrip("/") in ours
        ]
        return bool(loads) and not any(loads)

    await until(seen_idle, within=20, every=0.05, what="the gateway to see the replicas idle")
    q0 = sum(await queries_of(http, replicas))
    h0 = await hits_across(http, replicas)
    region, n = await send_usage(http, gw, session, prompt)

    async def counted() -> bool:
        return sum(await queries_of(http, replicas)) >= q0 + n

    await until(counted, within=10, every=0.05, what="the queries counter to count the request")
    return region, await hits_across(http, replicas) - h0


async def wait_catalog(
    store: EtcdStore,
    keys: Keys,
    region: str,
    payloads: int,
    within: float = 30,
    prompts: Sequence[str] = (),
) -> PrefixCatalog:
    """The region's catalog once it holds at least ``payloads`` replay payloads, and one
    cut from each of ``prompts``."""
    found: list[PrefixCatalog] = []

    async def ready() -> bool:
        kv = await store.get(keys.prefixes(region))
        if kv is None:
            return False
        cat = decode(PrefixCatalog, kv.value, kv.key)
        found[:] = [cat]
        cuts = [e.payload.prompt or "-" for e in cat.entries if e.payload is not None]
        return len(cuts) >= payloads and all(any(p.startswith(c) for c in cuts) for p in prompts)

    await until(ready, within=within, every=0.2, what=f"{payloads} payloads in {region}'s catalog")
    return found[0]


async def wait_prewarmed(
    store: EtcdStore, keys: Keys, region: str, within: float = 60
) -> RegionRecord:
    """The region's record once its failover has done its pre-warm step."""
    found: list[RegionRecord] = []

    async def done() -> bool:
        kv = await store.get(keys.region_state(region))
        rec = None if kv is None else decode(RegionRecord, kv.value, kv.key)
        found[:] = [rec] if rec else []
        return (
            rec is not None
            and rec.failover is not None
            and FailoverStep.PREWARM in rec.failover.done
        )

    await until(done, within=within, every=0.2, what=f"{region} failed over and pre-warmed")
    return found[0]


async def hits_across(http: aiohttp.ClientSession, replicas: Sequence[str]) -> float:
    """``vllm:prefix_cache_hits_total`` summed over ``replicas``."""
    return sum([(await cache_counters(http, r))[1] for r in replicas])


async def queries_of(http: aiohttp.ClientSession, replicas: Sequence[str]) -> list[float]:
    return [(await cache_counters(http, r))[0] for r in replicas]
