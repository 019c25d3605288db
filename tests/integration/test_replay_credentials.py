"""Warm-first replays carry no user credentials, on a real etcd with an in-process
gateway (security item 2).

East failed over to west and is recovering; a tenant's prompt, sent with the user's
``Authorization`` and ``Cookie``, was answered at west (a simulator). A new session
whose weighted choice is east is placed at west and the gateway replays the prompt at
east, whose replica here is a tiny server recording each request's headers: the replay
arrives without the user's credentials, with the data plane's own key when the gateway
has one, and what the gateway keeps for later replays holds no ``Authorization``.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators, until
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.resolve import placement
from controlplane.kernel.store.etcd import EtcdStore
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer
from tests.integration.cp_harness import fast_topology
from tests.recording_replica import Recorder, recording_replica

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
RECOVERING = Routing(targets={"east": 0.5, "west": 0.5}, epoch=2)
FAILED_OVER = Routing(targets={"west": 1.0}, epoch=1)
TENANT = "Tenant A system prompt. " + "alpha beta gamma delta " * 150
USER = {
    "Authorization": "Bearer user-secret",
    "Cookie": "session=user-cookie",
    "X-Tenant-Token": "tenant-secret",
}


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    async with recording_replica() as rec:
        yield rec


@pytest.fixture(scope="module")
def west() -> Iterator[Proc]:
    [sim] = start_simulators(1)
    try:
        yield sim
    finally:
        sim.kill()


def topology(etcd: EtcdServer, cluster: str, urls: dict[str, str]) -> Topology:
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [
        {**r, "replicas": [urls[r["name"]]]} for r in data["regions"] if r["name"] in urls
    ]
    data.setdefault("prefixes", {})["replay_strip_headers"] = ["x-tenant-token"]
    return parse_topology(data)


def warmups(gw: GatewayServer, outcome: str) -> float:
    value = gw.metrics.registry.get_sample_value(
        "tectonic_gateway_warmups_total", {"region": "east", "way": "steered", "outcome": outcome}
    )
    return value or 0.0


@pytest.mark.parametrize("api_key", [None, "dp-key"])
async def test_a_warm_first_replay_carries_no_user_credentials(
    etcd: EtcdServer,
    cluster_name: str,
    etcd_store: EtcdStore,
    keys: Keys,
    west: Proc,
    recorder: Recorder,
    api_key: str | None,
) -> None:
    topo = topology(etcd, cluster_name, {"east": recorder.url, "west": west.url})
    await etcd_store.put(keys.routing("east"), encode(FAILED_OVER))
    gw = GatewayServer(
        GatewayOptions(
            topology=topo,
            app=AppConfig(home="east", warm_first=True),
            replay_api_key=api_key,  # what --replay-api-key-file reads
        ),
    )
    await gw.start()
    assert gw.warm_ups is not None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:

            async def ask(session: str) -> str:
                body = {"model": "tiny", "prompt": TENANT + "\nQ: which rule?", "max_tokens": 2}
                headers = {**USER, "x-session-id": session, "x-request-id": f"req-{session}"}
                async with http.post(gw.url + "/v1/completions", json=body, headers=headers) as r:
                    assert r.status == 200, await r.text()
                    return r.headers["x-tectonic-region"]

            # During the failover the tenant is served at west, with its credentials.
            assert await ask("during-failover") == "west"
            # What the gateway keeps to replay there holds none of them.
            [(_, kept)] = gw.warm_ups.memory.ranked("west", 5)
            names = {k.lower() for k, _ in kept.headers}
            assert not names & {"authorization", "cookie", "x-tenant-token"}, kept.headers
            assert "user-secret" not in repr(kept) and "user-cookie" not in repr(kept)

            await etcd_store.put(keys.routing("east"), encode(RECOVERING))

            async def seen() -> bool:
                return gw.routing.routings.get("east") == RECOVERING

            await until(seen, within=10, what="the gateway seeing routing/east")
            where = placement(gw.routing.routings, "east")
            homed = next(f"new-{i}" for i in itertools.count() if where.pick(f"new-{i}") == "east")
            assert await ask(homed) == "west"  # east is cold: steered, and replayed at east

            async def warmed() -> bool:
                return warmups(gw, "ok") == 1.0

            await until(warmed, within=10, what="the warm-up at east")
    finally:
        await gw.stop()
    [replayed] = recorder.seen  # east got the replay, and nothing else
    assert "cookie" not in replayed and "x-tenant-token" not in replayed, replayed
    assert "user-secret" not in repr(replayed) and "user-cookie" not in repr(replayed)
    assert replayed.get("authorization") == (f"Bearer {api_key}" if api_key else None)
    # A request of its own, named after the one it replays (kernel/logs.py).
    assert replayed.get("x-request-id") == f"req-{homed}-warm", replayed
