"""The region agent's pre-warm against simulator processes, through its gRPC API.

Warmed means vLLM's counters say so: after the agent replays a prefix, the first full
prompt that the gateway's balancer sends to that region hits the prefix cache for the
replayed prefix (less at most one block), on the replica the balancer picked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import aiohttp
import grpc
import pytest
from tectonic_api.v1 import agent_pb2 as apb
from tectonic_api.v1 import agent_pb2_grpc as apb_grpc

from chaos.lab.procs import Proc, start_simulators
from controlplane.agent_prewarm import AgentPrewarmer
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import FailoverPlan
from controlplane.kernel.prefix.catalog import CatalogEntry, PrefixCatalog
from controlplane.kernel.prefix.identity import PromptKind
from controlplane.kernel.prefix.prewarm import ReplayPayload
from controlplane.kernel.store.memory import MemoryStore
from regions.agent.prewarm_executor import HITS, cache_counters
from regions.agent.prewarm_plan import assign, routing_text
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from regions.agent.service import PrewarmServiceConfig
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.ring import prefix_key

BLOCK = 16
N_REPLICAS = 4
N_PREFIXES = 24


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Proc]]:
    procs = start_simulators(N_REPLICAS, block_size=BLOCK)
    yield procs
    for p in procs:
        p.terminate()


@pytest.fixture
async def agent(sims: list[Proc]) -> AsyncIterator[AgentHandle]:
    async with aiohttp.ClientSession() as http:
        for s in sims:  # each test starts from cold caches
            async with http.post(s.url + "/reset_prefix_cache") as r:
                assert r.status == 200
    handle = await serve_agent(
        AgentConfig(region="b", replicas=tuple(s.url for s in sims), interval=5, timeout=1),
        prewarm=PrewarmServiceConfig(per_replica_concurrency=2),
    )
    yield handle
    await handle.stop(grace=0)


def system_prompt(i: int) -> str:
    # distinct from the first characters on, so each routes on its own
    return f"tenant {i:03d} system prompt: " + " ".join(f"rule{i}-{j}" for j in range(120))


def payload(i: int) -> ReplayPayload:
    text = system_prompt(i)
    return ReplayPayload(
        key=f"k{i:03d}",
        kind=PromptKind.TEXT,
        model="tiny",
        prompt=text,
        blocks=8,
        block_size=BLOCK,
        tokens=8 * BLOCK,
        tokens_exact=False,
    )


async def prewarm(handle: AgentHandle, req: apb.PrewarmRequest) -> list[apb.PrewarmProgress]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}") as ch:
        stub = apb_grpc.RegionAgentStub(ch)  # type: ignore[no-untyped-call]
        return [m async for m in stub.Prewarm(req, timeout=60)]


async def complete(http: aiohttp.ClientSession, url: str, prompt: str) -> int:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return int((await r.json())["usage"]["prompt_tokens"])


async def test_prewarm_lands_where_the_gateway_routes_and_vllm_counts_hits(
    agent: AgentHandle, sims: list[Proc]
) -> None:
    payloads = [payload(i) for i in range(N_PREFIXES)]
    req = apb.PrewarmRequest(
        failover_id="a@1",
        source="a",
        budget_s=30,
        verify=4,
        payloads=[p.model_dump_json().encode() for p in payloads],
    )
    msgs = await prewarm(agent, req)
    final = msgs[-1]
    assert final.done and not any(m.done for m in msgs[:-1])
    assert (final.total, final.warmed, final.failed) == (N_PREFIXES, N_PREFIXES, 0)
    assert final.attainment == 1.0
    assert final.replicas_active == N_REPLICAS
    assert final.verified == 4 and final.verified_hit_rate > 0.8  # from vLLM's counters
    # The prefixes spread over the replicas (else the routing test below proves little).
    plan = assign(payloads, [s.url for s in sims])
    assert sum(1 for idx in plan.values() if idx) >= 3

    # The gateway's own balancer picks the replica for each user prompt; its first
    # request finds the prefix warm there.
    balancer = ReplicaBalancer([s.url for s in sims])
    async with aiohttp.ClientSession() as http:
        for i, p in enumerate(payloads):
            prompt = system_prompt(i) + f" user question number {i}: why?"
            replica = balancer.choose(prefix_key(routing_text(p)))
            assert replica is not None
            _, hits0 = await cache_counters(http, replica)
            await complete(http, replica, prompt)
            _, hits1 = await cache_counters(http, replica)
            async with http.post(
                replica + "/tokenize", json={"model": "tiny", "prompt": p.prompt}
            ) as r:
                prefix_tokens = (await r.json())["count"]
            assert hits1 - hits0 >= prefix_tokens - BLOCK, (i, hits1 - hits0, prefix_tokens)
    assert final.prompt_tokens >= N_PREFIXES * 8 * BLOCK  # vLLM's usage of the replays


def chosen_differently(payloads: list[ReplayPayload], urls: list[str], chars: int) -> list[int]:
    """The payloads whose replica differs between ``chars`` and the default length: the
    routing-length tests prove something only on those."""
    moved = [
        i
        for i, p in enumerate(payloads)
        if assign([p], urls, prefix_chars=chars) != assign([p], urls)
    ]
    assert len(moved) >= 3
    return moved


async def warm_where_gateways_route(
    payloads: list[ReplayPayload], which: list[int], urls: list[str], chars: int
) -> None:
    """A user prompt on each of ``which`` payloads, sent where a gateway routing by
    ``chars`` characters sends it, finds the prefix cached there."""
    balancer = ReplicaBalancer(urls)
    async with aiohttp.ClientSession() as http:
        for i in which:
            p = payloads[i]
            replica = balancer.choose(prefix_key(routing_text(p, chars), chars))
            assert replica is not None
            _, hits0 = await cache_counters(http, replica)
            await complete(http, replica, system_prompt(i) + f" user question {i}?")
            _, hits1 = await cache_counters(http, replica)
            assert hits1 - hits0 >= p.tokens - BLOCK, (i, replica, hits1 - hits0)


async def test_prewarm_hashes_the_characters_the_gateways_route_by(
    agent: AgentHandle, sims: list[Proc]
) -> None:
    """The leader sends the topology's prefixes.routing_chars; the agent's plan must use
    it, or a deployment whose gateways route by another length than the default gets
    every prefix warmed on a replica its gateways do not send it to."""
    chars = 23  # "tenant NNN system promp": still distinct per tenant
    payloads = [payload(i) for i in range(N_PREFIXES)]
    urls = [s.url for s in sims]
    moved = chosen_differently(payloads, urls, chars)
    req = apb.PrewarmRequest(
        failover_id="a@chars",
        source="a",
        budget_s=30,
        routing_chars=chars,
        payloads=[p.model_dump_json().encode() for p in payloads],
    )
    final = (await prewarm(agent, req))[-1]
    assert final.done and final.warmed == N_PREFIXES
    await warm_where_gateways_route(payloads, moved, urls, chars)


async def test_the_leaders_prewarm_sends_the_topologys_routing_chars(
    agent: AgentHandle, sims: list[Proc]
) -> None:
    """The other half: the leader's pre-warmer (the control plane's side, on a catalog in
    the store) tells the agent the topology's prefixes.routing_chars."""
    chars = 23
    payloads = [payload(i) for i in range(N_PREFIXES)]
    urls = [s.url for s in sims]
    moved = chosen_differently(payloads, urls, chars)
    topo = Topology.model_validate(
        {
            "cluster": "chars",
            "regions": [
                {"name": "a", "zone": "z", "agent": "127.0.0.1:1", "capacity_rps": 10},
                {"name": "b", "zone": "z", "agent": f"127.0.0.1:{agent.port}", "capacity_rps": 10},
            ],
            "prefixes": {"block_size": BLOCK, "routing_chars": chars},
        }
    )
    keys, store = Keys("chars"), MemoryStore()
    catalog = PrefixCatalog(
        region="a",
        at=0.0,
        params=topo.prefixes.params,
        min_sessions=1,
        shared_prefixes=N_PREFIXES,
        entries=tuple(
            CatalogEntry(key=p.key, count=100 - i, sessions=3, payload=p)
            for i, p in enumerate(payloads)
        ),
    )
    await store.put(keys.prefixes("a"), encode(catalog))
    prewarmer = AgentPrewarmer(
        topo, store, keys, SystemClock(), min_sessions=1, fraction=1.0, verify=0
    )
    plan = FailoverPlan(source="a", targets={"b": 1.0}, reason="test", actor="t")
    result = await prewarmer.prewarm(plan, 30.0, "a@leader")
    assert result.prefixes_warmed == N_PREFIXES, result
    await warm_where_gateways_route(payloads, moved, urls, chars)


async def test_without_prewarm_the_first_request_hits_nothing(
    agent: AgentHandle, sims: list[Proc]
) -> None:
    async with aiohttp.ClientSession() as http:
        replica = sims[0].url
        _, h0 = await cache_counters(http, replica)
        await complete(http, replica, system_prompt(7) + " first question")
        _, h1 = await cache_counters(http, replica)
    assert h1 - h0 == 0


async def test_a_repeat_for_the_same_failover_joins_instead_of_replaying(
    agent: AgentHandle, sims: list[Proc]
) -> None:
    payloads = [payload(i).model_dump_json().encode() for i in range(6)]
    req = apb.PrewarmRequest(failover_id="a@2", source="a", budget_s=30, payloads=payloads)
    first, second = await asyncio.gather(prewarm(agent, req), prewarm(agent, req))
    async with aiohttp.ClientSession() as http:
        queries = [(await cache_counters(http, s.url))[0] for s in sims]
        again = await prewarm(agent, req)  # finished: reported, not replayed
        after = [(await cache_counters(http, s.url))[0] for s in sims]
    assert first[-1].warmed == second[-1].warmed == again[-1].warmed == 6
    assert after == queries


async def test_budget_cuts_the_replay_and_attainment_says_so(agent: AgentHandle) -> None:
    payloads = [payload(i).model_dump_json().encode() for i in range(N_PREFIXES)]
    req = apb.PrewarmRequest(failover_id="a@3", source="a", budget_s=0.001, payloads=payloads)
    final = (await prewarm(agent, req))[-1]
    assert final.done and final.total == N_PREFIXES
    assert final.warmed < N_PREFIXES
    assert final.attainment == pytest.approx(final.warmed / N_PREFIXES)


@pytest.mark.parametrize(
    ("req", "needle"),
    [
        (apb.PrewarmRequest(failover_id="", budget_s=1), "failover_id"),
        (apb.PrewarmRequest(failover_id="x", budget_s=0), "budget_s"),
        (apb.PrewarmRequest(failover_id="x", budget_s=1, payloads=[b"{}"]), "payloads[0]"),
    ],
)
async def test_bad_requests_are_refused_and_start_nothing(
    agent: AgentHandle, req: apb.PrewarmRequest, needle: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await prewarm(agent, req)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (e.value.details() or "")
    assert agent.service is not None and not agent.service._runs


async def test_describe_reports_vllm_block_size_and_kv_capacity(
    agent: AgentHandle, sims: list[Proc]
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{agent.port}") as ch:
        stub = apb_grpc.RegionAgentStub(ch)  # type: ignore[no-untyped-call]
        d = await stub.Describe(apb.DescribeRequest(), timeout=10)
    assert d.region == "b" and d.block_size == BLOCK and d.replicas_active == N_REPLICAS
    async with aiohttp.ClientSession() as http, http.get(sims[0].url + "/metrics") as r:
        text = await r.text()
    per_replica = int(text.split('num_gpu_blocks="')[1].split('"')[0])
    assert d.kv_capacity_blocks == N_REPLICAS * per_replica
    assert HITS in text
