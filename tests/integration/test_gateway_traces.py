"""A request's trace through the gateway, as an OpenTelemetry collector receives it.

The gateway runs as a process in front of simulator processes (a real etcd) with
``--otlp-endpoint`` pointing at a collector in this test: an aiohttp server that takes
OTLP/HTTP exports in the OTLP specification's JSON encoding (what any collector's
``/v1/traces`` accepts) and reads them by the specification's field names. A request
sent with a W3C ``traceparent`` must come back as one trace: the gateway's server span
a child of the caller's span, and route, admission and upstream spans children of it,
the upstream span naming the replica it went to and what it answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from chaos.lab.procs import until
from tests.integration.gateway_helpers import Deployment, deployment, http, procs_cleanup

pytestmark = [pytest.mark.etcd]
FIXTURES = (deployment, http, procs_cleanup)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@dataclass
class Span:
    """A span as an OTLP/HTTP JSON export carries it (the OTLP specification's JSON
    mapping: hex ids, the kind as a number, attributes as key/value pairs)."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, object]


SERVER, CLIENT = 2, 3  # OTLP's SpanKind numbers


def attributes(pairs: list[dict[str, Any]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for a in pairs:
        v = a["value"]
        out[a["key"]] = int(v["intValue"]) if "intValue" in v else v.get("stringValue")
    return out


@dataclass
class Collector:
    url: str = ""
    spans: list[Span] = field(default_factory=list)

    async def export(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/json"
        body = await request.json()
        for rs in body["resourceSpans"]:
            service = attributes(rs["resource"]["attributes"]).get("service.name", "")
            for ss in rs["scopeSpans"]:
                self.spans += [
                    Span(
                        service=str(service),
                        name=s["name"],
                        trace_id=s["traceId"],
                        span_id=s["spanId"],
                        parent_span_id=s.get("parentSpanId", ""),
                        kind=s["kind"],
                        attributes=attributes(s["attributes"]),
                    )
                    for s in ss["spans"]
                ]
        return web.json_response({})


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    c = Collector()
    app = web.Application()
    app.router.add_post("/v1/traces", c.export)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    c.url = f"http://127.0.0.1:{port}/v1/traces"
    try:
        yield c
    finally:
        await runner.cleanup()


async def test_a_request_is_one_trace_under_the_callers_span(
    deployment: Deployment,
    collector: Collector,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # export within a moment
    gw = await asyncio.to_thread(deployment.gateway, "east", "--otlp-endpoint", collector.url)
    body = {"model": "tiny", "prompt": "trace me", "max_tokens": 2}
    headers = {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01", "x-request-id": "req-t1"}
    async with http.post(gw.url + "/v1/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        await resp.read()

    wanted = {"POST /v1/completions", "route", "admission", "upstream"}

    async def exported() -> bool:
        return wanted <= {s.name for s in collector.spans}

    await until(exported, within=20, every=0.2, what="the gateway's spans at the collector")
    spans = {s.name: s for s in collector.spans}
    root = spans["POST /v1/completions"]
    assert root.service == "tectonic-gateway"
    assert root.trace_id == TRACE_ID and root.parent_span_id == CALLER_SPAN
    assert root.kind == SERVER
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["tectonic.request_id"] == "req-t1"
    for name in ("route", "admission", "upstream"):
        child = spans[name]
        assert child.trace_id == root.trace_id, name
        assert child.parent_span_id == root.span_id, name
    up = spans["upstream"]
    assert up.kind == CLIENT
    replicas = {s.url for s in deployment.sims["east"]}
    assert up.attributes["server.address"] in replicas
    assert up.attributes["http.response.status_code"] == 200
    assert spans["route"].attributes["tectonic.region"] == "east"
