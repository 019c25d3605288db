"""A stream survives its replica: the gateway continues a cut generation elsewhere.

Real etcd, an in-process gateway (its registry is read), simulator processes killed
with SIGKILL mid-stream, and the official ``openai`` client streaming. The simulator
decodes like a greedy model (its next word depends on the text so far), so the
continued text must equal the uncut generation's, as it does on vLLM with greedy
decoding and the same weights.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

import aiohttp
import openai
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators, until
from controlplane.kernel.config import Topology, parse_topology
from regions.gateway.server import GatewayServer
from tests.integration.cp_harness import fast_topology, running_gateway

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
SLOW = ("--decode-tokens-per-s", "40")  # a 60-token answer takes 1.5 s: time to cut it
TOKENS = 60
CUT_AT = 8  # content chunks the client has when its replica is killed


def topology(etcd: EtcdServer, cluster: str, replicas: dict[str, Sequence[str]]) -> Topology:
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [
        {**r, "replicas": list(replicas[r["name"]])}
        for r in data["regions"]
        if r["name"] in replicas
    ]
    return parse_topology(data)


@pytest.fixture
def sims() -> Iterator[list[Proc]]:
    procs = start_simulators(3, extra_args=SLOW)
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()


@contextlib.asynccontextmanager
async def gateway(
    etcd: EtcdServer, cluster: str, replicas: dict[str, Sequence[str]]
) -> AsyncIterator[tuple[GatewayServer, openai.AsyncOpenAI]]:
    async with running_gateway(
        topology(etcd, cluster, replicas), "east", prefix_tracking=False
    ) as gw:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        async with client:
            yield gw, client


def count(gw: GatewayServer, name: str, **labels: str) -> float:
    return gw.metrics.registry.get_sample_value(name, {"region": "east", **labels}) or 0.0


def answered(gw: GatewayServer) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return count(gw, "tectonic_gateway_requests_total", code="200") > 0

    return check


def continued(gw: GatewayServer, outcome: str = "continued") -> float:
    return count(gw, "tectonic_gateway_stream_continuations_total", outcome=outcome)


async def running_on(http: aiohttp.ClientSession, sims: Sequence[Proc]) -> Proc:
    """The simulator with a request running (the one to kill)."""
    for _ in range(200):
        for sim in sims:
            async with http.get(sim.url + "/metrics") as r:
                text = await r.text()
            running = [ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running")]
            if any(float(ln.rsplit(" ", 1)[1]) > 0 for ln in running):
                return sim
        await asyncio.sleep(0.01)
    raise AssertionError("no simulator is running the request")


MESSAGES = [{"role": "user", "content": "tell me how failover works"}]


async def chat_reference(sim: Proc) -> str:
    """The uncut generation, straight from a replica."""
    async with openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="x") as direct:
        out = await direct.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=TOKENS,
            temperature=0,  # type: ignore[arg-type]
        )
    return out.choices[0].message.content or ""


async def cut_chat(
    client: openai.AsyncOpenAI,
    sims: Sequence[Proc],
    session: str,
    headers: dict[str, str] | None = None,
    **extra: object,
) -> tuple[str, list[str], list[str | None], object]:
    """Stream a chat, SIGKILL its replica after CUT_AT pieces; the text, the chunk ids,
    the finish reasons and the final usage the client received."""
    answer = await client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-session-id": session, **(headers or {})},
        **extra,  # type: ignore[arg-type]
    )
    text, ids, finishes, usage, pieces = [], [], [], None, 0
    async with aiohttp.ClientSession() as http, answer:
        async for chunk in answer:
            ids.append(chunk.id)
            usage = chunk.usage or usage
            for c in chunk.choices:
                finishes.append(c.finish_reason)
                if c.delta.content:
                    text.append(c.delta.content)
                    pieces += 1
                    if pieces == CUT_AT:
                        (await running_on(http, sims)).kill()
    return "".join(text), ids, [f for f in finishes if f], usage


async def test_a_replica_killed_mid_stream_is_continued_on_another_and_the_text_is_whole(
    etcd: EtcdServer, cluster_name: str, sims: list[Proc]
) -> None:
    east = sims[:2]
    async with gateway(etcd, cluster_name, {"east": [s.url for s in east]}) as (gw, client):
        reference = await chat_reference(sims[2])
        text, ids, finishes, usage = await cut_chat(client, east, "kill-one")
        assert text == reference  # greedy: the continuation is the uncut generation
        assert len(set(ids)) == 1  # one stream, one id
        assert finishes == ["length"]
        assert usage is not None and usage.completion_tokens == TOKENS  # type: ignore[attr-defined]
        assert sum(not s.alive() for s in east) == 1
        await until(answered(gw), within=5, what="the answer counted")  # after the end
        assert continued(gw) == 1
        assert count(gw, "tectonic_gateway_errors_total", kind="stream_broken") == 1
        assert count(gw, "tectonic_gateway_requests_total", code="200") == 1
        assert count(gw, "tectonic_gateway_requests_total", code="502") == 0


async def test_a_region_blacked_out_mid_stream_continues_in_the_sessions_new_region(
    etcd: EtcdServer, cluster_name: str, sims: list[Proc]
) -> None:
    replicas = {"east": [sims[0].url], "west": [sims[1].url]}
    async with gateway(etcd, cluster_name, replicas) as (gw, client):
        reference = await chat_reference(sims[2])
        text, ids, finishes, _ = await cut_chat(client, [sims[0]], "moves-west")
        assert text == reference and len(set(ids)) == 1 and finishes == ["length"]
        assert not sims[0].alive()
        # The session moved with its stream (once), and its next request stays there.
        after = await client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=2,
            extra_headers={"x-session-id": "moves-west"},
        )
        assert after.headers["x-tectonic-region"] == "west"
        assert continued(gw) == 1


async def test_no_continuation_where_the_model_is_not_served_the_cut_stays_visible(
    etcd: EtcdServer, cluster_name: str
) -> None:
    [east] = start_simulators(1, extra_args=SLOW)
    [west] = start_simulators(1, model="another-model", extra_args=SLOW)
    try:
        replicas = {"east": [east.url], "west": [west.url]}
        async with gateway(etcd, cluster_name, replicas) as (gw, client):
            with pytest.raises(openai.APIError, match="failed mid-stream"):
                await cut_chat(client, [east], "no-model")
            assert continued(gw, "failed") == 1
            assert count(gw, "tectonic_gateway_requests_total", code="502") == 1
    finally:
        east.kill()
        west.kill()


async def test_a_tool_call_stream_is_not_continued(
    etcd: EtcdServer, cluster_name: str, sims: list[Proc]
) -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    east = sims[:2]
    async with gateway(etcd, cluster_name, {"east": [s.url for s in east]}) as (gw, client):
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            await cut_chat(client, east, "tools", tools=tools)
        assert continued(gw, "refused") == 1
        assert count(gw, "tectonic_gateway_requests_total", code="502") == 1


async def test_a_request_can_turn_continuation_off(
    etcd: EtcdServer, cluster_name: str, sims: list[Proc]
) -> None:
    east = sims[:2]
    async with gateway(etcd, cluster_name, {"east": [s.url for s in east]}) as (gw, client):
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            await cut_chat(client, east, "off", headers={"x-tectonic-continue": "off"})
        assert continued(gw) == 0


async def test_a_completion_stream_is_continued_from_its_prompt_and_text(
    etcd: EtcdServer, cluster_name: str, sims: list[Proc]
) -> None:
    east = sims[:2]
    prompt = "Once upon a time in a region far away"
    async with gateway(etcd, cluster_name, {"east": [s.url for s in east]}) as (gw, client):
        async with openai.AsyncOpenAI(base_url=sims[2].url + "/v1", api_key="x") as direct:
            ref = await direct.completions.create(model="tiny", prompt=prompt, max_tokens=TOKENS)
        stream = await client.completions.create(
            model="tiny", prompt=prompt, max_tokens=TOKENS, stream=True
        )
        text, pieces = [], 0
        async with aiohttp.ClientSession() as http, stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    text.append(chunk.choices[0].text)
                    pieces += 1
                    if pieces == CUT_AT:
                        (await running_on(http, east)).kill()
        assert "".join(text) == ref.choices[0].text
        assert continued(gw) == 1


async def test_an_in_band_engine_error_is_continued_and_never_reaches_the_client(
    etcd: EtcdServer, cluster_name: str, sims: list[Proc]
) -> None:
    faulty, healthy = sims[0], sims[1]
    async with aiohttp.ClientSession() as http:
        async with http.post(faulty.url + "/_sim/fault", json={"stream_error_after": 5}) as r:
            assert r.status == 200  # vLLM's error event after 5 tokens, then [DONE]
        replicas = {"east": [faulty.url], "west": [healthy.url]}
        async with gateway(etcd, cluster_name, replicas) as (gw, client):
            reference = await chat_reference(sims[2])
            answer = await client.chat.completions.create(
                model="tiny",
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=TOKENS,
                temperature=0,
                stream=True,
                extra_headers={"x-session-id": "inband"},
            )
            text = []
            async with answer:
                async for chunk in answer:  # an error event would raise here
                    if chunk.choices and chunk.choices[0].delta.content:
                        text.append(chunk.choices[0].delta.content)
            assert "".join(text) == reference
            assert continued(gw) == 1
