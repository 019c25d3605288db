"""The gateway as a process, on a real etcd, in front of simulator processes: what it
answers.

No serving region gets 503 with Retry-After; malformed requests get 4xx with a JSON error
(a replica's own 4xx passes through); its route table answers unknown paths, other
methods, ``Expect`` and a chunked body over the limit; the official ``openai`` client
streams through it, and not.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest

from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.gateway_helpers import (
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


async def test_no_region_serving_gets_503_with_retry_after(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    gw = await asyncio.to_thread(deployment.gateway, "east")
    assert (await complete(http, gw.url, "pinned-before"))[0] == 200
    await set_routing(etcd_store, keys, "east", Routing(targets={}, epoch=5))
    rev = await set_routing(etcd_store, keys, "west", Routing(targets={}, epoch=5))
    await gateway_at(http, gw.url, rev)
    for session in ("pinned-before", "brand-new"):
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
        async with http.post(
            gw.url + "/v1/completions", json=body, headers={"x-session-id": session}
        ) as resp:
            assert resp.status == 503
            assert int(resp.headers["Retry-After"]) >= 1
            err = (await resp.json())["error"]
            assert err["type"] == "ServiceUnavailableError" and err["message"]


async def test_malformed_requests_get_4xx_with_a_json_error(
    deployment: Deployment, http: aiohttp.ClientSession
) -> None:
    gw = await asyncio.to_thread(deployment.gateway, "east", "--max-body-bytes", "4096")
    chat = "/v1/chat/completions"
    cases: list[tuple[str, bytes, dict[str, str], int, str | None]] = [
        ("/v1/completions", b"{not json", {}, 400, None),
        ("/v1/completions", b"[1, 2]", {}, 400, None),
        ("/v1/completions", json.dumps({"prompt": "x"}).encode(), {}, 400, "model"),
        ("/v1/completions", json.dumps({"model": "tiny"}).encode(), {}, 400, "prompt"),
        ("/v1/completions", json.dumps({"model": "tiny", "prompt": 7}).encode(), {}, 400, "prompt"),
        (chat, json.dumps({"model": "tiny"}).encode(), {}, 400, "messages"),
        (chat, json.dumps({"model": "tiny", "messages": []}).encode(), {}, 400, "messages"),
        (chat, json.dumps({"model": "tiny", "messages": ["hi"]}).encode(), {}, 400, "messages"),
        (
            chat,
            json.dumps(
                {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}
            ).encode(),
            {},
            400,
            "stream",
        ),
        (
            "/v1/completions",
            json.dumps({"model": "tiny", "prompt": "x" * 5000}).encode(),
            {},
            413,
            None,
        ),
        (
            "/v1/completions",
            json.dumps({"model": "tiny", "prompt": "x"}).encode(),
            {"x-session-id": "a/b"},
            400,
            None,
        ),
    ]
    for path, body, headers, status, param in cases:
        async with http.post(
            gw.url + path, data=body, headers={"content-type": "application/json", **headers}
        ) as resp:
            assert resp.status == status, (path, body[:60], await resp.text())
            err = (await resp.json())["error"]
            assert err["message"] and err["code"] == status
            assert param is None or err["param"] == param, err
    # The replica's own 4xx passes through unchanged (here: an unknown model).
    async with http.post(
        gw.url + "/v1/completions",
        json={"model": "nope", "prompt": "x"},
        headers={"x-session-id": "s"},
    ) as resp:
        assert resp.status == 404 and resp.headers["x-tectonic-region"] == "east"
    assert await metric(http, gw.url, "tectonic_gateway_errors_total") >= len(cases)


async def test_routes_methods_expect_and_a_chunked_body_over_the_limit(
    deployment: Deployment, http: aiohttp.ClientSession
) -> None:
    """The gateway's own route table (aiohttp's low-level server, no router): unknown
    paths 404, a known path with another method 405 naming the allowed ones, HEAD on the
    GET routes, ``Expect`` answered, a chunked body bounded like a sized one."""
    gw = await asyncio.to_thread(deployment.gateway, "east", "--max-body-bytes", "4096")
    async with http.get(gw.url + "/v1/nothing") as resp:
        assert resp.status == 404
    async with http.get(gw.url + "/v1/completions") as resp:
        assert resp.status == 405 and resp.headers["Allow"] == "POST"
    async with http.post(gw.url + "/health") as resp:
        assert resp.status == 405 and set(resp.headers["Allow"].split(",")) == {"GET", "HEAD"}
    async with http.head(gw.url + "/health") as resp:
        assert resp.status == 200
    body = {"model": "tiny", "prompt": "expect me", "max_tokens": 1}
    async with http.post(
        gw.url + "/v1/completions", json=body, expect100=True, headers={"x-session-id": "e"}
    ) as resp:
        assert resp.status == 200 and (await resp.json())["choices"]
    async with http.post(
        gw.url + "/v1/completions", json=body, headers={"Expect": "sideways"}
    ) as resp:
        assert resp.status == 417 and "sideways" in (await resp.json())["error"]["message"]

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    async with http.post(gw.url + "/v1/completions", data=chunks()) as resp:
        assert resp.status == 413 and (await resp.json())["error"]["code"] == 413


async def test_streaming_and_not_with_the_official_openai_client(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys
) -> None:
    gw = await asyncio.to_thread(deployment.gateway, "west")
    headers = {"x-session-id": "openai-1"}
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["tiny"]
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "tell me a story"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
        )
        pieces: list[str] = []
        usage = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        assert len(pieces) >= 2 and "".join(pieces).strip()
        assert usage is not None and usage.completion_tokens == 12
        raw = await client.completions.with_raw_response.create(
            model="tiny", prompt="once upon a time", max_tokens=5, extra_headers=headers
        )
        assert raw.headers["x-tectonic-region"] == "west"
        completion = raw.parse()
        assert completion.choices[0].text and completion.usage is not None
        text_stream = await client.completions.create(
            model="tiny", prompt="count:", max_tokens=6, stream=True, extra_headers=headers
        )
        assert "".join([c.choices[0].text async for c in text_stream if c.choices])
    pin = await pin_of(etcd_store, keys, "openai-1")
    assert pin is not None and pin.region == "west"


async def test_the_request_id_goes_to_the_model_server_and_back(
    deployment: Deployment, http: aiohttp.ClientSession
) -> None:
    """The client's x-request-id, else one the gateway makes, reaches the model server
    (the simulator, like vLLM, makes it its answer's id) and comes back in the answer,
    streamed or not; ``--log-format json`` makes every log line one JSON object (that
    a line names the request it was written for: tests/unit/test_logs.py)."""
    gw = await asyncio.to_thread(deployment.gateway, "east", "--log-format", "json")
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    url = gw.url + "/v1/completions"
    async with http.post(url, json=body, headers={"x-request-id": "req-abc-1"}) as resp:
        assert resp.status == 200 and resp.headers["x-request-id"] == "req-abc-1"
        assert (await resp.json())["id"] == "cmpl-req-abc-1"
    async with http.post(url, json=body) as resp:
        made = resp.headers["x-request-id"]
        assert resp.status == 200 and len(made) == 32
        assert (await resp.json())["id"] == f"cmpl-{made}"
    async with http.post(url, json={**body, "stream": True}) as resp:
        made = resp.headers["x-request-id"]
        assert resp.status == 200 and len(made) == 32
        assert f"cmpl-{made}" in await resp.text()  # every chunk's id
    async with http.post(url, data=b"{not json", headers={"x-request-id": "req-bad"}) as resp:
        assert resp.status == 400 and resp.headers["x-request-id"] == "req-bad"
    lines = [json.loads(line) for line in gw.log_path.read_text().splitlines() if line.strip()]
    assert lines and all(x["component"] == "gateway" and x["msg"] for x in lines)
