"""The vLLM-compatible simulator, run as real processes and spoken to over HTTP: its
OpenAI API on two ordinary replicas (health, models, completions, chat, streams, the
tokenizer shared by every replica, a reply continued on another replica), the prefix
cache and its metrics, vLLM's error shapes and the context cap; and its pure parts (the
prefix cache, Prometheus's float format). Faults, sleep, the request queue and the
process itself: test_simulator_engine.py.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import aiohttp
import pytest

from chaos.lab.procs import Proc, start_simulators
from regions.simulator.metrics import go_float
from regions.simulator.prefix_cache import PrefixCache
from tests.simulator_helpers import (  # noqa: F401 - fixtures http, small_sim: found by name
    JsonObj,
    complete,
    fixture_http,
    fixture_small_sim,
    get_json,
    long_prompt,
    metric,
    post_json,
    samples,
)

BLOCK = 16


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Proc]]:
    """Two ordinary replicas (block size 16)."""
    procs = start_simulators(2, block_size=BLOCK)
    yield procs
    for p in procs:
        p.kill()


@pytest.fixture(scope="module")
def sim(sims: list[Proc]) -> Proc:
    return sims[0]


async def sse_events(resp: aiohttp.ClientResponse) -> list[str]:
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    body = (await resp.read()).decode()
    events = [e for e in body.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), body
    return [e.removeprefix("data: ") for e in events]


@pytest.mark.slow
async def test_health_models_version(http: aiohttp.ClientSession, sim: Proc) -> None:
    async with http.get(sim.url + "/health") as r:
        assert r.status == 200
        assert await r.read() == b""
    models = await get_json(http, sim.url + "/v1/models")
    assert models["object"] == "list"
    data = models["data"]
    assert isinstance(data, list) and len(data) == 1
    card = data[0]
    assert card["id"] == "tiny" and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == 4096
    assert "version" in await get_json(http, sim.url + "/version")


@pytest.mark.slow
async def test_completion_and_tokenize_agree(http: aiohttp.ClientSession, sim: Proc) -> None:
    prompt = "The quick brown fox jumps over the lazy dog"
    tok = await post_json(http, sim.url + "/tokenize", {"model": "tiny", "prompt": prompt})
    assert tok["count"] == len(tok["tokens"])
    assert tok["max_model_len"] == 4096
    body = await complete(http, sim, prompt, max_tokens=5)
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert str(body["id"]).startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert isinstance(choice["text"], str) and choice["text"]
    assert body["usage"] == {
        "prompt_tokens": tok["count"],
        "completion_tokens": 5,
        "total_tokens": tok["count"] + 5,
        "prompt_tokens_details": None,
    }
    again = await complete(http, sim, prompt, max_tokens=5)
    assert again["choices"][0]["text"] == choice["text"]


@pytest.mark.slow
async def test_tokenizer_is_deterministic_across_processes(
    http: aiohttp.ClientSession, sims: list[Proc]
) -> None:
    payload: JsonObj = {"messages": [{"role": "user", "content": "hello there, world"}]}
    a, b = [await post_json(http, s.url + "/tokenize", payload) for s in sims]
    assert a == b and a["count"] == len(a["tokens"])


@pytest.mark.slow
async def test_any_replica_detokenizes_what_another_tokenized(
    http: aiohttp.ClientSession, sims: list[Proc]
) -> None:
    """As with vLLM, whose replicas of a model share one vocabulary: behind a gateway a
    ``/detokenize`` may land on another replica than the ``/tokenize`` before it."""
    text = f"{uuid.uuid4().hex}: any replica decodes this, with its BOS shown"
    a, b = sims
    tok = await post_json(http, a.url + "/tokenize", {"prompt": text})
    back = await post_json(http, b.url + "/detokenize", {"tokens": tok["tokens"]})
    assert back == {"prompt": "<s>" + text}


@pytest.mark.slow
async def test_chat_completion(http: aiohttp.ClientSession, sim: Proc) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    tok = await post_json(http, sim.url + "/tokenize", {"messages": messages})
    body = await post_json(
        http,
        sim.url + "/v1/chat/completions",
        {"model": "tiny", "messages": messages, "max_tokens": 3},
    )
    assert body["object"] == "chat.completion" and str(body["id"]).startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == tok["count"]
    assert body["usage"]["completion_tokens"] == 3


@pytest.mark.slow
async def test_completion_stream_shape(http: aiohttp.ClientSession, sim: Proc) -> None:
    payload = {"model": "tiny", "prompt": "stream me", "max_tokens": 4, "stream": True}
    async with http.post(sim.url + "/v1/completions", json=payload) as r:
        events = await sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 4
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert all(c["choices"][0]["text"] for c in chunks)


@pytest.mark.slow
async def test_chat_stream_shape_with_usage(http: aiohttp.ClientSession, sim: Proc) -> None:
    payload = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(sim.url + "/v1/chat/completions", json=payload) as r:
        events = await sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = chunks[1:-1]
    assert len(content) == 3 and all(c["choices"][0]["delta"]["content"] for c in content)
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


async def chat_stream_text(http: aiohttp.ClientSession, sim: Proc, payload: JsonObj) -> list[str]:
    async with http.post(sim.url + "/v1/chat/completions", json={**payload, "stream": True}) as r:
        events = await sse_events(r)
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
    return [d for d in deltas if d]


@pytest.mark.slow
async def test_a_chat_reply_cut_on_one_replica_is_continued_on_another(
    http: aiohttp.ClientSession, sims: list[Proc]
) -> None:
    """What the gateway does when a replica dies mid-stream: another replica, given the
    conversation plus the partial reply (``continue_final_message``), writes the rest."""
    messages = [{"role": "user", "content": f"{uuid.uuid4().hex}: which region is warm?"}]
    first, second = sims
    whole = await chat_stream_text(http, first, {"messages": messages, "max_tokens": 10})
    partial = {"role": "assistant", "content": "".join(whole[:4])}
    resumed = {
        "messages": [*messages, partial],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": 6,
    }
    assert whole[:4] + await chat_stream_text(http, second, resumed) == whole


@pytest.mark.slow
async def test_prefix_cache_hits_count_full_blocks(http: aiohttp.ClientSession, sim: Proc) -> None:
    prompt = long_prompt()
    n = int((await post_json(http, sim.url + "/tokenize", {"prompt": prompt}))["count"])
    assert n > 5 * BLOCK
    q0 = await metric(http, sim, "vllm:prefix_cache_queries_total")
    h0 = await metric(http, sim, "vllm:prefix_cache_hits_total")
    await complete(http, sim, prompt)
    assert await metric(http, sim, "vllm:prefix_cache_queries_total") == q0 + n
    assert await metric(http, sim, "vllm:prefix_cache_hits_total") == h0
    await complete(http, sim, prompt)
    assert await metric(http, sim, "vllm:prefix_cache_queries_total") == q0 + 2 * n
    assert await metric(http, sim, "vllm:prefix_cache_hits_total") == h0 + (n - 1) // BLOCK * BLOCK


@pytest.mark.slow
async def test_prefix_cache_is_per_replica_and_salted(
    http: aiohttp.ClientSession, sims: list[Proc]
) -> None:
    prompt = long_prompt(100)
    await complete(http, sims[0], prompt)
    h1 = await metric(http, sims[1], "vllm:prefix_cache_hits_total")
    await complete(http, sims[1], prompt)  # other replica: cold
    assert await metric(http, sims[1], "vllm:prefix_cache_hits_total") == h1
    h0 = await metric(http, sims[0], "vllm:prefix_cache_hits_total")
    await complete(http, sims[0], prompt, cache_salt="tenant-b")  # other salt: cold
    assert await metric(http, sims[0], "vllm:prefix_cache_hits_total") == h0


@pytest.mark.slow
async def test_reset_prefix_cache_drops_hits(http: aiohttp.ClientSession, sim: Proc) -> None:
    prompt = long_prompt(120)
    await complete(http, sim, prompt)
    async with http.post(sim.url + "/reset_prefix_cache") as r:
        assert r.status == 200
    h0 = await metric(http, sim, "vllm:prefix_cache_hits_total")
    await complete(http, sim, prompt)
    assert await metric(http, sim, "vllm:prefix_cache_hits_total") == h0
    await complete(http, sim, prompt)
    assert await metric(http, sim, "vllm:prefix_cache_hits_total") > h0


@pytest.mark.slow
async def test_metric_names_types_and_labels(
    http: aiohttp.ClientSession, sims: list[Proc], small_sim: Proc
) -> None:
    await complete(http, sims[0], "warm the histograms")
    async with http.get(sims[0].url + "/metrics") as r:
        assert r.status == 200 and r.content_type == "text/plain"
        text = await r.text()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert types["vllm:num_requests_running"] == "gauge"
    assert types["vllm:num_requests_waiting"] == "gauge"
    assert types["vllm:kv_cache_usage_perc"] == "gauge"
    assert types["vllm:prefix_cache_queries_total"] == "counter"
    assert types["vllm:prefix_cache_hits_total"] == "counter"
    assert types["vllm:time_to_first_token_seconds"] == "histogram"
    assert types["vllm:cache_config_info"] == "gauge"
    labels = samples(text, "vllm:num_requests_running")[0][0]
    assert 'model_name="tiny"' in labels and 'engine="0"' in labels
    buckets = samples(text, "vllm:time_to_first_token_seconds_bucket")
    assert buckets[-1][0].find('le="+Inf"') >= 0
    count = samples(text, "vllm:time_to_first_token_seconds_count")[0][1]
    assert count >= 1 and buckets[-1][1] == count
    assert samples(text, "vllm:time_to_first_token_seconds_sum")[0][1] > 0
    assert 'block_size="16"' in samples(text, "vllm:cache_config_info")[0][0]
    async with http.get(small_sim.url + "/metrics") as r:
        assert 'block_size="128"' in samples(await r.text(), "vllm:cache_config_info")[0][0]


@pytest.mark.slow
async def test_api_errors_have_vllm_shape(http: aiohttp.ClientSession, sim: Proc) -> None:
    body = await post_json(
        http, sim.url + "/v1/completions", {"model": "nope", "prompt": "x"}, status=404
    )
    assert body["error"]["type"] == "NotFoundError" and body["error"]["code"] == 404
    body = await post_json(
        http, sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 5000}, status=400
    )
    assert body["error"]["param"] == "max_tokens"  # above max_model_len, whatever the prompt
    assert "cannot be greater than max_model_len=4096" in body["error"]["message"]
    body = await post_json(
        http, sim.url + "/v1/completions", {"prompt": [7] * 4097, "max_tokens": 8}, status=400
    )
    assert body["error"]["param"] == "input_tokens"
    assert "maximum context length" in body["error"]["message"]
    body = await post_json(http, sim.url + "/v1/completions", {"prompt": [7] * 4096}, status=400)
    assert body["error"]["param"] == "max_tokens"  # no room left for one output token
    body = await post_json(http, sim.url + "/v1/chat/completions", {"model": "tiny"}, status=400)
    assert body["error"]["type"] == "BadRequestError"
    async with http.post(sim.url + "/v1/completions", data=b"{not json") as r:
        assert r.status == 400
    async with http.get(sim.url + "/no/such/path") as r:
        assert r.status == 404 and await r.json() == {"detail": "Not Found"}


@pytest.mark.slow
async def test_max_tokens_is_capped_by_the_context(http: aiohttp.ClientSession, sim: Proc) -> None:
    body = await complete(http, sim, [7] * 4090, max_tokens=4096)
    assert body["usage"]["completion_tokens"] == 6
    assert body["choices"][0]["finish_reason"] == "length"


# ---- pure parts, no process ----------------------------------------------------------


def test_prefix_cache_matches_vllm_cpu_measurement() -> None:
    """Measured on the CPU build: 1461 tokens twice at block 128: +1461 queries, +1408 hits."""
    cache = PrefixCache(block_size=128, capacity_blocks=1000)
    prompt = list(range(1000, 2461))
    first = cache.lookup(prompt)
    cache.insert(first.hashes)
    assert (first.hit_tokens, cache.queries, cache.hits) == (0, 1461, 0)
    assert cache.lookup(prompt).hit_tokens == 1408 and cache.hits == 1408


def test_prefix_cache_keeps_one_token_to_compute() -> None:
    cache = PrefixCache(block_size=16, capacity_blocks=100)
    prompt = list(range(32))  # exactly two full blocks
    cache.insert(cache.lookup(prompt).hashes)
    assert cache.lookup(prompt).hit_tokens == 16
    assert cache.lookup([*prompt, 99]).hit_tokens == 32


def test_prefix_cache_lru_eviction_salt_and_reset() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=3)
    a, b = list(range(13)), list(range(100, 113))
    cache.insert(cache.lookup(a).hashes)
    assert cache.lookup(a, cache_salt="other").hit_tokens == 0
    assert cache.lookup(a).hit_tokens == 12
    cache.insert(cache.lookup(b).hashes)  # three new blocks push a's out
    assert len(cache) == 3 and cache.lookup(a).hit_tokens == 0
    assert cache.lookup(b).hit_tokens == 12
    cache.reset()
    assert len(cache) == 0 and cache.lookup(b).hit_tokens == 0


def test_prometheus_float_format() -> None:
    assert [go_float(v) for v in (0, 2, 0.25, float("inf"), 1.7959703206935499e9)] == [
        "0.0",
        "2.0",
        "0.25",
        "+Inf",
        "1.7959703206935499e+09",
    ]
