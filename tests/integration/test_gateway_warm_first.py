"""Warm first, on a real etcd with an in-process gateway in front of two simulators.

East failed over to west and is recovering (``routing/east`` splits new sessions
50/50); a tenant's prompt has been served at west only. A new session whose weighted
choice is east is placed at west and pinned there, while the gateway replays the
prompt once at east; the next such session is then served at east from its prefix
cache (the simulator's ``cached_tokens``). A prompt never answered before, and
sessions whose choice is west, are never steered; a gateway with warm first off sends
the session to its cold choice; a failover makes the gateway forget what east held,
and when east serves again the gateway replays there the prompts east had answered
(recall).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators, until
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.resolve import SessionPin, placement
from controlplane.kernel.store.etcd import EtcdStore
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer
from tests.integration.cp_harness import fast_topology

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
RECOVERING = Routing(targets={"east": 0.5, "west": 0.5}, epoch=2)
FAILED_OVER = Routing(targets={"west": 1.0}, epoch=1)
# Distinct first characters: each prompt has its own ring key; ~600 simulator tokens.
TENANT = "Tenant A system prompt. " + "alpha beta gamma delta " * 150
OTHER = "Tenant B system prompt. " + "omega sigma kappa zeta " * 150


@pytest.fixture(scope="module")
def simulators() -> Iterator[dict[str, Proc]]:
    east, west = start_simulators(2, extra_args=("--enable-prompt-tokens-details",))
    try:
        yield {"east": east, "west": west}
    finally:
        east.kill()
        west.kill()


def topology(etcd: EtcdServer, cluster: str, sims: dict[str, Proc]) -> Topology:
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [
        {**r, "replicas": [sims[r["name"]].url]} for r in data["regions"] if r["name"] in sims
    ]
    return parse_topology(data)


async def started(topo: Topology, *, warm_first: bool = True) -> GatewayServer:
    gw = GatewayServer(
        GatewayOptions(
            topology=topo, app=AppConfig(home="east", warm_first=warm_first), prefix_tracking=False
        )
    )
    await gw.start()
    return gw


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def route(store: EtcdStore, keys: Keys, gws: list[GatewayServer], r: Routing) -> None:
    await store.put(keys.routing("east"), encode(r))

    async def seen() -> bool:
        return all(gw.routing.routings.get("east") == r for gw in gws)

    await until(seen, within=10, what="the gateways seeing routing/east")


async def ask(
    http: aiohttp.ClientSession, gw: GatewayServer, session: str, prompt: str
) -> tuple[str, int]:
    """The serving region and the prompt tokens the replica had cached."""
    body = {"model": "tiny", "prompt": prompt + "\nQ: which rule?", "max_tokens": 2}
    async with http.post(
        gw.url + "/v1/completions", json=body, headers={"x-session-id": session}
    ) as r:
        answer = await r.json()
        assert r.status == 200, answer
        cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        return r.headers["x-tectonic-region"], int(cached)


def warmups(gw: GatewayServer, outcome: str, way: str = "steered") -> float:
    value = gw.metrics.registry.get_sample_value(
        "tectonic_gateway_warmups_total", {"region": "east", "way": way, "outcome": outcome}
    )
    return value or 0.0


async def test_a_new_session_goes_where_its_prompt_is_warm_while_the_cold_region_warms(
    etcd: EtcdServer,
    cluster_name: str,
    etcd_store: EtcdStore,
    keys: Keys,
    simulators: dict[str, Proc],
    http: aiohttp.ClientSession,
) -> None:
    topo = topology(etcd, cluster_name, simulators)
    await etcd_store.put(keys.routing("east"), encode(FAILED_OVER))
    gw = await started(topo)
    plain = await started(topo, warm_first=False)
    try:
        # During the failover the tenant's sessions are served at west: warm there.
        assert (await ask(http, gw, "during-failover", TENANT))[0] == "west"
        await route(etcd_store, keys, [gw, plain], RECOVERING)
        where = placement(gw.routing.routings, "east")
        homed = (f"new-{i}" for i in itertools.count() if where.pick(f"new-{i}") == "east")

        # East is cold for the tenant: the session is placed (and pinned) at west.
        first = next(homed)
        assert (await ask(http, gw, first, TENANT))[0] == "west"
        kv = await etcd_store.get(keys.session(first))
        assert kv is not None
        pin = decode(SessionPin, kv.value, kv.key)
        assert (pin.home, pin.region) == ("east", "west")

        async def warmed() -> bool:
            return warmups(gw, "ok") == 1.0

        await until(warmed, within=10, what="the warm-up at east")
        # Warm now: the next new session follows its weighted choice, and hits the cache.
        region, cached = await ask(http, gw, next(homed), TENANT)
        assert region == "east" and cached >= 512  # the prompt's full blocks
        assert (await ask(http, gw, first, TENANT))[0] == "west"  # pinned: never moved

        # A prompt this gateway never had answered: cold everywhere, the weights decide.
        assert (await ask(http, gw, next(homed), "Tenant D, new. " + TENANT))[0] == "east"
        # West is never steered away from, even for a prompt it has not seen.
        away = next(f"w-{i}" for i in itertools.count() if where.pick(f"w-{i}") == "west")
        assert (await ask(http, gw, away, OTHER))[0] == "west"
        # Warm first off: a session choosing east goes there cold.
        region, cached = await ask(http, plain, next(homed), TENANT.replace("A", "C", 1))
        assert region == "east" and cached == 0
        assert warmups(gw, "ok") == 1.0 and warmups(gw, "failed") == 0.0

        # A failover forgets what east held (its replicas may come back empty) ...
        assert gw.warm_ups is not None and gw.warm_ups.warmth.count("east") == 2
        await route(etcd_store, keys, [gw, plain], FAILED_OVER)
        assert gw.warm_ups.warmth.count("east") == 0
        async with http.post(simulators["east"].url + "/reset_prefix_cache") as r:
            assert r.status == 200  # as a restarted replica would be

        # ... and once east serves again the gateway replays, there, what east answered.
        await route(etcd_store, keys, [gw, plain], RECOVERING)

        async def recalled() -> bool:
            return warmups(gw, "ok", "recall") == 1.0

        await until(recalled, within=10, what="the recall of the tenant's prompt at east")
        region, cached = await ask(http, gw, next(homed), TENANT)
        assert region == "east" and cached >= 512
    finally:
        await gw.stop()
        await plain.stop()
