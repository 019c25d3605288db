"""The HTTP API's readiness and the event stream's end: /readyz follows the reconcile
loop (on the in-memory store, which can be made unreachable: 503 on a stall, 200 again
after recovery) and goes 503 first on shutdown, before event streams end; an idle event
stream sends heartbeats and, when the replica stops, ends and closes its source."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import aiohttp
import pytest

from chaos.lab.procs import until as poll
from controlplane.api.http import sse_stream
from controlplane.api.reads import AuditRecord
from controlplane.kernel.model import AuditAction, AuditEntry
from controlplane.kernel.store.memory import MemoryStore
from controlplane.server import ControlPlaneReplica
from tests.integration.cp_harness import fast_topology
from tests.integration.http_api_helpers import (
    data_messages,
    get_json,
    http_client,
    metric_samples,
    sample,
)


async def test_readyz_follows_the_loop_and_goes_503_first_on_shutdown() -> None:
    store = MemoryStore()
    topo = fast_topology(("127.0.0.1:1",), "http-ready")  # etcd endpoints unused: memory store
    replica = ControlPlaneReplica(
        topology=topo,
        store=store,
        replica_id="cp-h",
        probe_agents=False,
        http_listen="127.0.0.1:0",
    )
    task = asyncio.create_task(replica.run())
    await asyncio.wait_for(replica.started.wait(), 10)

    async def ready_is(want: int) -> bool:
        async with http.get("/readyz") as resp:
            return resp.status == want

    try:
        async with http_client(replica) as http:
            await poll(lambda: ready_is(200), within=10, what="ready")
            async with http.get("/v1/events") as stream:
                store.set_available(False)  # every tick now fails: no progress
                (broken,) = await asyncio.wait_for(data_messages(stream, 1), 10)
            assert broken["event"] == "error" and "etcd watch broke" in broken["data"]
            await poll(lambda: ready_is(503), within=15, what="503 on stall")
            code, body = await get_json(http, "/readyz")
            assert code == 503 and not body["ready"] and "no progress" in body["reason"]
            code, body = await get_json(http, "/v1/status")
            assert code == 503 and "etcd is unreachable" in body["detail"]
            await poll(lambda: _is(not replica.election.is_leader), within=5, what="not leader")
            assert sample(await metric_samples(http), "tectonic_leader") == 0

            store.set_available(True)
            await poll(lambda: ready_is(200), within=15, what="ready after recovery")

            async with http.get("/v1/events") as stream:
                assert stream.status == 200
                task.cancel()  # shutdown: not ready first, event streams end, then it stops
                await asyncio.sleep(0.05)
                code, body = await get_json(http, "/readyz")
                assert code == 503 and body["reason"] == "shutting down"
                (last,) = await asyncio.wait_for(data_messages(stream, 1), 5)
            assert last["event"] == "error" and "shutting down" in last["data"]
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
            with pytest.raises(aiohttp.ClientConnectionError):
                await get_json(http, "/healthz")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


async def _is(value: bool) -> bool:
    return value


async def test_event_stream_heartbeats_and_ends_on_stop() -> None:
    closed = asyncio.Event()

    async def silent() -> AsyncGenerator[AuditRecord, None]:
        try:
            await asyncio.Event().wait()
            never = AuditEntry(at=0, actor="a", action=AuditAction.TRANSITION)
            yield AuditRecord("x", 1, never)
        finally:
            closed.set()

    stop = asyncio.Event()
    stream = sse_stream(silent(), stop, heartbeat_s=0.05)
    chunks = [await anext(stream) for _ in range(3)]
    assert chunks[0].startswith(b"retry: ") and chunks[1:] == [b": heartbeat\n\n"] * 2
    stop.set()
    rest = [c async for c in stream]
    assert rest == [b'event: error\ndata: {"detail":"replica shutting down"}\n\n']
    assert closed.is_set()  # the source (an etcd watch) is closed, not left running
