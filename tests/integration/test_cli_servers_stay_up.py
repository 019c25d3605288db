"""The gateway's and the picker's command lines keep serving with health reports on: the
server must be built inside the running loop, or its gRPC channels (the reports to the
control plane) bind to another loop and the process dies at its first report."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_gateway, start_picker
from regions.pool.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.etcd]


def topology(tmp: Path, etcd: EtcdServer) -> Path:
    path = tmp / "topology.yaml"
    region = {
        "name": "east",
        "zone": "us",
        "agent": f"127.0.0.1:{free_port()}",
        "capacity_rps": 10,
        "replicas": [f"http://127.0.0.1:{free_port()}"],
    }
    topo = {"cluster": f"up-{free_port()}", "etcd": {"endpoints": [etcd.endpoint]}}
    path.write_text(yaml.safe_dump({**topo, "regions": [region]}))
    return path


async def _chat(gateway: Proc) -> None:
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(
        gateway.url + "/v1/chat/completions",
        data=body.encode(),
        headers={"content-type": "application/json", "x-session-id": "s1"},
    )
    with pytest.raises(urllib.error.HTTPError):  # its one replica is down: 503
        await asyncio.to_thread(urllib.request.urlopen, request, timeout=10)


async def _exchange(picker: Proc) -> None:
    """One request's whole exchange with the picker, as Envoy would have it: the
    request headers, then the response headers (a vote for the region)."""

    def headers(pairs: dict[str, str]) -> pb.HttpHeaders:
        values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
        return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values), end_of_stream=True)

    request = {":path": "/v1/chat/completions", ":method": "POST", "x-session-id": "s1"}
    async with grpc.aio.insecure_channel(picker.url.removeprefix("grpc://")) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(pb.ProcessingRequest(request_headers=headers(request)))
        assert (await call.read()).HasField("request_headers")
        await call.write(pb.ProcessingRequest(response_headers=headers({":status": "200"})))
        assert (await call.read()).HasField("response_headers")
        await call.done_writing()


@pytest.mark.parametrize("kind", ["gateway", "picker"])
async def test_a_server_reporting_health_keeps_running(
    kind: str, etcd: EtcdServer, tmp_path: Path
) -> None:
    topo = topology(tmp_path, etcd)
    # etcd speaks gRPC: each report reaches a server (which does not know the service)
    cps = [etcd.endpoint]
    extra = ["--report-interval", "0.2"]
    start = start_gateway if kind == "gateway" else start_picker
    proc: Proc = await asyncio.to_thread(start, topo, "east", control_planes=cps, extra_args=extra)
    try:
        # a request, so that there is something to report (nothing answers it)
        await (_chat(proc) if kind == "gateway" else _exchange(proc))
        deadline = time.monotonic() + 2.0  # ten report intervals
        while time.monotonic() < deadline:
            assert proc.alive(), proc.log()
            await asyncio.sleep(0.1)
        assert "different loop" not in proc.log()
    finally:
        proc.kill()
