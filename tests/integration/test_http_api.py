"""The HTTP API end to end: a real replica serving HTTP on 127.0.0.1:0, read with a real
HTTP client. Failovers are driven over gRPC by reports (as in test_grpc_api.py) on a
real etcd; readiness is tested on the in-memory store, which can be made unreachable.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.procs import until as poll
from controlplane.api.http import sse_stream
from controlplane.api.reads import AuditRecord
from controlplane.kernel.config import Topology
from controlplane.kernel.model import (
    AuditAction,
    AuditEntry,
    Decision,
    FailoverPlan,
    FailoverProgress,
    FailoverStep,
    PrewarmFigures,
    RegionHealth,
    RegionRecord,
    RegionState,
)
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.kernel.store.memory import MemoryStore
from controlplane.metrics import ControlPlaneMetrics, prewarm_fraction
from controlplane.server import ControlPlaneReplica
from tests.integration.cp_harness import (
    fast_topology,
    region,
    reporting,
    running_replica,
    until,
)

Message = dict[str, str]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"t{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def http_client(replica: ControlPlaneReplica) -> AsyncIterator[aiohttp.ClientSession]:
    assert replica.http_port, "the replica serves no HTTP"
    async with aiohttp.ClientSession(f"http://127.0.0.1:{replica.http_port}") as session:
        yield session


async def get_json(http: aiohttp.ClientSession, path: str, **kw: Any) -> tuple[int, Any]:
    async with http.get(path, **kw) as resp:
        return resp.status, await resp.json()


async def sse_messages(resp: aiohttp.ClientResponse) -> AsyncGenerator[Message, None]:
    """Parse a text/event-stream: one dict per message (``comment`` for comments)."""
    msg: Message = {}
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if msg:
                yield msg
            msg = {}
        elif line.startswith(":"):
            msg["comment"] = line[1:].strip()
        else:
            name, _, value = line.partition(":")
            msg[name] = value.removeprefix(" ")


async def data_messages(resp: aiohttp.ClientResponse, n: int) -> list[Message]:
    out: list[Message] = []
    async for m in sse_messages(resp):
        if "data" in m:
            out.append(m)
            if len(out) == n:
                break
    return out


async def metric_samples(http: aiohttp.ClientSession) -> Samples:
    async with http.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.mark.etcd
async def test_failover_is_visible_over_http(topology: Topology) -> None:
    async with (
        running_replica(topology, http_listen="127.0.0.1:0") as run,
        http_client(run.replica) as http,
    ):
        await until(
            lambda s: s.responder_is_leader and all(r.health == pb.HEALTHY for r in s.regions),
            run.stub,
            {},
        )
        # Observers keep reporting east down while everything is checked (fresh votes).
        async with reporting(run.stub, {"east": pb.UNHEALTHY}) as health:
            async with http.get("/v1/events", params={"region": "east"}) as stream:
                assert stream.status == 200
                assert stream.headers["Content-Type"].startswith("text/event-stream")
                seen: list[Message] = []

                async def until_switch() -> None:
                    async for m in sse_messages(stream):
                        seen.append(m)
                        if "data" in m and json.loads(m["data"])["action"] == "routing_switch":
                            return

                reader = asyncio.create_task(until_switch())
                await until(
                    lambda s: (
                        region(s, "east").state == pb.FAILING_OVER
                        and region(s, "east").failover_steps_done == "switch,prewarm"
                    ),
                    run.stub,
                    health,
                )
                await asyncio.wait_for(reader, 10)

            events = [json.loads(m["data"]) for m in seen if "data" in m]
            assert {e["region"] for e in events} == {"east"}
            transition = next(e for e in events if e["action"] == "transition")
            assert transition["decision"]["from_state"] == "NORMAL"
            assert transition["decision"]["to_state"] == "FAILING_OVER"
            assert transition["decision"]["actor"] == "cp-a"
            ids = [m["id"] for m in seen if "data" in m]
            assert ids == [str(e["revision"]) for e in events]  # the SSE id is the resume token

            code, st = await get_json(http, "/v1/status")
            assert code == 200 and st["responder_is_leader"] and st["leader"] == "cp-a"
            e = next(r for r in st["regions"] if r["name"] == "east")
            assert e["state"] == "FAILING_OVER" and e["health"] == "UNHEALTHY"
            assert set(e["routing"]) == {"west", "central"}
            assert e["failover"]["steps_done"] == ["switch", "prewarm"]
            assert e["last_decision"]["to_state"] == "FAILING_OVER"

            code, hist = await get_json(
                http, "/v1/history", params={"region": "east", "limit": 100}
            )
            assert code == 200 and {h["region"] for h in hist["events"]} == {"east"}
            assert [h["id"] for h in hist["events"]] == sorted(h["id"] for h in hist["events"])
            assert transition["id"] in [h["id"] for h in hist["events"]]
            code, last = await get_json(http, "/v1/history", params={"limit": 1})
            assert code == 200 and len(last["events"]) == 1

            m = await metric_samples(http)
            assert (
                sample(
                    m,
                    "tectonic_transitions_total",
                    region="east",
                    **{"from": "NORMAL", "to": "FAILING_OVER", "trigger": "fail_over"},
                )
                == 1
            )
            assert sample(m, "tectonic_region_state", region="east", state="FAILING_OVER") == 1
            assert sample(m, "tectonic_region_state", region="east", state="NORMAL") == 0
            assert sample(m, "tectonic_region_state", region="west", state="NORMAL") == 1
            assert sample(m, "tectonic_region_health", region="east", verdict="UNHEALTHY") == 1
            assert sample(m, "tectonic_failover_duration_seconds_count") == 1
            assert sample(m, "tectonic_leader") == 1
            assert (sample(m, "tectonic_loop_ticks_total") or 0) > 0
            assert abs((sample(m, "tectonic_loop_last_progress_timestamp") or 0) - time.time()) < 10
            # NoPrefixData: nothing to warm, so no attainment figure (not a fake 0 or 1)
            assert sample(m, "tectonic_prewarm_attained_fraction", region="east") is None

            code, ready = await get_json(http, "/readyz")
            assert code == 200 and ready == {"ready": True, "reason": ""}


@pytest.mark.etcd
async def test_validation_replay_resume_and_docs(topology: Topology) -> None:
    async with (
        running_replica(topology, http_listen="127.0.0.1:0") as run,
        http_client(run.replica) as http,
    ):
        await until(lambda s: s.responder_is_leader, run.stub, {})
        for path, params, words in [
            ("/v1/history", {"region": "mars"}, "unknown region 'mars'; known regions: east"),
            ("/v1/history", {"limit": "5000"}, "limit"),
            ("/v1/history", {"limit": "0"}, "limit"),
            ("/v1/history", {"limit": "many"}, "limit"),
            ("/v1/events", {"region": "mars"}, "unknown region 'mars'"),
            ("/v1/events", {"replay": "1001"}, "replay"),
        ]:
            code, body = await get_json(http, path, params=params)
            assert code == 400 and words in body["detail"], (path, params, body)
        code, body = await get_json(http, "/v1/events", headers={"Last-Event-ID": "x"})
        assert code == 400 and "Last-Event-ID" in body["detail"]
        code, body = await get_json(http, "/v1/status", params={"q": "x" * 5000})
        assert code == 414
        async with http.get("/v1/status", data=b"x" * 100_000) as resp:
            assert resp.status == 413

        async with http.get("/healthz") as resp:
            assert resp.status == 200 and (await resp.json())["replica"] == "cp-a"
        code, spec = await get_json(http, "/openapi.json")
        assert code == 200
        assert {
            "/healthz",
            "/readyz",
            "/metrics",
            "/v1/status",
            "/v1/history",
            "/v1/events",
        } <= set(spec["paths"])
        assert "StatusView" in spec["components"]["schemas"]
        assert (
            "text/event-stream" in spec["paths"]["/v1/events"]["get"]["responses"]["200"]["content"]
        )
        for page, marker in (("/", "/v1/events"), ("/docs", "/openapi.json")):
            async with http.get(page) as resp:
                text = await resp.text()
                assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/html")
                assert marker in text and "http://" not in text and "https://" not in text

        # Three audited operator commands, then: replay, resume after an id, live.
        for reason in ("one", "two", "three"):
            await run.stub.Pause(pb.PauseRequest(reason=reason, actor="alice"))
        _, hist = await get_json(http, "/v1/history", params={"limit": 3})
        assert [h["reason"] for h in hist["events"]] == ["one", "two", "three"]
        async with http.get("/v1/events", params={"replay": 2}) as stream:
            got = [json.loads(m["data"]) for m in await data_messages(stream, 2)]
        assert [g["reason"] for g in got] == ["two", "three"]

        first = hist["events"][0]["revision"]
        async with http.get("/v1/events", headers={"Last-Event-ID": str(first)}) as stream:
            backlog = await data_messages(stream, 2)
            assert [json.loads(m["data"])["reason"] for m in backlog] == ["two", "three"]
            await run.stub.Resume(pb.PauseRequest(actor="bob"))
            (live,) = await asyncio.wait_for(data_messages(stream, 1), 10)
        assert json.loads(live["data"])["action"] == "resume"
        assert json.loads(live["data"])["actor"] == "bob"


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


def test_metrics_follow_decisions_and_prewarm() -> None:
    m = ControlPlaneMetrics()
    get = m.registry.get_sample_value
    plan = FailoverPlan(source="east", targets={"west": 1.0}, reason="down", actor="cp")
    view = RegionView(
        name="east",
        record=RegionRecord(region="east", epoch=0),
        health=RegionHealth(region="east"),
    )
    snap = Snapshot(now=100.0, regions={"east": view})
    m.transitioned(
        Decision(
            region="east",
            from_state=RegionState.NORMAL,
            to_state=RegionState.FAILING_OVER,
            trigger="fail_over",
            reason="down",
            actor="cp",
            at=100.0,
            epoch=1,
        )
    )
    m.tick_done(leader=True, snapshot=snap)  # read before the write: must not step back
    assert get("tectonic_region_state", {"region": "east", "state": "FAILING_OVER"}) == 1
    assert get("tectonic_region_state", {"region": "east", "state": "NORMAL"}) == 0

    progress = FailoverProgress(
        plan=plan,
        started_at=100.0,
        done=(FailoverStep.SWITCH,),
        prewarm_result=PrewarmFigures(prefixes_total=40, prefixes_warmed=30),
    )
    m.failover_step_done("east", FailoverStep.SWITCH, progress, at=101.5)
    m.failover_step_done("east", FailoverStep.PREWARM, progress, at=120.0)
    assert get("tectonic_failover_duration_seconds_sum") == pytest.approx(1.5)
    assert get("tectonic_prewarm_attained_fraction", {"region": "east"}) == pytest.approx(0.75)
    assert prewarm_fraction(PrewarmFigures(prefixes_total=0, prefixes_warmed=0)) is None
    assert prewarm_fraction(PrewarmFigures(attained_fraction=1.2)) == 1.0

    m.tick_done(leader=False, snapshot=None)  # a follower exports no region gauges
    assert get("tectonic_region_state", {"region": "east", "state": "FAILING_OVER"}) is None
    assert get("tectonic_prewarm_attained_fraction", {"region": "east"}) is None
    assert get("tectonic_leader") == 0 and get("tectonic_loop_ticks_total") == 2


# ---- the dashboard in a real browser (headless Chromium over the DevTools protocol) ----
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium page, driven over the DevTools protocol (no extra deps)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self._ids = ws, itertools.count(1)

    async def call(self, method: str, **params: Any) -> Any:
        msg_id = next(self._ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        async for msg in self.ws:
            data = json.loads(msg.data)
            if data.get("id") == msg_id:
                if "error" in data:
                    raise AssertionError(f"{method}: {data['error']}")
                return data["result"]
        raise AssertionError("the browser went away")

    async def js(self, expression: str) -> Any:
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res["result"].get("value")


@contextlib.asynccontextmanager
async def chromium_page(url: str, profile: str) -> AsyncIterator[Browser]:
    assert CHROMIUM
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--window-size=1400,900",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        url,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            while b"DevTools listening on" not in (line := await proc.stderr.readline()):
                assert line, "chromium exited before it listened"
        port = line.decode().split("ws://", 1)[1].split("/", 1)[0]
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://{port}/json/list") as resp:
                page = next(t for t in await resp.json() if t["type"] == "page")
            async with s.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield Browser(ws)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@pytest.mark.etcd
async def test_dashboard_shows_a_failover_live(topology: Topology, tmp_path: Path) -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):  # CI installs it (scripts/setup.sh): never skip there
            pytest.fail("chromium is missing: scripts/setup.sh installs it")
        pytest.skip("no chromium: scripts/setup.sh installs it")
    async with running_replica(topology, http_listen="127.0.0.1:0") as run:
        await until(
            lambda s: s.responder_is_leader and all(r.health == pb.HEALTHY for r in s.regions),
            run.stub,
            {},
        )
        url = f"http://127.0.0.1:{run.replica.http_port}/"
        async with chromium_page(url, str(tmp_path / "profile")) as page:

            async def shows(expression: str) -> bool:
                return bool(await page.js(expression))

            state = "document.querySelector('tr[data-region=east] td:nth-child(2)')?.textContent"
            await poll(lambda: shows(f"{state} === 'NORMAL'"), within=20, what="east NORMAL")
            await poll(
                lambda: shows("document.getElementById('conn').textContent === 'live'"),
                within=10,
                what="event stream live",
            )
            # The page is open; the failover must reach it without a reload.
            async with reporting(run.stub, {"east": pb.UNHEALTHY}) as health:
                await until(
                    lambda s: region(s, "east").failover_steps_done == "switch,prewarm",
                    run.stub,
                    health,
                )
                await poll(
                    lambda: shows(f"{state} === 'FAILING_OVER'"), within=15, what="east shown"
                )
                await poll(
                    lambda: shows(
                        "[...document.querySelectorAll('#events td')]"
                        ".some(td => td.textContent.startsWith('NORMAL → FAILING_OVER'))"
                    ),
                    within=10,
                    what="the transition in the event list",
                )
                routing = await page.js(
                    "document.querySelector('tr[data-region=east] td:nth-child(4)').textContent"
                )
                assert "west" in routing and "central" in routing
                shot = await page.call("Page.captureScreenshot", format="png")
        png = base64.b64decode(shot["data"])
        assert png.startswith(b"\x89PNG") and len(png) > 10_000
        (tmp_path / "dashboard.png").write_bytes(png)
