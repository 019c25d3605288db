"""The gateway over model pools (docs/models.md), as a process on a real etcd in front
of simulator processes that each serve one model name: the official ``openai`` client
streams from the right pool, ``/v1/models`` lists every pool's model (at the gateway,
and at the endpoint picker, which answers it itself), an unknown model is vLLM's 404,
and a session's conversation with each model is pinned on its own, so that one model's
pool failing over moves only that model's conversations."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
import yaml

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, launch_simulator, wait_ready
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.config import load_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import FeatureFlags
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.memory import MemoryStore
from regions.dataplane.admission import Admission
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.models import ModelRoutes, home_units
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.routing_cache import RoutingCache
from regions.dataplane.sessions import SessionResolver
from regions.picker.pick import Answer, Picker, PickerConfig
from tests.integration.gateway_helpers import (
    Deployment,
    gateway_at,
    http,
    pin_of,
    set_routing,
)

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

FIXTURES = (http,)
MODELS = {"chat": "llama-3", "code": "qwen-coder"}
REGIONS = ("east", "west")


@pytest.fixture
def pooled(etcd: EtcdServer, cluster_name: str, tmp_path: Path) -> Iterator[Deployment]:
    """One simulator per (region, pool), serving that pool's model name."""
    procs: dict[str, Proc] = {}
    try:
        for r in REGIONS:
            for pool, model in MODELS.items():
                procs[f"{r}.{pool}"] = launch_simulator(model=model, name=f"{r}-{pool}")
        for unit, p in procs.items():
            procs[unit] = wait_ready(p)
        topo = {
            "cluster": cluster_name,
            "etcd": {"endpoints": list(etcd.endpoints)},
            "regions": [
                {
                    "name": r,
                    "zone": "us",
                    "pools": [
                        {
                            "name": pool,
                            "models": [model],
                            "agent": f"127.0.0.1:{9 + i}",
                            "capacity_rps": 100,
                            "replicas": [procs[f"{r}.{pool}"].url],
                        }
                        for i, (pool, model) in enumerate(MODELS.items())
                    ],
                }
                for r in REGIONS
            ],
        }
        path = tmp_path / "topology.yaml"
        path.write_text(yaml.safe_dump(topo))
        d = Deployment(cluster_name, path, tuple(etcd.endpoints), procs=list(procs.values()))
        yield d
    finally:
        for p in [*procs.values(), *(d.procs if "d" in locals() else ())]:
            p.kill()


async def test_the_openai_client_reaches_each_models_pool_and_lists_both(
    pooled: Deployment, http: aiohttp.ClientSession
) -> None:
    gw = await asyncio.to_thread(pooled.gateway, "east")
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    try:
        listed = await client.models.list()
        assert {m.id for m in listed.data} == set(MODELS.values())
        for pool, model in MODELS.items():
            raw = await client.chat.completions.with_raw_response.create(
                model=model,
                messages=[{"role": "user", "content": f"hello {pool}"}],
                max_tokens=8,
                stream=True,
                extra_headers={"x-session-id": "conv-1"},
            )
            assert raw.headers["x-tectonic-region"] == f"east.{pool}"
            chunks = [c async for c in raw.parse()]
            assert chunks and {c.model for c in chunks} == {model}
        with pytest.raises(openai.NotFoundError) as e:
            await client.completions.create(model="mistral", prompt="hi", max_tokens=1)
        # the gateway's own answer, in vLLM's words: no replica was asked
        assert e.value.response.headers.get("x-tectonic-region") is None
        err = e.value.response.json()["error"]
        assert (err["message"], err["type"], err["param"], err["code"]) == (
            "The model `mistral` does not exist.",
            "NotFoundError",
            "model",
            404,
        )
    finally:
        await client.close()


async def ask(http: aiohttp.ClientSession, gw: str, model: str, session: str) -> str:
    body = {"model": model, "prompt": "same conversation", "max_tokens": 2}
    async with http.post(
        gw + "/v1/completions", json=body, headers={"x-session-id": session}
    ) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["x-tectonic-region"]


async def test_one_pool_failing_over_moves_only_that_models_conversations(
    pooled: Deployment, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    gw = await asyncio.to_thread(pooled.gateway, "east")
    sessions = [f"s{i}" for i in range(6)]
    for s in sessions:
        assert await ask(http, gw.url, "llama-3", s) == "east.chat"
        assert await ask(http, gw.url, "qwen-coder", s) == "east.code"
    # one session, two conversations: each pinned under its own pool's key
    chat_pin, code_pin = await pin_of_family(etcd_store, keys, "s0")
    assert (chat_pin, code_pin) == ("east.chat", "east.code")
    assert await pin_of(etcd_store, keys, "s0") is None  # no pool-less pin was written
    # the code pool of east fails over (what the leader writes: its routing only)
    rev = await set_routing(
        etcd_store, keys, "east.code", Routing(targets={"west.code": 1.0}, epoch=2)
    )
    await gateway_at(http, gw.url, rev)
    for s in sessions:
        assert await ask(http, gw.url, "qwen-coder", s) == "west.code"
        assert await ask(http, gw.url, "llama-3", s) == "east.chat"
    # and stays there, one region at a time, for every later turn
    for s in sessions:
        assert await ask(http, gw.url, "qwen-coder", s) == "west.code"
    assert await pin_of_family(etcd_store, keys, "s3") == ("east.chat", "west.code")


async def pin_of_family(store: EtcdStore, keys: Keys, session: str) -> tuple[str, str]:
    regions = []
    for family in MODELS:
        kv = await store.get(keys.session(session, family))
        assert kv is not None, f"no pin of {session} for {family}"
        regions.append(kv.value.decode())
    chat, code = (r.split('"region":"', 1)[1].split('"', 1)[0] for r in regions)
    return chat, code


async def test_the_picker_answers_the_model_list_of_every_pool(pooled: Deployment) -> None:
    """Behind Envoy, the picker answers ``/v1/models`` itself with every pool's list
    (Envoy would forward it to one replica of one pool)."""
    topo = load_topology(pooled.topology)
    keys, clock = Keys(topo.cluster), SystemClock()
    store = MemoryStore()
    routing = RoutingCache(store, keys)
    await routing.load()
    metrics = DataPlaneMetrics()
    homes = home_units(topo, "east")
    routes = ModelRoutes(
        topo,
        "east",
        {
            f: SessionResolver(
                SessionStore(store, keys, regions=units, clock=clock, family=f),
                routing,
                homes[f],
                metrics,
            )
            for f, units in topo.families().items()
        },
    )
    admission = Admission(routes, metrics, lambda r: FeatureFlags(), chars=256)
    balancers = {r.name: ReplicaBalancer(r.replicas) for r in topo.regions}
    picker = Picker(PickerConfig(home="east"), admission, routing, routes, balancers, metrics)
    try:
        got = await picker.pick({":path": "/v1/models", ":method": "GET"}, None, None)
    finally:
        await picker.close()
    assert isinstance(got, Answer) and got.status == 200, got
    assert {m["id"] for m in json.loads(got.body)["data"]} == set(MODELS.values())
