"""Residency through the whole pre-warm path: the leader's ``AgentPrewarmer`` reads a
catalog, chooses, and streams the choice to real region agents whose replicas are
simulator processes. What reached a replica is read from vLLM's counters there.

- a private prefix (seen from fewer than K sessions) never leaves its region, even
  when a catalog carries its payload and it is the most frequent;
- an EU prefix never reaches a US region, even when a failover sends EU traffic there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from chaos.lab.procs import Proc, start_simulators
from controlplane.agent_prewarm import AgentPrewarmer
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import FailoverPlan, PrewarmFigures
from controlplane.kernel.prefix.catalog import CatalogEntry, PrefixCatalog
from controlplane.kernel.prefix.identity import FingerprintParams, PromptKind
from controlplane.kernel.prefix.prewarm import ReplayPayload
from controlplane.kernel.prefix.sealing import Keyring, generate_key, seal_payload
from controlplane.kernel.store.memory import MemoryStore
from regions.agent.prewarm_executor import cache_counters
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from regions.agent.service import PrewarmServiceConfig

BLOCK = 16
K = 3


def text(name: str) -> str:
    return f"{name} instructions: " + " ".join(f"{name}-rule-{j}" for j in range(100))


def entry(name: str, count: int, sessions: int) -> CatalogEntry:
    p = ReplayPayload(
        key=name,
        kind=PromptKind.TEXT,
        model="tiny",
        prompt=text(name),
        blocks=8,
        block_size=BLOCK,
        tokens=8 * BLOCK,
        tokens_exact=False,
    )
    return CatalogEntry(key=name, count=count, sessions=sessions, payload=p)


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Proc]]:
    procs = start_simulators(2, block_size=BLOCK)  # one replica each for eu-west, us-east
    yield procs
    for p in procs:
        p.terminate()


@pytest.fixture
async def agents(sims: list[Proc]) -> AsyncIterator[dict[str, AgentHandle]]:
    handles = {
        name: await serve_agent(AgentConfig(region=name, replicas=(sim.url,), interval=5))
        for name, sim in zip(("eu-west", "us-east"), sims, strict=True)
    }
    yield handles
    for h in handles.values():
        await h.stop(grace=0)


def topology(agents: dict[str, AgentHandle]) -> Topology:
    def region(name: str, zone: str, agent: str) -> dict[str, object]:
        return {"name": name, "zone": zone, "agent": agent, "capacity_rps": 100}

    return parse_topology(
        {
            "regions": [
                region("eu-central", "eu", "127.0.0.1:9"),
                region("eu-west", "eu", f"127.0.0.1:{agents['eu-west'].port}"),
                region("us-east", "us", f"127.0.0.1:{agents['us-east'].port}"),
            ]
        }
    )


async def first_hits(http: aiohttp.ClientSession, replica: str, prompt: str) -> float:
    _, h0 = await cache_counters(http, replica)
    body = {"model": "tiny", "prompt": prompt + " and a question", "max_tokens": 1}
    async with http.post(replica + "/v1/completions", json=body) as r:
        assert r.status == 200
    _, h1 = await cache_counters(http, replica)
    return h1 - h0


async def test_private_and_cross_zone_prefixes_never_leave(
    agents: dict[str, AgentHandle], sims: list[Proc]
) -> None:
    topo = topology(agents)
    store, keys, clock = MemoryStore(), Keys(topo.cluster), FakeClock()
    catalog = PrefixCatalog(
        region="eu-central",
        at=clock.now(),
        params=FingerprintParams(block_size=BLOCK),
        min_sessions=K,
        shared_prefixes=300,  # top 1 % = 3 entries
        entries=(entry("private", 900, 1), entry("shared", 500, K), entry("team", 400, K + 1)),
    )
    await store.put(keys.prefixes("eu-central"), encode(catalog))
    plan = FailoverPlan(
        source="eu-central",
        targets={"eu-west": 0.5, "us-east": 0.5},
        forced=True,
        reason="test: region lost",
        actor="test",
    )
    result = await AgentPrewarmer(topo, store, keys, clock, min_sessions=K).prewarm(
        plan, 30.0, "eu-central@1"
    )
    # Counted per target: eu-west may take shared + team; us-east nothing (other zone);
    # the private prefix is refused for both.
    assert result.prefixes_total == 2 and result.prefixes_warmed == 2
    assert result.attained_fraction == 1.0
    assert result.skipped["few_sessions"] == 1  # eu-west: private
    assert result.skipped["other_zone"] == 3  # us-east: all three
    eu, us = (s.url for s in sims)
    async with aiohttp.ClientSession() as http:
        assert await first_hits(http, eu, text("shared")) > 0
        assert await first_hits(http, eu, text("team")) > 0
        assert await first_hits(http, eu, text("private")) == 0
        for name in ("private", "shared", "team"):
            assert await first_hits(http, us, text(name)) == 0


async def test_no_catalog_warms_nothing_and_says_so(agents: dict[str, AgentHandle]) -> None:
    topo = topology(agents)
    plan = FailoverPlan(source="eu-central", targets={"eu-west": 1.0}, reason="t", actor="t")
    result = await AgentPrewarmer(topo, MemoryStore(), Keys(), FakeClock()).prewarm(
        plan, 30.0, "x@1"
    )
    assert result.prefixes_total == 0 and result.catalog_entries == 0


async def test_an_unreachable_agent_costs_its_prefixes_not_the_failover(
    agents: dict[str, AgentHandle],
) -> None:
    topo = topology(agents)
    store, keys, clock = MemoryStore(), Keys(topo.cluster), FakeClock()
    catalog = PrefixCatalog(
        region="eu-west",
        at=clock.now(),
        params=FingerprintParams(),
        min_sessions=K,
        shared_prefixes=100,
        entries=(entry("s", 9, K),),
    )
    await store.put(keys.prefixes("eu-west"), encode(catalog))
    plan = FailoverPlan(source="eu-west", targets={"eu-central": 1.0}, reason="t", actor="t")
    result = await AgentPrewarmer(topo, store, keys, clock).prewarm(plan, 5.0, "eu-west@1")
    assert result.targets_unreachable == 1
    assert result.prefixes_total == 1 and (result.prefixes_warmed or 0) == 0
    assert result.attained_fraction == 0


async def test_sealed_payloads_warm_only_on_an_agent_holding_the_zones_key(
    agents: dict[str, AgentHandle], sims: list[Proc], tmp_path: Path
) -> None:
    """docs/residency.md: the leader passes sealed payloads on unread; an agent without
    the zone's key warms nothing and the pre-warm's figures say why; one with it warms
    each prefix as if it had been in clear."""
    keys_dir = tmp_path / "eu"
    keys_dir.mkdir()
    (keys_dir / "eu-1").write_text(generate_key())
    (keys_dir / "active").write_text("eu-1")
    ring, params = Keyring.load(keys_dir), FingerprintParams(block_size=BLOCK)
    entries = tuple(
        e.model_copy(update={"payload": seal_payload(e.payload, ring, params)})
        for e in (entry("sealed-a", 500, K), entry("sealed-b", 400, K + 1))
        if e.payload is not None
    )
    catalog = PrefixCatalog(
        region="eu-central",
        at=0.0,
        params=params,
        min_sessions=K,
        shared_prefixes=200,  # top 1 % = 2 entries
        entries=entries,
    )
    assert "sealed-a instructions" not in encode(catalog).decode()
    plan = FailoverPlan(source="eu-central", targets={"eu-west": 1.0}, reason="t", actor="t")
    eu = sims[0].url

    async def prewarm(topo: Topology, run: str) -> PrewarmFigures:
        store, clock = MemoryStore(), FakeClock()
        await store.put(Keys(topo.cluster).prefixes("eu-central"), encode(catalog))
        prewarmer = AgentPrewarmer(topo, store, Keys(topo.cluster), clock, min_sessions=K)
        return await prewarmer.prewarm(plan, 30.0, run)

    # the fixture's eu-west agent was given no key
    result = await prewarm(topology(agents), "eu-central@2")
    assert result.prefixes_total == 2 and (result.prefixes_warmed or 0) == 0
    assert result.skipped["no_key"] == 2 and result.attained_fraction == 0
    async with aiohttp.ClientSession() as http:
        assert await first_hits(http, eu, text("sealed-a")) == 0

    keyed = await serve_agent(
        AgentConfig(
            region="eu-west",
            replicas=(eu,),
            interval=5,
            prewarm=PrewarmServiceConfig(payload_keys=str(keys_dir)),
        )
    )
    try:
        result = await prewarm(topology({**agents, "eu-west": keyed}), "eu-central@3")
    finally:
        await keyed.stop(grace=0)
    assert result.prefixes_warmed == 2 and result.attained_fraction == 1.0
    assert result.skipped.get("no_key", 0) == 0
    async with aiohttp.ClientSession() as http:
        assert await first_hits(http, eu, text("sealed-b")) > 0
