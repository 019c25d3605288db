"""The prefix pipeline end to end on a real etcd: requests through a gateway (in
process) to a simulator, the gateway's export on its lease, the control-plane
leader's merge into ``prefixes/<region>``, and a replay body that vLLM accepts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators, until
from controlplane.kernel.codec import decode
from controlplane.kernel.config import PrefixesConfig, Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.prefix.catalog import PrefixCatalog
from controlplane.kernel.prefix.identity import PromptKind, PromptRequest, levels
from controlplane.kernel.store.etcd import EtcdStore
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer
from tests.integration.cp_harness import fast_topology, running_replica

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

PREFIXES: dict[str, object] = {
    "block_size": 16,
    "chars_per_token": 4.0,
    "level_tokens": 64,  # a level every 256 characters
    "min_sessions": 3,
    "export_interval_s": 0.3,
    "aggregate_interval_s": 0.3,
}
SHARED = ("You are the support assistant of ACME Rockets. Answer briefly and politely. " * 9)[:600]
SOLO = ("Private notes of one user, which must stay in its region for good. " * 10)[:600]
SYSTEM = ("System: you translate English into formal French, nothing else. " * 10)[:600]


@pytest.fixture
def simulator() -> Iterator[Proc]:
    [sim] = start_simulators(1)
    try:
        yield sim
    finally:
        sim.kill()


def topology(etcd: EtcdServer, cluster: str, sim: Proc) -> Topology:
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [{**r, "replicas": [sim.url]} for r in data["regions"][:2]]
    data["prefixes"] = PREFIXES
    return parse_topology(data)


@pytest.fixture
async def gateway(
    etcd: EtcdServer, cluster_name: str, simulator: Proc
) -> AsyncIterator[GatewayServer]:
    topo = topology(etcd, cluster_name, simulator)
    async with running_replica(topo):
        gw = GatewayServer(GatewayOptions(topology=topo, app=AppConfig(home="east")))
        await gw.start()
        try:
            yield gw
        finally:
            await gw.stop()


async def send(
    http: aiohttp.ClientSession, gw: GatewayServer, session: str, body: dict[str, object]
) -> str:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    async with http.post(gw.url + path, json=body, headers={"x-session-id": session}) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["x-tectonic-region"]


def keys_of(prompt: str) -> list[str]:
    """The level keys a gateway counts for ``prompt``."""
    params = PrefixesConfig.model_validate(PREFIXES).params
    return [lv.key for lv in levels(PromptRequest("tiny", prompt=prompt), params)]


async def test_shared_prefixes_reach_the_leaders_catalog_with_replay_payloads(
    gateway: GatewayServer, etcd_store: EtcdStore, keys: Keys, simulator: Proc
) -> None:
    served: set[str] = set()
    async with aiohttp.ClientSession() as http:
        for turn in range(2):
            for s in range(4):  # four sessions share SHARED, each with its own question
                body = {"model": "tiny", "prompt": SHARED + f" Q{turn}{s}?", "max_tokens": 1}
                served.add(await send(http, gateway, f"shared-{s}", body))
            for s in range(3):
                chat = [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Good morning number {turn}{s}"},
                ]
                served.add(
                    await send(http, gateway, f"chat-{s}", {"model": "tiny", "messages": chat})
                )
        for _ in range(3):  # one session only: counted, never exported
            served.add(await send(http, gateway, "solo", {"model": "tiny", "prompt": SOLO}))
    [region] = served

    shared_keys, solo_keys = keys_of(SHARED), keys_of(SOLO)
    catalog: PrefixCatalog | None = None

    async def merged() -> bool:
        nonlocal catalog
        kv = await etcd_store.get(keys.prefixes(region))
        if kv is None:
            return False
        catalog = decode(PrefixCatalog, kv.value, kv.key)
        have = {e.key for e in catalog.entries if e.payload is not None}
        chats = any(e.payload.kind is PromptKind.CHAT for e in catalog.entries if e.payload)
        solo = all(k in {e.key for e in catalog.entries} for k in solo_keys)
        return shared_keys[-1] in have and chats and solo  # all traffic merged

    await until(merged, within=30, every=0.1, what="the shared prefix in the catalog")
    assert catalog is not None and catalog.gateways == 1 and catalog.min_sessions == 3
    by_key = {e.key: e for e in catalog.entries}
    payload = by_key[shared_keys[-1]].payload
    assert payload is not None and by_key[shared_keys[-1]].sessions == 3
    body = json.loads(payload.request_body())
    assert body["model"] == "tiny" and len(body["prompt"]) == 512
    assert SHARED.startswith(body["prompt"])  # the same prompt, cut at a level
    for key in solo_keys:  # seen 3 times, from 1 session: no payload left the gateway
        assert key in by_key and by_key[key].sessions == 1 and by_key[key].payload is None

    replay = next(e.payload for e in catalog.entries if e.payload and e.payload.kind == "chat")
    assert replay.messages is not None and SYSTEM.startswith(replay.messages[0].content)
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            simulator.url + payload.endpoint,
            data=payload.request_body(),
            headers={"content-type": "application/json"},
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()  # the replay is a valid request

    # The export lives on the gateway's lease: stopped, it goes within 3 intervals.
    [export] = (await etcd_store.get_prefix(keys.prefix_exports_prefix())).kvs
    assert export.lease != 0
    await gateway.stop()

    async def gone() -> bool:
        return await etcd_store.get(export.key) is None

    await until(gone, within=15, every=0.2, what="the stopped gateway's export expiring")
    assert await asyncio.wait_for(etcd_store.get(keys.prefixes(region)), 5) is not None
