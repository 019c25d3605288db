"""The region agent's Prometheus ``/metrics`` over HTTP (``--metrics-listen``), on a real
agent running a warm pool of simulator processes, published to a real etcd: the pool's
states and its wakes, the probes of its ACTIVE replicas and a pre-warm through the
agent's gRPC API, all read back from the scrape."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tectonic_api.v1 import agent_pb2 as apb
from tectonic_api.v1 import agent_pb2_grpc as apb_grpc

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import until
from controlplane.kernel.prefix.identity import PromptKind
from controlplane.kernel.prefix.prewarm import ReplayPayload
from regions.agent.cli import parse_args
from regions.agent.pool_config import parse_pool_config
from regions.agent.server import AgentConfig, AgentHandle, serve_agent

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
async def agent(etcd: EtcdServer, cluster_name: str) -> AsyncIterator[AgentHandle]:
    pool = parse_pool_config({"launcher": {"kind": "simulator"}, "active": 1, "warm": 1})
    config = AgentConfig(
        region="eu",
        pool=pool,
        etcd=etcd.endpoints,
        cluster=cluster_name,
        metrics_listen="127.0.0.1:0",
        interval=0.5,
        timeout=0.4,
    )
    handle = await serve_agent(config)
    try:
        yield handle
    finally:
        await handle.stop(grace=0)


async def scrape(handle: AgentHandle) -> Samples:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{handle.metrics_port}/metrics") as r,
    ):
        assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
        text = await r.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset({"region": "eu", **labels}.items())))


def states(samples: Samples) -> dict[str, float | None]:
    return {
        s: get(samples, "tectonic_agent_pool_replicas", state=s)
        for s in ("COLD", "WARM", "ACTIVE", "IDLE")
    }


def payload(i: int) -> bytes:
    text = f"tenant {i} system prompt: " + " ".join(f"rule{i}-{j}" for j in range(60))
    return (
        ReplayPayload(
            key=f"k{i}",
            kind=PromptKind.TEXT,
            model="tiny",
            prompt=text,
            blocks=4,
            block_size=16,
            tokens=64,
            tokens_exact=False,
        )
        .model_dump_json()
        .encode()
    )


async def test_pool_states_wakes_probes_and_prewarm_runs_are_scraped(agent: AgentHandle) -> None:
    before = await scrape(agent)
    assert states(before) == {"COLD": 0, "WARM": 1, "ACTIVE": 1, "IDLE": 0}
    # starting the pool woke one replica (launch -> sleep -> wake, never COLD -> ACTIVE)
    assert get(before, "tectonic_agent_pool_activations_total", kind="wake", result="ok") == 1
    assert get(before, "tectonic_agent_pool_activation_duration_seconds_count", kind="wake") == 1
    (active,) = agent.replica_set.active()
    assert get(before, "tectonic_agent_replica_up", endpoint=active) == 1
    assert get(before, "tectonic_agent_prewarm_runs_total", outcome="complete") == 0

    req = apb.PrewarmRequest(
        failover_id="west@1",
        source="west",
        budget_s=30,
        activate=2,
        payloads=[payload(i) for i in range(4)],
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{agent.port}") as ch:
        stub = apb_grpc.RegionAgentStub(ch)  # type: ignore[no-untyped-call]
        final = [m async for m in stub.Prewarm(req, timeout=60)][-1]
    assert final.done and final.warmed == 4 and final.replicas_active == 2

    after = await scrape(agent)
    assert states(after) == {"COLD": 0, "WARM": 0, "ACTIVE": 2, "IDLE": 0}
    assert get(after, "tectonic_agent_pool_activations_total", kind="wake", result="ok") == 2
    assert get(after, "tectonic_agent_prewarm_runs_total", outcome="complete") == 1
    assert get(after, "tectonic_agent_prewarm_prefixes_total", result="warmed") == 4
    assert get(after, "tectonic_agent_prewarm_duration_seconds_count") == 1
    assert get(after, "tectonic_agent_prewarm_running") == 0

    async def both_probed() -> bool:
        got = await scrape(agent)
        return all(
            get(got, "tectonic_agent_replica_up", endpoint=u) == 1
            for u in agent.replica_set.active()
        )

    await until(both_probed, what="the woken replica probed too")


def test_the_flag_is_off_by_default() -> None:
    base = ["--region", "eu", "--control-plane", "127.0.0.1:1", "--replica", "http://a:1"]
    assert parse_args(base).metrics_listen is None
    assert parse_args([*base, "--metrics-listen", "0.0.0.0:9464"]).metrics_listen == "0.0.0.0:9464"
