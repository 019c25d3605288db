"""Admission control in front of a REAL vLLM (CPU build), on a real etcd.

The simulator tests (test_gateway_admission.py) show each rule; this shows the gateway
holds them against the engine the rules are for: with two slots a flood of streamed
chats never puts more than two requests in vLLM's own scheduler (its
``vllm:num_requests_running`` + ``_waiting``, polled throughout), every admitted answer
streams whole, and every refusal reaches the official ``openai`` client as the
``RateLimitError`` it knows, with a Retry-After; and the limit learns from vLLM's real
first-token times (a target no real first token meets shrinks it).

Runs on one of the two vLLM servers the pre-warm test uses too (``vllm_pair``,
tests/integration/conftest.py: started once for both modules, ~25 s, ~2.3 GB RSS each;
nothing else runs on it meanwhile, and its prefix cache is emptied for each test).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.vllm_cpu import VllmProc
from regions.dataplane.admission_gate import AdmissionOptions
from tests.integration.test_gateway_admission import admitting, gate_of, holding, topology

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.realvllm]

TOKENS = 200  # about a second of decoding on the CPU build: the flood overlaps
FLOOD = 10


@pytest.fixture
def vllm(vllm_pair: tuple[VllmProc, VllmProc]) -> VllmProc:
    """``b`` of the pair the pre-warm test uses too (``a`` is the one it kills)."""
    return vllm_pair[1]


async def chat(client: openai.AsyncOpenAI, priority: str = "interactive") -> str | None:
    """A streamed chat read to its end: its finish reason, or None when refused."""
    try:
        answer = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "How does a failover work?"}],
            max_tokens=TOKENS,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"x-priority": priority},
        )
    except openai.RateLimitError as e:
        assert e.status_code == 429 and int(e.response.headers["Retry-After"]) >= 1
        return None
    finish = None
    async with answer:
        async for chunk in answer:
            for c in chunk.choices:
                finish = c.finish_reason or finish
    return finish


async def scheduler_load(http: aiohttp.ClientSession, vllm: VllmProc) -> int:
    """Requests in vLLM's scheduler now, running or waiting, from its own metrics."""
    async with http.get(vllm.url + "/metrics") as r:
        page = await r.text()
    total = 0.0
    for line in page.splitlines():
        if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{")):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


@contextlib.asynccontextmanager
async def sampling(vllm: VllmProc, seen: list[int]) -> AsyncIterator[None]:
    """Poll vLLM's scheduler load every 50 ms while the block runs."""

    async def poll() -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                seen.append(await scheduler_load(http, vllm))
                await asyncio.sleep(0.05)

    task = asyncio.create_task(poll())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_flood_never_puts_more_than_the_limit_into_vllm(
    etcd: EtcdServer, cluster_name: str, vllm: VllmProc
) -> None:
    admission = AdmissionOptions(
        enabled=True, max_inflight=2, max_queue=2, max_queue_wait_s=0.5, first_token_target_s=30
    )
    async with admitting(topology(etcd, cluster_name, vllm.url), admission) as gw:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        seen: list[int] = []
        async with client, sampling(vllm, seen):
            finishes = await asyncio.gather(*(chat(client) for _ in range(FLOOD)))
        admitted = [f for f in finishes if f is not None]
        assert admitted and all(f == "length" for f in admitted)  # each streamed whole
        assert len(admitted) < FLOOD  # the rest were refused, as RateLimitError
        assert seen and max(seen) >= 1  # the poller saw the work ...
        assert max(seen) <= 2  # ... and never more than the limit in vLLM
        # every slot frees (the gateway ends a stream just after its client has it all)
        await holding(gate_of(gw), 0)


async def test_real_first_tokens_over_the_target_shrink_the_limit(
    etcd: EtcdServer, cluster_name: str, vllm: VllmProc
) -> None:
    admission = AdmissionOptions(
        enabled=True, max_inflight=8, initial_inflight=8, first_token_target_s=1e-4
    )
    async with admitting(topology(etcd, cluster_name, vllm.url), admission) as gw:
        gate = gate_of(gw)
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        async with client:
            # one at a time: no refusals, only first-token times, each halving the limit
            # it was admitted under (8 at the first), never below 1
            seen = []
            for _ in range(4):
                assert await chat(client) == "length"
                [limit] = gate.limiter.limits().values()
                seen.append(limit)
        assert seen == [4, 2, 1, 1]
        await holding(gate, 0)
        assert gate.limiter.waiting() == 0
