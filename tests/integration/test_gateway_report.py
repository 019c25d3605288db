"""The gateway's health reports carry what its requests saw, per region: a real gateway
(real etcd) in front of an upstream that answers some requests 401, reporting over
real gRPC to a ControlPlane servicer that keeps what it receives. The 401s are
answers (the region works: its verdict stays HEALTHY, ``error_rate`` 0) and show as
``auth_error_rate``, the signal the degradation ladder's first step triggers on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
from aiohttp import web
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import until
from controlplane.kernel.config import parse_topology
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer
from tests.integration.cp_harness import fast_topology

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


class Collector(pb_grpc.ControlPlaneServicer):
    def __init__(self) -> None:
        self.reports: list[pb.HealthReport] = []

    async def ReportHealth(
        self, request: pb.HealthReport, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ReportHealthResponse:
        self.reports.append(request)
        return pb.ReportHealthResponse(accepted=True)


@pytest.fixture
async def control_plane() -> AsyncIterator[tuple[Collector, str]]:
    server = grpc.aio.server()
    collector = Collector()
    pb_grpc.add_ControlPlaneServicer_to_server(collector, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield collector, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def completions(request: web.Request) -> web.Response:
    await request.read()
    if request.headers.get("authorization") != "Bearer good":
        return web.json_response({"error": {"message": "bad key", "code": 401}}, status=401)
    answer = {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "tiny",
        "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
    }
    return web.json_response(answer)


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_401_answers_are_reported_as_the_regions_auth_error_rate(
    etcd: EtcdServer, cluster_name: str, control_plane: tuple[Collector, str], upstream: str
) -> None:
    collector, target = control_plane
    data = fast_topology(etcd.endpoints, cluster_name).model_dump(mode="json")
    east = [r for r in data["regions"] if r["name"] == "east"]
    data["regions"] = [{**r, "replicas": [upstream]} for r in east]
    gw = GatewayServer(
        GatewayOptions(
            topology=parse_topology(data),
            app=AppConfig(home="east"),
            prefix_tracking=False,
            control_planes=(target,),
            observer_id="gateway:test",
            report_interval_s=0.2,
        )
    )
    await gw.start()
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(8):
                key = "good" if i % 4 else "stale"  # 2 of 8 refused
                async with http.post(
                    gw.url + "/v1/completions",
                    json={"model": "tiny", "prompt": f"hello {i}", "max_tokens": 1},
                    headers={"authorization": f"Bearer {key}", "x-session-id": f"s{i}"},
                ) as r:
                    assert r.status == (200 if i % 4 else 401)

        def attempts() -> float:
            return sum(r.signals["attempts"] for r in collector.reports)

        async def all_reported() -> bool:
            return attempts() == 8

        await until(all_reported, within=10, what="reports covering the 8 requests")
    finally:
        await gw.stop()
    assert {(r.region, r.observer, r.kind) for r in collector.reports} == {
        ("east", "gateway:test", pb.GATEWAY)
    }
    refused = sum(r.signals["auth_error_rate"] * r.signals["attempts"] for r in collector.reports)
    assert round(refused) == 2
    assert all(r.signals["error_rate"] == 0.0 for r in collector.reports)
    assert all(r.health == pb.HEALTHY for r in collector.reports if r.signals["attempts"] >= 3)
