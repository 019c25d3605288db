"""A request's trace through the gateway, as an OpenTelemetry collector receives it.

The gateway runs as a process in front of simulator processes (a real etcd) with
``--otlp-endpoint`` pointing at a collector in this test: an aiohttp server that takes
OTLP/HTTP exports (protobuf ``ExportTraceServiceRequest``, the wire format any
collector speaks) and decodes them with the OpenTelemetry proto package. A request
sent with a W3C ``traceparent`` must come back as one trace: the gateway's server span
a child of the caller's span, and route, admission and upstream spans children of it,
the upstream span naming the replica it went to and what it answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from chaos.lab.procs import until
from tests.integration.gateway_helpers import Deployment, deployment, http, procs_cleanup

pytestmark = [pytest.mark.etcd]
FIXTURES = (deployment, http, procs_cleanup)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@dataclass
class Collector:
    url: str = ""
    spans: list[tuple[str, trace_pb2.Span]] = field(default_factory=list)  # (service, span)

    async def export(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        msg = trace_service_pb2.ExportTraceServiceRequest.FromString(await request.read())
        for rs in msg.resource_spans:
            attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                self.spans += [(attrs.get("service.name", ""), s) for s in ss.spans]
        body = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")


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


def attrs(span: trace_pb2.Span) -> dict[str, object]:
    out: dict[str, object] = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.string_value if v.HasField("string_value") else v.int_value
    return out


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
        return wanted <= {s.name for _, s in collector.spans}

    await until(exported, within=20, every=0.2, what="the gateway's spans at the collector")
    spans = {s.name: (svc, s) for svc, s in collector.spans}
    service, root = spans["POST /v1/completions"]
    assert service == "tectonic-gateway"
    assert root.trace_id.hex() == TRACE_ID and root.parent_span_id.hex() == CALLER_SPAN
    assert root.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert attrs(root)["http.response.status_code"] == 200
    assert attrs(root)["tectonic.request_id"] == "req-t1"
    for name in ("route", "admission", "upstream"):
        _, child = spans[name]
        assert child.trace_id == root.trace_id, name
        assert child.parent_span_id == root.span_id, name
    _, up = spans["upstream"]
    assert up.kind == trace_pb2.Span.SPAN_KIND_CLIENT
    replicas = {s.url for s in deployment.sims["east"]}
    assert attrs(up)["server.address"] in replicas
    assert attrs(up)["http.response.status_code"] == 200
    assert attrs(spans["route"][1])["tectonic.region"] == "east"
