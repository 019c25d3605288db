"""Pre-warm end to end with two regions each served by a REAL vLLM (CPU build).

Traffic from several sessions sharing a long system prompt goes through a gateway into
region ``a``; the gateway counts its prefixes and exports them, the leader merges them
into ``prefixes/a``. Then ``a``'s vLLM is SIGKILLed: its agent reports the region down,
the control plane fails ``a`` over to ``b`` (switch at once, the source is hard down)
and asks ``b``'s agent to pre-warm. The proof is vLLM's own counter on ``b``: the first
request for the top prefix raises ``vllm:prefix_cache_hits_total`` by at least the
warmed prefix's length minus one block; the same request after ``/reset_prefix_cache``
(no pre-warm) raises it by 0.

Costs two vLLM starts (~20-40 s each, in parallel; ~2.3 GB RSS each).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import aiohttp
import pytest

from chaos.local_etcd import EtcdServer
from chaos.procs import free_port, until
from chaos.vllm_cpu import SETUP_HINT, VllmProc, launch_vllm, vllm_available, wait_vllm
from controlplane.codec import decode
from controlplane.config import Topology, parse_topology
from controlplane.core.model import FailoverStep, RegionRecord, RegionState
from controlplane.core.prefix_catalog import PrefixCatalog
from controlplane.keys import Keys
from controlplane.store.etcd import EtcdStore
from regions.agent import AgentConfig, AgentHandle, serve_agent
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer
from regions.prewarm_executor import cache_counters
from tests.integration.cp_harness import fast_topology, running_replica

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.realvllm]

BLOCK = 128  # vLLM's CPU build
SESSIONS = 4
K = 3
SYSTEM = " ".join(
    f"Rule {i}: the assistant of the Tectonic rocket shop answers order question {i} "
    "politely, briefly, and never invents a delivery date."
    for i in range(12)
)


@pytest.fixture(scope="module")
def vllms() -> Iterator[tuple[VllmProc, VllmProc]]:
    if not vllm_available():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real-vLLM pre-warm test; {SETUP_HINT}")
        pytest.skip(f"real vLLM is not installed: {SETUP_HINT}")
    procs = [launch_vllm(name=f"vllm-{r}") for r in ("a", "b")]  # start both, then wait
    try:
        a, b = (wait_vllm(p, timeout=300) for p in procs)
        yield a, b
    finally:
        for p in procs:
            p.terminate()


async def tokens(http: aiohttp.ClientSession, url: str, prompt: str) -> int:
    async with http.post(url + "/tokenize", json={"model": "tiny", "prompt": prompt}) as r:
        assert r.status == 200, await r.text()
        return int((await r.json())["count"])


def topology(etcd: EtcdServer, cluster: str, agent_ports: dict[str, int],
             urls: dict[str, str], chars_per_token: float) -> Topology:  # fmt: skip
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [
        {"name": r, "zone": "eu", "agent": f"127.0.0.1:{agent_ports[r]}",
         "capacity_rps": 100, "replicas": [urls[r]]}
        for r in ("a", "b")
    ]  # fmt: skip
    data["timing"]["quorum"] = 1  # only the agents observe in this test
    data["prefixes"] = {
        "block_size": BLOCK, "chars_per_token": chars_per_token, "level_tokens": BLOCK,
        "min_sessions": K, "export_interval_s": 0.3, "aggregate_interval_s": 0.3,
    }  # fmt: skip
    data["prewarm"] = {"budget_s": 30, "verify": 1}
    return parse_topology(data)


async def send(http: aiohttp.ClientSession, gw: GatewayServer, session: str, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    async with http.post(gw.url + "/v1/completions", json=body,
                         headers={"x-session-id": session}) as r:  # fmt: skip
        assert r.status == 200, await r.text()
        return r.headers["x-tectonic-region"]


async def test_failover_prewarms_the_target_and_vllm_counts_the_hits(
    vllms: tuple[VllmProc, VllmProc],
    etcd: EtcdServer,
    etcd_store: EtcdStore,
    cluster_name: str,
    keys: Keys,
) -> None:
    vllm_a, vllm_b = vllms
    async with aiohttp.ClientSession() as http:
        cpt = len(SYSTEM) / await tokens(http, vllm_a.url, SYSTEM)  # calibrate the proxy
    ports = {"a": free_port(), "b": free_port()}
    topo = topology(etcd, cluster_name, ports, {"a": vllm_a.url, "b": vllm_b.url}, cpt)
    async with running_replica(topo) as cp:
        agents: list[AgentHandle] = []
        gw = GatewayServer(GatewayOptions(topology=topo, app=AppConfig(home="a")))
        try:
            for r, p in (("a", vllm_a), ("b", vllm_b)):
                agents.append(await serve_agent(AgentConfig(
                    region=r, replicas=(p.url,), control_planes=(cp.target,), interval=0.25,
                    timeout=0.25, listen=f"127.0.0.1:{ports[r]}",
                )))  # fmt: skip
            await gw.start()
            await _scenario(http_for(), gw, etcd_store, keys, vllm_a, vllm_b)
        finally:
            await gw.stop()
            for h in agents:
                await h.stop(grace=0)


def http_for() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))


async def _scenario(
    http: aiohttp.ClientSession, gw: GatewayServer, store: EtcdStore, keys: Keys,
    vllm_a: VllmProc, vllm_b: VllmProc,
) -> None:  # fmt: skip
    async with http:
        # 1. Traffic homed in a: SESSIONS sessions share SYSTEM, each asks its own question.
        for turn in range(2):
            for s in range(SESSIONS):
                prompt = f"{SYSTEM}\nUser {s} asks question {turn}: where is my order?"
                assert await send(http, gw, f"user-{s}", prompt) == "a"

        catalog: PrefixCatalog | None = None

        async def catalogued() -> bool:
            nonlocal catalog
            kv = await store.get(keys.prefixes("a"))
            catalog = None if kv is None else decode(PrefixCatalog, kv.value, kv.key)
            return catalog is not None and any(e.payload for e in catalog.entries)

        await until(catalogued, within=30, every=0.2, what="a's prefix catalog")
        assert catalog is not None
        payloads = [e.payload for e in catalog.entries if e.payload]
        assert all(SYSTEM.startswith(p.prompt or "-") for p in payloads)  # cut from SYSTEM
        system_tokens = await tokens(http, vllm_b.url, SYSTEM)

        # 2. Region a's vLLM dies; the control plane fails a over to b and pre-warms b.
        vllm_a.kill()
        record: RegionRecord | None = None

        async def prewarmed() -> bool:
            nonlocal record
            kv = await store.get(keys.region_state("a"))
            record = None if kv is None else decode(RegionRecord, kv.value, kv.key)
            fo = None if record is None else record.failover
            return fo is not None and FailoverStep.PREWARM in fo.done

        await until(prewarmed, within=60, every=0.2, what="a failed over and b pre-warmed")
        assert record is not None and record.failover is not None
        assert record.state is RegionState.FAILING_OVER
        assert not record.failover.plan.warm_first  # hard down: switched first
        result = record.failover.prewarm_result
        assert result["prefixes_total"] >= 1
        assert result["attained_fraction"] == 1.0
        assert result["verified"] >= 1 and result["verified_hit_rate"] > 0.5
        # the replay (vLLM's usage) covered the shared prompt to its last counted level
        replayed = int(result["prompt_tokens"])
        assert replayed >= system_tokens - 2 * BLOCK, (replayed, system_tokens)

        # 3. The first request for the top prefix in b: vLLM counts the pre-warmed hits.
        prompt = f"{SYSTEM}\nUser 99 asks a first question: can I change my address?"
        _, hits0 = await cache_counters(http, vllm_b.url)
        assert await send(http, gw, "newcomer", prompt) == "b"
        _, hits1 = await cache_counters(http, vllm_b.url)
        assert hits1 - hits0 >= replayed - BLOCK, (hits1 - hits0, replayed)

        # 4. Without pre-warm the same first request hits nothing.
        async with http.post(vllm_b.url + "/reset_prefix_cache") as r:
            assert r.status == 200
        _, hits2 = await cache_counters(http, vllm_b.url)
        assert await send(http, gw, "newcomer-2", prompt) == "b"
        _, hits3 = await cache_counters(http, vllm_b.url)
        assert hits3 - hits2 == 0
        await asyncio.sleep(0)
