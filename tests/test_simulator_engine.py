"""The simulator's engine on one replica that runs one sequence at a time with slow
decode, spoken to over HTTP: injected faults (errors, unavailability, a hang, added
latency), sleep and wake-up (queued requests, aborts, modes, levels, tags), the
max-num-seqs queue and aborted streams; and the process itself (SIGTERM exits cleanly
and small, the crash fault kills it). Its API on ordinary replicas: test_simulator.py.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import pytest

from chaos.lab.procs import Proc, start_simulator, until
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
    wait_metric,
)


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
