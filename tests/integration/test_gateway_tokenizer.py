"""vLLM's ``/tokenize`` and ``/detokenize`` through a gateway process, on a real etcd,
in front of simulator processes (the harness in ``gateway_helpers.py``).

They reach a replica of the region a request without a session goes to (the same
choice as a completion with the same prompt), pin no session, stay out of the
first-token histogram, spill like any request that has not started; paths the
gateway does not serve are answered as vLLM answers them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from chaos.lab.local_etcd import EtcdServer
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.gateway_helpers import (
    HALF,
    REGIONS,
    Deployment,
    deploy,
    gateway_at,
    metric,
    set_routing,
)

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
JsonObj = dict[str, Any]  # decoded JSON, checked by the asserts
FIRST_TOKENS = "tectonic_gateway_first_token_seconds_count"


@pytest.fixture
def deployment(etcd: EtcdServer, cluster_name: str, tmp_path: Path) -> Iterator[Deployment]:
    """One simulator per region (east, west), no gateway yet."""
    d = deploy(tmp_path, cluster_name, etcd.endpoints, per_region=1)
    try:
        yield d
    finally:
        for p in d.procs:
            p.kill()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(
    http: aiohttp.ClientSession, url: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, str, JsonObj]:
    """POST ``body`` as JSON: (status, serving region, decoded answer)."""
    async with http.post(url, json=body, headers=headers) as resp:
        data = await resp.json()
        assert isinstance(data, dict), data
        return resp.status, resp.headers.get("x-tectonic-region", ""), data


async def test_tokenize_and_detokenize_reach_a_replica_of_the_sessionless_region(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    """With east's routing split between east and west, each prompt is tokenized in the
    region a completion of that prompt without a session goes to (both regions serve
    some), the answers are the replicas' own, nothing is pinned even with a session
    header, and the requests are counted but not as first tokens."""
    rev = await set_routing(etcd_store, keys, "east", HALF)
    gw = await asyncio.to_thread(deployment.gateway, "east")
    await gateway_at(http, gw.url, rev)
    direct = deployment.sims["east"][0].url
    regions: set[str] = set()
    for i in range(16):
        prompt = f"prompt {i}: which region tokenizes this?"
        completion = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
        status, completed_in, _ = await post(http, gw.url + "/v1/completions", completion)
        assert status == 200
        first_tokens = await metric(http, gw.url, FIRST_TOKENS)
        tok = {"model": "tiny", "prompt": prompt, "add_special_tokens": False}
        status, region, got = await post(
            http, gw.url + "/tokenize", tok, headers={"x-session-id": f"tok-{i}"}
        )
        assert (status, region) == (200, completed_in), got
        assert got == (await post(http, direct + "/tokenize", tok))[2]
        detok = {"model": "tiny", "tokens": got["tokens"]}  # keyed by its ids: any region
        status, region, text = await post(http, gw.url + "/detokenize", detok)
        assert (status, region in REGIONS, text) == (200, True, {"prompt": prompt})
        assert await metric(http, gw.url, FIRST_TOKENS) == first_tokens
        regions.add(region)
    assert regions == set(REGIONS)
    messages = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    status, region, got = await post(http, gw.url + "/tokenize", messages)
    assert status == 200 and region in REGIONS and got["count"] == len(got["tokens"]) > 0
    assert (await etcd_store.get_prefix(keys.sessions_prefix())).kvs == []  # nothing pinned
    assert await metric(http, gw.url, "tectonic_gateway_requests_total") == 16 * 3 + 1


async def test_tokenizer_errors_are_the_replicas_and_unknown_paths_vllms(
    deployment: Deployment, http: aiohttp.ClientSession
) -> None:
    """A body the replica refuses comes back as the replica's vLLM error (the gateway
    only routes it); an unknown path or method gets what vLLM (FastAPI) answers."""
    gw = await asyncio.to_thread(deployment.gateway, "west")
    async with http.post(gw.url + "/tokenize", data=b"{not json") as resp:
        assert resp.status == 400 and resp.headers["x-tectonic-region"] == "west"
        error = (await resp.json())["error"]
        assert (error["type"], error["code"]) == ("BadRequestError", 400), error
    status, region, got = await post(http, gw.url + "/detokenize", {"model": "nope", "tokens": []})
    assert (status, region, got["error"]["type"]) == (404, "west", "NotFoundError"), got
    async with http.get(gw.url + "/v1/no-such-path") as resp:
        assert resp.status == 404 and resp.content_type == "application/json"
        assert await resp.json() == {"detail": "Not Found"}
    async with http.get(gw.url + "/tokenize") as resp:
        assert resp.status == 405 and resp.headers["Allow"] == "POST"
        assert await resp.json() == {"detail": "Method Not Allowed"}


async def test_tokenize_spills_when_no_replica_of_its_region_answers(
    deployment: Deployment, http: aiohttp.ClientSession
) -> None:
    gw = await asyncio.to_thread(deployment.gateway, "east")
    for p in deployment.sims["east"]:
        await asyncio.to_thread(p.kill)
    status, region, got = await post(http, gw.url + "/tokenize", {"prompt": "still answered"})
    assert (status, region) == (200, "west") and got["count"] > 0, got
    assert await metric(http, gw.url, "tectonic_gateway_spills_total") == 1
