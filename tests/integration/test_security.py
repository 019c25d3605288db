"""Security end to end: a real control-plane replica serving gRPC over mutual TLS with
bearer tokens (certificates from throwaway CAs), the real failoverctl as a subprocess, a
real region agent reporting over mTLS. The store is in memory: what is under test is
the gRPC edge, not etcd (etcd TLS + auth has its own test at the end, on a real etcd).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tectonic_api.v1 import agent_pb2 as apb
from tectonic_api.v1 import agent_pb2_grpc as apb_grpc
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.lab.local_etcd import ETCD_BINARY, FAST_FLAGS
from chaos.lab.ports import reserved_port
from controlplane.kernel.config import Topology
from controlplane.kernel.rpc.auth import RETRY_AFTER_KEY
from controlplane.kernel.rpc.tls import aio_channel, channel_credentials
from controlplane.kernel.security import (
    LimitsConfig,
    Role,
    SecurityConfig,
    TlsConfig,
    TokenEntry,
    hash_token,
    new_token,
)
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import StoreError
from controlplane.kernel.store.settings import EtcdConfig
from regions.agent.server import AgentConfig, serve_agent
from tests.integration.certs import CertAuthority, Leaf, make_ca
from tests.integration.cp_harness import Running, fast_topology, region, running_replica, until

CLI = str(Path(sys.executable).with_name("failoverctl"))
FAST_N = 2**10  # scrypt cost: the tokens here guard nothing, keep the CPU for the tests
PRINCIPALS = {
    "bob": Role.VIEWER,
    "alice": Role.OPERATOR,
    "carol": Role.OPERATOR,  # the rate-limit test drains her bucket only
    "dave": Role.OPERATOR,  # failoverctl's
    "agent-east": Role.REPORTER,
    "root": Role.ADMIN,
}
BURST = 4


@dataclass
class Pki:
    ca: CertAuthority
    rogue: CertAuthority
    server: Leaf
    client: Leaf
    agent: Leaf
    rogue_client: Leaf
    tokens: dict[str, str]  # principal -> token
    security: SecurityConfig
    dir: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, rogue = make_ca("main", d), make_ca("rogue", d)
    tokens = {name: new_token() for name in PRINCIPALS}
    server = ca.issue("cp", d)
    security = SecurityConfig(
        tls=TlsConfig(ca=str(ca.cert), cert=str(server.cert), key=str(server.key)),
        tokens=tuple(
            TokenEntry(name=n, role=r, hash=hash_token(tokens[n], n=FAST_N))
            for n, r in PRINCIPALS.items()
        ),
        limits=LimitsConfig(max_request_bytes=4096, mutating_per_minute=6, mutating_burst=BURST),
    )
    return Pki(
        ca,
        rogue,
        server,
        ca.issue("oncall", d),
        ca.issue("agent", d),
        rogue.issue("mallory", d),
        tokens,
        security,
        d,
    )


@contextlib.asynccontextmanager
async def secured(pki: Pki) -> AsyncIterator[Running]:
    topo: Topology = fast_topology(("127.0.0.1:1",), "sec").model_copy(
        update={"security": pki.security}
    )
    store = MemoryStore()
    try:
        async with running_replica(topo, store=store) as run:
            yield run
    finally:
        await store.close()


def channel(
    pki: Pki, run: Running, token: str | None, client: Leaf | None = None, ca: Path | None = None
) -> grpc.aio.Channel:
    """An mTLS channel to the replica with ``client``'s certificate (default: the
    deployment's on-call one) and ``token``."""
    leaf = client or pki.client
    sec = SecurityConfig(
        tls=TlsConfig(ca=str(ca or pki.ca.cert), cert=str(leaf.cert), key=str(leaf.key))
    )
    return aio_channel(run.target, sec, token=token or "")


@contextlib.asynccontextmanager
async def stub(
    pki: Pki, run: Running, principal: str | None
) -> AsyncIterator[pb_grpc.ControlPlaneStub]:
    ch = channel(pki, run, pki.tokens[principal] if principal else None)
    try:
        yield pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
    finally:
        await ch.close()


async def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call  # type: ignore[misc]
    return e.value.code()


async def healthy(pki: Pki, run: Running) -> None:
    async with stub(pki, run, "root") as admin:
        await until(
            lambda s: s.responder_is_leader and all(r.health == pb.HEALTHY for r in s.regions),
            admin,
            {},
        )


async def test_tokens_and_roles(pki: Pki) -> None:
    async with secured(pki) as run:
        async with stub(pki, run, None) as anon:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await anon.GetStatus(pb.GetStatusRequest())
            assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert "no bearer token" in (e.value.details() or "")
        forged = pki.tokens["bob"][:-4] + "AAAA"  # right selector, wrong secret
        for bad in (forged, "not-a-token"):
            ch = channel(pki, run, bad)
            try:
                bad_stub = pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
                assert await code_of(bad_stub.GetStatus(pb.GetStatusRequest())) is (
                    grpc.StatusCode.UNAUTHENTICATED
                )
            finally:
                await ch.close()
        async with stub(pki, run, "bob") as viewer:
            st = await viewer.GetStatus(pb.GetStatusRequest())
            assert [r.name for r in st.regions] == ["east", "west", "central", "eu"]
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await viewer.RequestFailover(
                    pb.FailoverRequest(region="east", reason="viewer tries", dry_run=True)
                )
            assert e.value.code() is grpc.StatusCode.PERMISSION_DENIED
            msg = e.value.details() or ""
            assert "role is viewer" in msg and "needs operator or admin" in msg
            # A health report is a vote in the failure quorum: viewers cannot cast one.
            report = pb.HealthReport(
                region="east", observer="agent:east", kind=pb.AGENT, health=pb.UNHEALTHY
            )
            assert await code_of(viewer.ReportHealth(report)) is grpc.StatusCode.PERMISSION_DENIED
        # Health checks stay open (load balancers, the leader's probe): TLS, no token.
        ch = channel(pki, run, None)
        try:
            resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            assert resp.status in (
                health_pb2.HealthCheckResponse.SERVING,
                health_pb2.HealthCheckResponse.NOT_SERVING,
            )
        finally:
            await ch.close()


async def test_operator_failover_is_audited_with_the_principal_and_reason(pki: Pki) -> None:
    async with secured(pki) as run:
        await healthy(pki, run)
        async with stub(pki, run, "alice") as op:
            resp = await op.RequestFailover(
                pb.FailoverRequest(
                    region="east", reason="INC-7: TTFT 5x", actor="someone-else@laptop"
                )
            )
            assert resp.accepted and resp.intent_id
            hist = await op.GetHistory(pb.HistoryRequest(region="east", limit=50))
        intents = [e for e in hist.events if e.action == "intent_failover"]
        assert len(intents) == 1
        # The token's principal, not what the client claimed to be.
        assert intents[0].actor == "alice"
        assert intents[0].reason == "INC-7: TTFT 5x"


async def test_transport_refusals(pki: Pki) -> None:
    async with secured(pki) as run:
        token = pki.tokens["root"]
        attempts = {
            "client certificate from another CA": channel(pki, run, token, pki.rogue_client),
            "no client certificate": grpc.aio.secure_channel(
                run.target, channel_credentials(str(pki.ca.cert))
            ),
            "plaintext": grpc.aio.insecure_channel(run.target),
            "server not trusted (other CA)": channel(pki, run, token, ca=pki.rogue.cert),
        }
        try:
            for what, ch in attempts.items():
                s = pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
                code = await code_of(s.GetStatus(pb.GetStatusRequest(), timeout=5))
                assert code is grpc.StatusCode.UNAVAILABLE, what
        finally:
            for ch in attempts.values():
                await ch.close()


async def test_request_size_and_rate_limits(pki: Pki) -> None:
    async with secured(pki) as run:
        async with stub(pki, run, "root") as admin:
            big = pb.PauseRequest(reason="x" * 8192)  # over max_request_bytes (4096)
            assert await code_of(admin.Pause(big)) is grpc.StatusCode.RESOURCE_EXHAUSTED
        async with stub(pki, run, "carol") as op:
            for _ in range(BURST):
                await op.Resume(pb.PauseRequest(reason="r"))
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await op.Resume(pb.PauseRequest(reason="r"))
            assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "retry in" in (e.value.details() or "")
            retry_ms = dict(e.value.trailing_metadata() or ())[RETRY_AFTER_KEY]
            assert 1000 < int(retry_ms) <= 10_000  # 6 a minute: one every 10 s
            await op.GetStatus(pb.GetStatusRequest())  # reads are never rate limited
        async with stub(pki, run, "dave") as other:  # buckets are per principal
            await other.Resume(pb.PauseRequest(reason="r"))


def ctl(
    pki: Pki, run: Running, *args: str, token: str | None, client: Leaf | None = None
) -> tuple[int, str, str]:
    """failoverctl as a subprocess, configured through the environment as on call."""
    leaf = client or pki.client
    env = {k: v for k, v in os.environ.items() if not k.startswith("TECTONIC_")} | {
        "TECTONIC_SERVER": run.target,
        "TECTONIC_CA": str(pki.ca.cert),
        "TECTONIC_CERT": str(leaf.cert),
        "TECTONIC_KEY": str(leaf.key),
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }
    if token is not None:
        env["TECTONIC_TOKEN"] = token
    proc = subprocess.run(
        [CLI, "--timeout", "3", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stdout, proc.stderr


async def test_failoverctl_with_tls_and_tokens(pki: Pki) -> None:
    async with secured(pki) as run:
        await healthy(pki, run)
        # The CLI blocks; run it in a thread so that the in-process replica keeps serving.
        code, out, err = await asyncio.to_thread(
            ctl, pki, run, "status", "--json", token=pki.tokens["bob"]
        )
        assert code == 0, err
        assert {r["state"] for r in json.loads(out)["regions"]} == {"NORMAL"}

        code, out, err = await asyncio.to_thread(ctl, pki, run, "status", token=None)
        assert code == 5, (code, err)
        assert "not authenticated" in err and "TECTONIC_TOKEN" in err

        code, out, err = await asyncio.to_thread(
            ctl,
            pki,
            run,
            "failover",
            "east",
            "--reason",
            "x",
            "--dry-run",
            token=pki.tokens["bob"],
        )
        assert code == 1, (code, err)
        flat = " ".join(err.split())
        assert "role is viewer" in flat and "RequestFailover needs operator" in flat

        code, out, err = await asyncio.to_thread(
            ctl,
            pki,
            run,
            "pause",
            "--reason",
            "INC-9 maintenance",
            "--json",
            token=pki.tokens["dave"],
        )
        assert code == 0, err
        code, out, err = await asyncio.to_thread(
            ctl, pki, run, "history", "--json", token=pki.tokens["bob"]
        )
        pauses = [e for e in json.loads(out) if e["action"] == "pause"]
        assert [(p["actor"], p["reason"]) for p in pauses] == [("dave", "INC-9 maintenance")]

        # A client certificate from another CA: the handshake fails, exit 3 with a hint.
        code, out, err = await asyncio.to_thread(
            ctl, pki, run, "status", token=pki.tokens["bob"], client=pki.rogue_client
        )
        assert code == 3, (code, err)
        flat = " ".join(err.split())
        assert "refused the TLS handshake" in flat and "--cert/--key" in flat


async def test_agent_reports_over_mtls_and_serves_mtls(pki: Pki, tmp_path: Path) -> None:
    token_file = tmp_path / "agent.token"
    token_file.write_text(pki.tokens["agent-east"] + "\n")
    agent_sec = pki.security.model_copy(
        update={
            "tls": TlsConfig(ca=str(pki.ca.cert), cert=str(pki.agent.cert), key=str(pki.agent.key)),
            "token_file": str(token_file),
        }
    )
    async with secured(pki) as run:
        handle = await serve_agent(
            AgentConfig(
                region="east",
                control_planes=(run.target,),
                replicas=("http://127.0.0.1:9",),  # nothing there: the agent reports it down
                interval=0.2,
                timeout=0.2,
                security=agent_sec,
            )
        )
        try:
            for _ in range(100):
                if handle.reports_sent:
                    break
                await asyncio.sleep(0.1)
            assert handle.reports_sent >= 1 and handle.report_target == run.target
            async with stub(pki, run, "bob") as viewer:  # the leader folds it in a tick
                for _ in range(100):
                    st = await viewer.GetStatus(pb.GetStatusRequest())
                    if region(st, "east").votes.get("agent:east"):
                        break
                    await asyncio.sleep(0.1)
            assert region(st, "east").votes.get("agent:east") == "UNHEALTHY"

            # The agent's own server: mTLS, and the same tokens and roles.
            target = f"127.0.0.1:{handle.port}"
            sec = SecurityConfig(
                tls=TlsConfig(
                    ca=str(pki.ca.cert), cert=str(pki.client.cert), key=str(pki.client.key)
                )
            )
            for principal, ok in (("bob", True), (None, False)):
                token = pki.tokens[principal] if principal else ""
                async with aio_channel(target, sec, token=token) as ch:
                    s = apb_grpc.RegionAgentStub(ch)  # type: ignore[no-untyped-call]
                    call = s.Describe(apb.DescribeRequest(), timeout=5)
                    if ok:
                        assert (await call).region == "east"
                    else:
                        assert await code_of(call) is grpc.StatusCode.UNAUTHENTICATED
            async with grpc.aio.insecure_channel(target) as ch:
                s = apb_grpc.RegionAgentStub(ch)  # type: ignore[no-untyped-call]
                code = await code_of(s.Describe(apb.DescribeRequest(), timeout=5))
                assert code is grpc.StatusCode.UNAVAILABLE
        finally:
            await handle.stop(grace=0)


# ---- etcd: TLS with client certificates, and etcd's own users ------------------------------
@contextlib.contextmanager
def tls_etcd(pki: Pki, tmp: Path) -> Iterator[str]:
    """A single etcd member serving clients over TLS and requiring a client certificate."""
    server = pki.ca.issue("etcd", pki.dir)
    taken: set[int] = set()  # below the ephemeral range: no other test's connection takes them
    client_port, peer_port = reserved_port(taken), reserved_port(taken)
    peer = f"http://127.0.0.1:{peer_port}"
    with (tmp / "etcd.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                ETCD_BINARY,
                "--name=s",
                f"--data-dir={tmp / 'etcd'}",
                f"--listen-client-urls=https://127.0.0.1:{client_port}",
                f"--advertise-client-urls=https://127.0.0.1:{client_port}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=s={peer}",
                f"--cert-file={server.cert}",
                f"--key-file={server.key}",
                f"--trusted-ca-file={pki.ca.cert}",
                "--client-cert-auth",
                *FAST_FLAGS,
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    try:
        yield f"127.0.0.1:{client_port}"
    finally:
        proc.kill()
        proc.wait()


async def test_etcd_tls_and_auth_pass_through(pki: Pki, tmp_path: Path) -> None:
    from aetcd import rpc

    with tls_etcd(pki, tmp_path) as endpoint:
        tls = EtcdConfig(
            endpoints=(endpoint,),
            request_timeout_s=2.0,
            ca=str(pki.ca.cert),
            cert=str(pki.client.cert),
            key=str(pki.client.key),
        )
        store = EtcdStore(tls)
        for _ in range(50):  # etcd takes a moment to start
            try:
                await store.connect()
                break
            except StoreError:
                await asyncio.sleep(0.2)
        try:
            await store.put("/sec/k", b"over tls")
            assert (kv := await store.get("/sec/k")) is not None and kv.value == b"over tls"
            # Turn on etcd's auth: a root user with a password.
            ch = store._stubs().channel
            auth = rpc.AuthStub(ch)
            await auth.UserAdd(rpc.AuthUserAddRequest(name="root", password="s3cret"))
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"))
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"))
            await auth.AuthEnable(rpc.AuthEnableRequest())
        finally:
            await store.close()
        pw = tmp_path / "etcd.pw"
        pw.write_text("s3cret\n")
        authed = tls.model_copy(update={"user": "root", "password_file": str(pw)})
        async with EtcdStore(authed) as store:
            await store.put("/sec/k2", b"with a token")
            assert (kv := await store.get("/sec/k2")) is not None and kv.value == b"with a token"
        # Auth is on: the certificate alone (CN "oncall", no such etcd user) reads nothing.
        with pytest.raises(StoreError, match="permission denied"):
            async with EtcdStore(tls) as store:
                await store.get("/sec/k2")
        pw.write_text("wrong\n")
        with pytest.raises(StoreError, match="authentication failed"):
            async with EtcdStore(authed) as store:
                await store.get("/sec/k2")
        # Plaintext to a TLS etcd: refused.
        with pytest.raises(StoreError):
            async with EtcdStore(EtcdConfig(endpoints=(endpoint,), request_timeout_s=0.5)):
                pass
