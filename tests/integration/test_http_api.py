"""The HTTP API end to end: a real replica serving HTTP on 127.0.0.1:0, read with a real
HTTP client, on a real etcd. A failover (driven over gRPC by reports, as in
test_grpc_api.py) is seen on /v1/events, /v1/status, /v1/history, /metrics and /readyz;
bad queries are refused naming what is wrong; the event stream replays, resumes after
Last-Event-ID and goes on live; /openapi.json, /docs and / are served.

Readiness and the event stream's end: test_http_api_readiness.py; the metrics
themselves: test_http_api_metrics.py; the dashboard in a browser:
test_http_api_dashboard.py.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.kernel.config import Topology
from tests.integration.cp_harness import (
    fast_topology,
    region,
    reporting,
    running_replica,
    until,
)
from tests.integration.http_api_helpers import (
    Message,
    data_messages,
    get_json,
    http_client,
    metric_samples,
    sample,
    sse_messages,
)


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"t{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


@pytest.mark.etcd
async def test_failover_is_visible_over_http(topology: Topology) -> None:
    started = time.time()
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
            # a wall-clock time of this run's loop, not a stale or zero one
            progress = sample(m, "tectonic_loop_last_progress_timestamp") or 0
            assert started <= progress <= time.time()
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
            await run.stub.Resume(pb.PauseRequest(reason="done", actor="bob"))
            (live,) = await asyncio.wait_for(data_messages(stream, 1), 10)
        assert json.loads(live["data"])["action"] == "resume"
        assert json.loads(live["data"])["actor"] == "bob"
