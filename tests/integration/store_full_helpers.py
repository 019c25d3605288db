"""Helpers for the full-etcd test (test_store_full.py): the lab started on an etcd with a
small quota, what the test sees of it (chat answers through the gateways, both
control-plane replicas' status over gRPC and HTTP, session pins in etcd, the replicas'
logs), polling that reports its last complaint, and etcdctl."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.lab.deployment import LocalDeployment
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import until
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.codec import decode
from controlplane.kernel.sessions.resolve import SessionPin
from controlplane.kernel.store.etcd import EtcdStore

QUOTA_BYTES = 32 * 1024 * 1024  # far above what the lab writes in two minutes
SESSION_HEADER = "x-session-id"
REGION_HEADER = "x-tectonic-region"
MODEL = "tiny"  # what the lab's simulators serve


def etcdctl_binary() -> str:
    path = shutil.which("etcdctl")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("etcdctl is missing: scripts/setup.sh installs etcd-client")
        pytest.skip("etcdctl is not installed (apt-get install etcd-client)")
    return path


# ---- the lab, on an etcd with a small quota ------------------------------------------


@contextlib.asynccontextmanager
async def lab_on_small_etcd(spec: DeploymentSpec, workdir: Path) -> AsyncIterator[LocalDeployment]:
    """chaos.lab.run.running_lab's starts, in its order, with etcd's quota at
    QUOTA_BYTES (``running_lab`` starts etcd with the lab's own flags only)."""
    dep = LocalDeployment(spec, workdir)
    try:
        server = EtcdServer(extra_flags=(f"--quota-backend-bytes={QUOTA_BYTES}",))
        dep.etcd = await asyncio.to_thread(server.start)
        dep.write_topology()
        await asyncio.gather(*(asyncio.to_thread(dep.start_region, r) for r in spec.regions))
        for rid in dep.cp_ports:
            await asyncio.to_thread(dep.start_controlplane, rid)
        await asyncio.gather(*(asyncio.to_thread(dep.start_data_plane, r) for r in spec.regions))
        yield dep
    finally:
        await asyncio.to_thread(dep.stop)


# ---- what the test sees of the lab ---------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    region: str  # x-tectonic-region of a 200 ("" otherwise)
    text: str

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.region or ''} {self.text[:100]!r}"


@dataclass
class Client:
    """Chat requests through the lab's gateways; remembers every region that answered
    a session with a 200 (``served``)."""

    http: aiohttp.ClientSession
    gateways: dict[str, str]
    served: defaultdict[str, list[str]]

    async def chat(self, session: str, via: str) -> Answer:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{session} asks: any news?"}],
            "max_tokens": 4,
        }
        url = self.gateways[via] + "/v1/chat/completions"
        async with self.http.post(url, json=body, headers={SESSION_HEADER: session}) as r:
            text = await r.text()
            region = r.headers.get(REGION_HEADER, "") if r.status == 200 else ""
        if r.status == 200:
            assert region, f"{session} via {via}: 200 without {REGION_HEADER}"
            self.served[session].append(region)
        return Answer(r.status, region, text)


@dataclass
class Replicas:
    """Both control-plane replicas, over gRPC and over HTTP. A replica that exited or
    does not answer is a string saying so in place of its status."""

    dep: LocalDeployment
    stubs: dict[str, pb_grpc.ControlPlaneStub]
    http_urls: dict[str, str]
    http: aiohttp.ClientSession

    def exited(self, rid: str) -> str:
        proc = self.dep.cps.get(rid)
        if proc is not None and proc.alive():
            return ""
        lines = proc.log(20_000).splitlines() if proc is not None else []
        errors = [ln.strip(" |") for ln in lines if re.match(r"[\s|]*[\w.]+(Error|Full):", ln)]
        return f"{rid} exited ({errors[-1] if errors else 'no error in its log'})"

    async def grpc_status(self) -> dict[str, pb.StatusResponse | str]:
        out: dict[str, pb.StatusResponse | str] = {}
        for rid, stub in self.stubs.items():
            try:
                out[rid] = await stub.GetStatus(pb.GetStatusRequest(), timeout=5)
            except grpc.aio.AioRpcError as e:
                out[rid] = self.exited(rid) or f"{rid} GetStatus: {e.code().name} {e.details()}"
        return out

    async def http_status(self) -> dict[str, dict[str, Any] | str]:
        out: dict[str, dict[str, Any] | str] = {}
        for rid, url in self.http_urls.items():
            try:
                async with self.http.get(url + "/v1/status") as r:
                    if r.status != 200:
                        out[rid] = f"{rid} /v1/status: HTTP {r.status} {await r.text()}"
                        continue
                    out[rid] = await r.json()
            except aiohttp.ClientError as e:
                out[rid] = self.exited(rid) or f"{rid} /v1/status: {e!r}"
        return out


async def pin_of(store: EtcdStore, dep: LocalDeployment, session: str) -> str:
    """The region etcd pins ``session`` to."""
    kv = await store.get(dep.keys.session(session))
    assert kv is not None, f"session {session} has no pin in etcd"
    return decode(SessionPin, kv.value, kv.key).region


def states(st: pb.StatusResponse) -> dict[str, tuple[int, int]]:
    """region -> (state, stored_state)"""
    return {r.name: (r.state, r.stored_state) for r in st.regions}


def describe(st: pb.StatusResponse) -> str:
    regions = ", ".join(
        f"{r.name} {pb.RegionState.Name(r.state)}/{pb.RegionState.Name(r.stored_state)} "
        f"{pb.Health.Name(r.health)}"
        for r in st.regions
    )
    return (
        f"gRPC {st.responder} (leader {st.responder_is_leader}): writable "
        f"{st.store.writable} {st.store.reason!r} alarms {list(st.store.alarms)}; {regions}"
    )


def describe_http(rid: str, body: dict[str, Any]) -> str:
    regions = ", ".join(
        f"{r['name']} {r['state']}/{r['stored_state']} {r['health']}" for r in body["regions"]
    )
    return f"HTTP {rid}: store {body['store']}; {regions}"


async def settle(check: Callable[[], Awaitable[str]], *, within: float, every: float = 0.5) -> str:
    """Poll ``check`` until it returns "" (holds) or ``within`` passes; its last
    complaint ("" if it held)."""
    last = ""

    async def holds() -> bool:
        nonlocal last
        last = await check()
        return not last

    with contextlib.suppress(AssertionError):
        await until(holds, within=within, every=every)
    return last


def control_plane_logs(dep: LocalDeployment) -> str:
    """Each replica's last warnings and errors, and its log's last line."""
    out = []
    for rid, proc in dep.cps.items():
        if proc is None:
            continue
        lines = proc.log(1 << 30).splitlines()
        # warnings and errors, not the traceback each health report refused logs
        kept = [
            ln
            for ln in lines
            if ln[:2].isdigit()
            and re.search(r" (WARNING|ERROR|CRITICAL) |tectonic\.election", ln)
            and "raised by servicer" not in ln
        ]
        out.append(f"--- {rid} ({'running' if proc.alive() else 'exited'}):")
        out += kept[-20:] + [ln for ln in lines[-1:] if ln not in kept[-1:]]
    return "\n".join(out)


async def etcdctl(binary: str, endpoints: tuple[str, ...], *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        binary,
        f"--endpoints={','.join(endpoints)}",
        *args,
        env={**os.environ, "ETCDCTL_API": "3"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"etcdctl {' '.join(args)} exited {proc.returncode}: {text}"
    return text


def workdirs(tmp_path: Path) -> tuple[Path, Path]:
    """The lab's and Prometheus's."""
    lab, prom = tmp_path / "lab", tmp_path / "prom"
    lab.mkdir()
    prom.mkdir()
    return lab, prom
