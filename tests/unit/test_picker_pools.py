"""The endpoint picker over model pools (docs/models.md), on the real session stores,
routing cache and resolvers over a MemoryStore: a request goes to its model's pool,
read from the body or, in header-only mode, from ``x-tectonic-model``; without that
header (with pools) or for a model no pool answers, the request is refused with
vLLM's words; a conversation pinned to another region's pool goes to that region's
entry."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import encode
from controlplane.kernel.config import parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import FeatureFlags
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.store.memory import MemoryStore
from regions.dataplane.admission import Admission
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.models import ModelRoutes, home_units, pool_sites
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.routing_cache import RoutingCache
from regions.dataplane.sessions import SessionResolver
from regions.picker.pick import Answer, Pick, Picker, PickerConfig

MODELS = {"chat": "llama-3", "code": "qwen-coder"}
ENTRIES = {"east": "10.0.0.100:10000", "west": "10.1.0.100:10000"}
TOPOLOGY = parse_topology(
    {
        "cluster": "test",
        "regions": [
            {
                "name": r,
                "zone": "us",
                "entry": ENTRIES[r],
                "pools": [
                    {
                        "name": p,
                        "models": [m],
                        "agent": "127.0.0.1:9",
                        "capacity_rps": 10,
                        "replicas": [f"http://10.{i}.{j}.1:8000"],
                    }
                    for j, (p, m) in enumerate(MODELS.items())
                ],
            }
            for i, r in enumerate(ENTRIES)
        ],
    }
)


class World:
    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        clock = FakeClock(60.0 * 20_000)
        self.store = MemoryStore(clock=clock.now)
        self.routing = RoutingCache(self.store, keys, retry_s=0.01, max_retry_s=0.02)
        metrics = DataPlaneMetrics()
        homes = home_units(TOPOLOGY, "east")
        self.stores = {
            f: SessionStore(self.store, keys, regions=units, clock=clock, family=f)
            for f, units in TOPOLOGY.families().items()
        }
        routes = ModelRoutes(
            TOPOLOGY,
            "east",
            {
                f: SessionResolver(s, self.routing, homes[f], metrics, clock=clock)
                for f, s in self.stores.items()
            },
        )
        admission = Admission(routes, metrics, lambda r: FeatureFlags(), chars=256)
        sites, local = pool_sites(TOPOLOGY, "east")
        config = PickerConfig(
            home="east",
            zones=TOPOLOGY.spill_groups(),
            entries={r.name: r.entry for r in TOPOLOGY.regions if r.entry},
            sites=sites,
            local=local,
        )
        balancers = {r.name: ReplicaBalancer(r.replicas) for r in TOPOLOGY.regions}
        self.picker = Picker(config, admission, self.routing, routes, balancers, metrics)

    async def route(self, unit: str, routing: Routing) -> None:
        await self.store.put(self.keys.routing(unit), encode(routing))
        await self.routing.load()


@pytest.fixture
async def world(keys: Keys) -> AsyncIterator[World]:
    w = World(keys)
    await w.routing.load()
    yield w
    await w.picker.close()


def body(model: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()


def hdrs(session: str = "s1", **extra: str) -> dict[str, str]:
    return {":path": "/v1/chat/completions", ":method": "POST", "x-session-id": session, **extra}


async def test_the_body_model_picks_its_pool_and_each_conversation_is_pinned_apart(
    world: World,
) -> None:
    for pool, model in MODELS.items():
        got = await world.picker.pick(hdrs(), body(model), None)
        assert isinstance(got, Pick) and got.region == f"east.{pool}"
        assert got.endpoints[0] == TOPOLOGY.region(f"east.{pool}").replicas[0].split("//")[1]
    for pool in MODELS:
        pin = await world.stores[pool].get("s1")
        assert pin is not None and pin[0].region == f"east.{pool}"


async def test_header_only_mode_reads_the_model_header_and_refuses_without_it(
    world: World,
) -> None:
    got = await world.picker.pick(hdrs(**{"x-tectonic-model": "qwen-coder"}), None, None)
    assert isinstance(got, Pick) and got.region == "east.code"
    refused = await world.picker.pick(hdrs(), None, None)
    assert isinstance(refused, Answer) and refused.status == 400
    assert "x-tectonic-model" in json.loads(refused.body)["error"]["message"]
    # what is no generation needs no model; one pool's model list goes to that pool
    # (the picker answers the list of all of them itself: tests/integration/
    # test_gateway_models.py, with real replicas; these are not, so nothing answers)
    models = {":path": "/v1/models", ":method": "GET"}
    listing = await world.picker.pick({**models, "x-tectonic-model": "qwen-coder"}, None, None)
    assert isinstance(listing, Pick) and listing.region == "east.code"
    union = await world.picker.pick(models, None, None)
    assert isinstance(union, Answer) and union.status == 503
    unknown = await world.picker.pick(hdrs(**{"x-tectonic-model": "mistral"}), None, None)
    assert isinstance(unknown, Answer) and unknown.status == 404
    assert json.loads(unknown.body)["error"]["message"] == "The model `mistral` does not exist."


async def test_a_pool_failed_over_to_another_region_goes_to_that_regions_entry(
    world: World,
) -> None:
    await world.route("east.code", Routing(targets={"west.code": 1.0}, epoch=2))
    code = await world.picker.pick(hdrs("s2"), body("qwen-coder"), None)
    assert isinstance(code, Pick) and code.region == "west.code"
    assert code.endpoints == (ENTRIES["west"],)  # the other region's Envoy, one hop
    chat = await world.picker.pick(hdrs("s2"), body("llama-3"), None)
    assert isinstance(chat, Pick) and chat.region == "east.chat"  # the other pool stays
