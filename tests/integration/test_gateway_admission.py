"""Admission control in a real gateway in front of a simulator, on a real etcd: over the
limit a request waits in the region's queue, or gets 429 with Retry-After in the OpenAI
error shape; batch is refused before interactive (a full queue drops its newest batch
waiter for an interactive arrival, and a freed slot goes to interactive first); and a
first token later than the target shrinks the replica's limit.

The simulator decodes at 10 tokens/s, so a streamed answer holds its slot for about a
second per 10 tokens, and prefills at 200 tokens/s, so a 100-token prompt's first token
takes 0.5 s. No control plane runs: with no ``routing/`` key the region serves itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators, until
from controlplane.kernel.config import Topology, parse_topology
from regions.dataplane.admission_gate import (
    AdmissionGates,
    AdmissionOff,
    AdmissionOptions,
    RegionGate,
)
from regions.dataplane.admission_limit import Priority
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer
from tests.integration.cp_harness import fast_topology

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
REGION = "east"
SHORT = "hi"  # a first token in ~10 ms
LONG = "abcd " * 100  # 100 tokens: a first token after 0.5 s of prefill


@pytest.fixture(scope="module")
def simulator() -> Iterator[Proc]:
    args = ("--decode-tokens-per-s", "10", "--prefill-tokens-per-s", "200")
    [sim] = start_simulators(1, extra_args=args)
    try:
        yield sim
    finally:
        sim.kill()


def topology(etcd: EtcdServer, cluster: str, replica: str) -> Topology:
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [{**r, "replicas": [replica]} for r in data["regions"] if r["name"] == REGION]
    return parse_topology(data)


@contextlib.asynccontextmanager
async def admitting(topo: Topology, admission: AdmissionOptions) -> AsyncIterator[GatewayServer]:
    options = GatewayOptions(
        topology=topo, app=AppConfig(home=REGION), prefix_tracking=False, admission=admission
    )
    gw = GatewayServer(options)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


def gate_of(gw: GatewayServer) -> RegionGate:
    assert isinstance(gw.admission, AdmissionGates)
    gate = gw.admission.gate(REGION)
    assert gate is not None
    return gate


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    error: dict[str, object] | None = None
    first_byte_at: float | None = None  # monotonic: when the first bytes came


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


async def stream(
    http: aiohttp.ClientSession,
    gw: GatewayServer,
    priority: str = "interactive",
    *,
    tokens: int = 10,
    prompt: str = SHORT,
) -> Answer:
    """A streamed completion read to its end (a refusal: its error object)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": tokens, "stream": True}
    headers = {"x-priority": priority}
    async with http.post(gw.url + "/v1/completions", json=body, headers=headers) as r:
        if r.status != 200:
            error = (await r.json())["error"]
            return Answer(r.status, dict(r.headers), error)
        answer = Answer(r.status, dict(r.headers))
        async for _ in r.content.iter_any():
            if answer.first_byte_at is None:
                answer.first_byte_at = time.monotonic()
        return answer


def started(coro: Coroutine[Any, Any, Answer]) -> asyncio.Task[Answer]:
    return asyncio.create_task(coro)


async def holding(gate: RegionGate, n: int) -> None:
    async def held() -> bool:
        return gate.limiter.inflight() == n

    await until(held, within=10, what=f"{n} requests in flight")


async def waiting(gate: RegionGate, n: int, priority: Priority | None = None) -> None:
    async def queued() -> bool:
        return gate.limiter.waiting(priority) == n

    await until(queued, within=10, what=f"{n} requests waiting")


async def metrics_page(http: aiohttp.ClientSession, gw: GatewayServer) -> str:
    async with http.get(gw.url + "/metrics") as r:
        return await r.text()


def refused_line(priority: str, reason: str, n: int) -> str:
    return (
        f'tectonic_gateway_admission_refused_total{{priority="{priority}",'
        f'reason="{reason}",region="{REGION}"}} {n:.1f}'
    )


# ---- over the limit: wait, then 429 -------------------------------------------------------


async def test_over_the_limit_a_request_waits_then_gets_429_with_retry_after(
    etcd: EtcdServer, cluster_name: str, simulator: Proc, http: aiohttp.ClientSession
) -> None:
    admission = AdmissionOptions(
        enabled=True, max_inflight=2, max_queue=1, max_queue_wait_s=0.5, first_token_target_s=10
    )
    async with admitting(topology(etcd, cluster_name, simulator.url), admission) as gw:
        gate = gate_of(gw)
        holders = [started(stream(http, gw, tokens=15)) for _ in range(2)]  # ~1.4 s each
        await holding(gate, 2)
        waiter = started(stream(http, gw))
        await waiting(gate, 1)

        full = await stream(http, gw)  # the queue is full too: refused at once
        assert full.status == 429
        assert int(full.headers["Retry-After"]) >= 1
        assert full.headers["x-tectonic-region"] == REGION
        assert full.error is not None
        assert (full.error["type"], full.error["code"]) == ("RateLimitError", 429)
        assert "admission limit" in str(full.error["message"])

        timed_out = await waiter  # waited its 0.5 s while both slots stayed busy
        assert timed_out.status == 429 and int(timed_out.headers["Retry-After"]) >= 1
        assert "timeout" in str(timed_out.error and timed_out.error["message"])
        assert [(await h).status for h in holders] == [200, 200]
        assert gate.limiter.inflight() == 0

        page = await metrics_page(http, gw)
        assert refused_line("interactive", "queue_full", 1) in page
        assert refused_line("interactive", "timeout", 1) in page
        assert f'tectonic_gateway_requests_total{{code="429",region="{REGION}"}} 2.0' in page


# ---- partitions: batch is refused first ----------------------------------------------------


async def test_batch_is_refused_before_interactive(
    etcd: EtcdServer, cluster_name: str, simulator: Proc, http: aiohttp.ClientSession
) -> None:
    admission = AdmissionOptions(
        enabled=True, max_inflight=2, max_queue=2, max_queue_wait_s=10, first_token_target_s=10
    )
    async with admitting(topology(etcd, cluster_name, simulator.url), admission) as gw:
        gate = gate_of(gw)
        short = started(stream(http, gw, tokens=10))  # ends after ~1 s
        long = started(stream(http, gw, tokens=40))  # holds its slot ~4 s
        await holding(gate, 2)
        older_batch = started(stream(http, gw, "batch"))
        await waiting(gate, 1)
        newer_batch = started(stream(http, gw, "batch"))
        await waiting(gate, 2)

        interactive = started(stream(http, gw, "interactive"))  # the queue is full
        dropped = await newer_batch  # ... so its newest batch waiter makes room
        assert dropped.status == 429 and "evicted" in str(
            dropped.error and dropped.error["message"]
        )
        await waiting(gate, 1, Priority.INTERACTIVE)
        refused = await stream(http, gw, "batch")  # a full queue, no batch waiter to drop
        assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1

        assert (await short).status == 200  # one slot frees: interactive gets it first,
        await waiting(gate, 0, Priority.INTERACTIVE)
        assert gate.limiter.waiting(Priority.BATCH) == 1  # although batch waited longer
        served = await interactive
        assert served.status == 200
        first_batch = await older_batch  # it gets the next slot
        assert first_batch.status == 200
        assert served.first_byte_at is not None and first_batch.first_byte_at is not None
        assert served.first_byte_at < first_batch.first_byte_at
        assert (await long).status == 200

        page = await metrics_page(http, gw)
        assert refused_line("batch", "evicted", 1) in page
        assert refused_line("batch", "queue_full", 1) in page
        assert refused_line("interactive", "queue_full", 0) in page


# ---- the limit follows first-token time ------------------------------------------------


async def test_the_limit_shrinks_when_first_tokens_pass_the_target(
    etcd: EtcdServer, cluster_name: str, simulator: Proc, http: aiohttp.ClientSession
) -> None:
    admission = AdmissionOptions(enabled=True, first_token_target_s=0.1)  # starts at 16
    async with admitting(topology(etcd, cluster_name, simulator.url), admission) as gw:
        gate = gate_of(gw)
        await stream(http, gw, tokens=2)  # a first token in ~10 ms: nothing to cut
        [start] = gate.limiter.limits().values()
        assert start == 16
        limits = []
        for i in range(3):  # first tokens after ~0.5 s of prefill, 5x the target
            answer = await stream(http, gw, tokens=2, prompt=f"{i} {LONG}")  # never cached
            assert answer.status == 200
            [limit] = gate.limiter.limits().values()
            limits.append(limit)
        assert limits == [8, 4, 2]  # halved each time (the cut is at most 1/2)
        page = await metrics_page(http, gw)
        line = (
            f'tectonic_gateway_admission_limit{{endpoint="{simulator.url}",region="{REGION}"}} 2.0'
        )
        assert line in page


async def test_admission_is_off_by_default(
    etcd: EtcdServer, cluster_name: str, simulator: Proc, http: aiohttp.ClientSession
) -> None:
    async with admitting(topology(etcd, cluster_name, simulator.url), AdmissionOptions()) as gw:
        assert isinstance(gw.admission, AdmissionOff)
        answers = await asyncio.gather(*(stream(http, gw, tokens=3) for _ in range(20)))
        assert {a.status for a in answers} == {200}
        assert "tectonic_gateway_admission_refused_total{" not in await metrics_page(http, gw)
