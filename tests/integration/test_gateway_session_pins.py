"""The gateway as a process, on a real etcd, in front of simulator processes: sessions.

A session stays on one region (its pin in etcd names it); the session key falls back to
the request's ``user`` field when the session header is absent; two gateways agree on
every session, also when both see a new session at the same moment.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.gateway_helpers import (
    HALF,
    REGIONS,
    Deployment,
    complete,
    deployment,
    gateway_at,
    http,
    metric,
    pin_of,
    procs_cleanup,
    set_routing,
)

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

# The harness's fixtures (gateway_helpers.py), imported for pytest to find them by name.
FIXTURES = (deployment, http, procs_cleanup)


async def test_sessions_stay_on_one_region(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    rev = await set_routing(etcd_store, keys, "east", HALF)
    gw = await asyncio.to_thread(deployment.gateway, "east")
    await gateway_at(http, gw.url, rev)
    sessions = [f"stay-{i}" for i in range(24)]
    seen: dict[str, set[str]] = {s: set() for s in sessions}
    for round_ in range(5):
        results = await asyncio.gather(
            *(complete(http, gw.url, s, f"turn {round_} of {s}") for s in sessions)
        )
        for s, (status, region) in zip(sessions, results, strict=True):
            assert status == 200
            seen[s].add(region)
    assert all(len(regions) == 1 for regions in seen.values()), seen
    assert {r for regions in seen.values() for r in regions} == set(REGIONS)  # both used
    for s in sessions:
        pin = await pin_of(etcd_store, keys, s)
        assert pin is not None and {pin.region} == seen[s] and pin.home == "east"
    assert await metric(http, gw.url, "tectonic_gateway_consistency_violations_total") == 0
    assert await metric(http, gw.url, "tectonic_gateway_session_moves_total") == 0


async def test_session_key_falls_back_to_the_user_field(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    gw = await asyncio.to_thread(deployment.gateway, "west", "--session-header", "X-Conv")
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1, "user": "alice"}
    async with http.post(gw.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200 and resp.headers["x-tectonic-region"] == "west"
    async with http.post(
        gw.url + "/v1/completions", json=body, headers={"x-conv": "conv-7"}
    ) as resp:
        assert resp.status == 200
    assert (await pin_of(etcd_store, keys, "alice")) is not None
    assert (await pin_of(etcd_store, keys, "conv-7")) is not None  # the header wins


async def test_two_gateways_agree_on_every_session(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    rev = await set_routing(etcd_store, keys, "east", HALF)
    gws = await asyncio.gather(
        asyncio.to_thread(deployment.gateway, "east"),
        asyncio.to_thread(deployment.gateway, "west"),
    )
    for g in gws:
        await gateway_at(http, g.url, rev)
    sessions = [f"agree-{i}" for i in range(30)]
    # First requests race: both gateways see each new session at the same moment.
    first = await asyncio.gather(*(complete(http, g.url, s) for s in sessions for g in gws))
    later = await asyncio.gather(
        *(complete(http, gws[i % 2].url, s) for i, s in enumerate(sessions * 3))
    )
    served: dict[str, set[str]] = {s: set() for s in sessions}
    for s, (status, region) in zip([s for s in sessions for _ in gws], first, strict=True):
        assert status == 200
        served[s].add(region)
    for s, (status, region) in zip(sessions * 3, later, strict=True):
        assert status == 200
        served[s].add(region)
    for s in sessions:
        pin = await pin_of(etcd_store, keys, s)
        assert pin is not None and served[s] == {pin.region}, (s, served[s], pin)
    homes = {(await pin_of(etcd_store, keys, s)).home for s in sessions}  # type: ignore[union-attr]
    assert homes <= set(REGIONS)
    for g in gws:
        assert await metric(http, g.url, "tectonic_gateway_consistency_violations_total") == 0
