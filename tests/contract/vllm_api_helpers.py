"""Helpers for the vLLM API contract tests (tests/contract/test_vllm_api_contract*.py):
the sampling that makes a tiny random model answer exactly ``max_tokens`` tokens, the
metrics the adapters read, an HTTP client, requests and event streams checked on the
way, prompts sized with the backend's own tokenizer, the prefix-cache counters, and the
dev-mode admin endpoints."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from chaos.lab.procs import until
from tests.contract.conftest import Backend

JsonObj = dict[str, Any]  # decoded JSON, checked by the asserts
MAX_TOKENS = 8
SAMPLING: JsonObj = {"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True}
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
ADAPTER_METRICS = {  # name of a sample -> the family's "# TYPE" line
    "vllm:prefix_cache_queries_total": "vllm:prefix_cache_queries_total counter",
    "vllm:prefix_cache_hits_total": "vllm:prefix_cache_hits_total counter",
    "vllm:num_requests_waiting": "vllm:num_requests_waiting gauge",
    "vllm:num_requests_running": "vllm:num_requests_running gauge",
    "vllm:kv_cache_usage_perc": "vllm:kv_cache_usage_perc gauge",
    "vllm:time_to_first_token_seconds_bucket": "vllm:time_to_first_token_seconds histogram",
    "vllm:time_to_first_token_seconds_sum": "vllm:time_to_first_token_seconds histogram",
    "vllm:time_to_first_token_seconds_count": "vllm:time_to_first_token_seconds histogram",
    "vllm:cache_config_info": "vllm:cache_config_info gauge",
    "http_requests_total": "http_requests_total counter",  # the agent's request/error rates
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@pytest.fixture(name="http")
async def fixture_http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


async def post_json(
    http: aiohttp.ClientSession, url: str, payload: JsonObj, status: int = 200
) -> JsonObj:
    async with http.post(url, json=payload) as r:
        text = await r.text()
        assert r.status == status, text
        body = json.loads(text)
        assert isinstance(body, dict), text
        return body


async def get_json(http: aiohttp.ClientSession, url: str) -> JsonObj:
    async with http.get(url) as r:
        text = await r.text()
        assert r.status == 200, text
        body = json.loads(text)
        assert isinstance(body, dict), text
        return body


async def sse(http: aiohttp.ClientSession, url: str, payload: JsonObj) -> list[str]:
    """The ``data:`` payloads of an event stream, checking the framing on the way."""
    async with http.post(url, json={**payload, "stream": True}) as r:
        raw = await r.text()
        assert r.status == 200, raw
        assert r.headers["Content-Type"].startswith("text/event-stream"), r.headers
    assert raw.endswith("\n\n"), raw[-200:]
    events = [e for e in raw.split("\n\n") if e]
    for event in events:
        assert event.startswith("data: ") and "\n" not in event, event
    return [e.removeprefix("data: ") for e in events]


def json_chunks(events: list[str]) -> list[JsonObj]:
    """Every event but the last is one JSON object; the last is ``[DONE]``."""
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks and all(isinstance(c, dict) for c in chunks)
    return chunks


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample called exactly ``name``."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            out.append((dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


async def metrics_text(http: aiohttp.ClientSession, server: Backend) -> str:
    async with http.get(server.url + "/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain"), r.headers
        return await r.text()


async def counter(http: aiohttp.ClientSession, server: Backend, name: str) -> float:
    """The model's value of a counter (``model_name`` label = the served name)."""
    found = [
        v
        for lb, v in samples(await metrics_text(http, server), name)
        if lb.get("model_name") == server.model
    ]
    assert len(found) == 1, f"{name} for model {server.model}: {found}"
    return found[0]


async def block_size(http: aiohttp.ClientSession, server: Backend) -> int:
    info = samples(await metrics_text(http, server), "vllm:cache_config_info")
    assert len(info) == 1 and "block_size" in info[0][0], info
    size = int(info[0][0]["block_size"])
    assert size > 0
    return size


async def tokenize(http: aiohttp.ClientSession, server: Backend, **body: Any) -> JsonObj:
    return await post_json(http, server.url + "/tokenize", {"model": server.model, **body})


async def complete(
    http: aiohttp.ClientSession, server: Backend, prompt: str | list[int], **kw: Any
) -> JsonObj:
    payload = {"model": server.model, "prompt": prompt, **SAMPLING, **kw}
    return await post_json(http, server.url + "/v1/completions", payload)


async def long_prompt(
    http: aiohttp.ClientSession, server: Backend, above: int, at_most: int | None = None
) -> str:
    """A fresh prompt (a unique first block) of more than ``above`` tokens (and at most
    ``at_most``), sized with the backend's own ``/tokenize``."""
    head = f"{uuid.uuid4().hex} the region is healthy and traffic flows to"

    async def count(reps: int) -> int:
        return int((await tokenize(http, server, prompt=head + " warm region" * reps))["count"])

    lo, hi = 0, 1  # count(lo) <= above < count(hi)
    while await count(hi) <= above:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if await count(mid) <= above else (lo, mid)
    n = await count(hi)
    assert above < n and (at_most is None or n <= at_most), (above, n, at_most)
    return head + " warm region" * hi


async def send_counted(
    http: aiohttp.ClientSession, server: Backend, prompt: str
) -> tuple[int, float, float]:
    """Send ``prompt`` once (``max_tokens: 1``, a pre-warm prefill); returns its prompt
    tokens and how far ``prefix_cache_queries_total`` / ``_hits_total`` moved."""
    queries = await counter(http, server, "vllm:prefix_cache_queries_total")
    hits = await counter(http, server, "vllm:prefix_cache_hits_total")
    n = check_usage((await complete(http, server, prompt, max_tokens=1))["usage"], 1)

    async def counted() -> bool:
        now = await counter(http, server, "vllm:prefix_cache_queries_total")
        return now >= queries + n

    await until(counted, within=10, what="the prefix-cache queries counter to move")
    return (
        n,
        await counter(http, server, "vllm:prefix_cache_queries_total") - queries,
        await counter(http, server, "vllm:prefix_cache_hits_total") - hits,
    )


def check_usage(usage: JsonObj, completion_tokens: int = MAX_TOKENS) -> int:
    prompt = usage["prompt_tokens"]
    assert isinstance(prompt, int) and prompt > 0, usage
    assert usage["completion_tokens"] == completion_tokens, usage
    assert usage["total_tokens"] == prompt + completion_tokens, usage
    return prompt


def check_head(body: JsonObj, server: Backend, obj: str, prefix: str) -> None:
    assert body["object"] == obj, body
    assert isinstance(body["id"], str) and body["id"].startswith(prefix), body
    assert isinstance(body["created"], int), body
    assert body["model"] == server.model, body


async def timed_stream(
    http: aiohttp.ClientSession, url: str, payload: JsonObj, first: asyncio.Event | None = None
) -> tuple[float, list[JsonObj]]:
    """Stream ``payload``: seconds from sending it to its first ``data:`` event (``first``
    is set then), and its JSON chunks."""
    events: list[str] = []
    sent = time.monotonic()
    arrived = 0.0
    async with http.post(url, json={**payload, "stream": True}) as r:
        assert r.status == 200, await r.text()
        async for raw in r.content:  # one line at a time, as it arrives
            line = raw.decode().strip()
            if not line:
                continue
            if not events:
                arrived = time.monotonic()
                if first is not None:
                    first.set()
            assert line.startswith("data: "), line
            events.append(line.removeprefix("data: "))
    return arrived - sent, json_chunks(events)


def stream_payload(server: Backend, path: str, prompt: str) -> JsonObj:
    if path == CHAT:
        return {
            "model": server.model,
            "messages": [{"role": "user", "content": prompt}],
            **SAMPLING,
        }
    return {"model": server.model, "prompt": prompt, **SAMPLING}


async def detokenize(http: aiohttp.ClientSession, server: Backend, tokens: list[int]) -> str:
    body = await post_json(
        http, server.url + "/detokenize", {"model": server.model, "tokens": tokens}
    )
    assert set(body) == {"prompt"}, body
    text = body["prompt"]
    assert isinstance(text, str), body
    return text


async def http_requests(
    http: aiohttp.ClientSession, server: Backend
) -> dict[tuple[str, ...], float]:
    """``http_requests_total`` by (handler, method, status)."""
    found = samples(await metrics_text(http, server), "http_requests_total")
    return {(lb["handler"], lb["method"], lb["status"]): v for lb, v in found}


# -- dev-mode admin ------------------------------------------------------------------------
async def admin_post(
    http: aiohttp.ClientSession, server: Backend, path: str, **params: str
) -> object:
    """POST a dev-mode admin endpoint; 200 expected; its JSON body (None when empty)."""
    async with http.post(server.url + path, params=params) as r:
        text = await r.text()
        assert r.status == 200, text
    return json.loads(text) if text else None


async def reset_prefix_cache(http: aiohttp.ClientSession, server: Backend) -> object:
    return await admin_post(http, server, "/reset_prefix_cache")


async def sleep(http: aiohttp.ClientSession, server: Backend) -> object:
    return await admin_post(http, server, "/sleep", level="1")


async def wake_up(http: aiohttp.ClientSession, server: Backend) -> object:
    return await admin_post(http, server, "/wake_up")


async def is_sleeping(http: aiohttp.ClientSession, server: Backend) -> bool:
    body = await get_json(http, server.url + "/is_sleeping")
    assert set(body) == {"is_sleeping"} and isinstance(body["is_sleeping"], bool), body
    return bool(body["is_sleeping"])


async def sleep_state(http: aiohttp.ClientSession, server: Backend) -> dict[str, float]:
    """``vllm:engine_sleep_state`` by its ``sleep_state`` label."""
    found = samples(await metrics_text(http, server), "vllm:engine_sleep_state")
    return {lb["sleep_state"]: v for lb, v in found if lb.get("model_name") == server.model}
