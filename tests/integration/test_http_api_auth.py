"""The HTTP API's bearer tokens and bind rule end to end: a real replica on a real etcd
with ``security.tokens``, read with a real HTTP client.

Every route the FastAPI app defines (``app.routes``, so a route added later is covered
without touching this file) answers 401 without a token and with an unknown one, 200
to each role's token, and 403 to a role that lacks the route's permission; the probes
stay open, /metrics too unless ``http_metrics_auth``. Without a ``security:`` section
the replica, and ``python -m controlplane`` (exit code 2), refuse a non-loopback HTTP
address unless told ``--insecure-listen-any``, which then warns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from controlplane.api import http_auth
from controlplane.api.http import create_http_app
from controlplane.api.http_auth import (
    METRICS_PATH,
    OPEN_PATHS,
    InsecureListen,
    route_paths,
)
from controlplane.kernel.config import Topology
from controlplane.kernel.security import (
    Permission,
    Role,
    SecurityConfig,
    TokenEntry,
    hash_token,
    new_token,
)
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.server import ControlPlaneReplica
from tests.integration.cp_harness import fast_topology

FAST_N = 2**10  # scrypt cost: the tokens here guard nothing
TOKENS = {role.value: new_token() for role in Role}  # one principal per role, named after it
SECURITY = SecurityConfig(
    tokens=tuple(
        TokenEntry(name=role.value, role=role, hash=hash_token(TOKENS[role.value], n=FAST_N))
        for role in Role
    )
)
QUERIES = {"/v1/history": "?limit=5", "/v1/events": "?replay=1"}


def _topology(etcd: object, security: SecurityConfig | None) -> Topology:
    t = fast_topology(etcd.endpoints, f"a{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]
    return t.model_copy(update={"security": security})


@contextlib.asynccontextmanager
async def replica(
    topology: Topology,
    http_listen: str = "127.0.0.1:0",
    **http_options: bool,
) -> AsyncIterator[ControlPlaneReplica]:
    store = EtcdStore(topology.etcd)
    await store.connect()
    rep = ControlPlaneReplica(
        topology=topology,
        store=store,
        replica_id="cp-auth",
        probe_agents=False,
        http_listen=http_listen,
        **http_options,  # type: ignore[arg-type]
    )
    task = asyncio.create_task(rep.run())
    try:
        started = asyncio.create_task(rep.started.wait())
        await asyncio.wait({task, started}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if task.done():
            task.result()  # raises why it did not start
        assert rep.started.is_set(), "the replica did not start"
        yield rep
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


def app_paths(rep: ControlPlaneReplica) -> list[str]:
    """Every path of the app the replica serves (the same factory, the same routes)."""
    app = create_http_app(
        rep.reads, not_ready=rep.not_ready, metrics=lambda: b"", stopping=asyncio.Event()
    )
    paths = sorted(set(route_paths(app.routes)))
    assert {"/", "/docs", "/openapi.json", "/v1/status", "/v1/history", "/v1/events"} <= set(paths)
    return paths


async def get(http: aiohttp.ClientSession, path: str, token: str | None = None) -> int:
    """The status of GET ``path`` (an event stream is opened and closed at once)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with http.get(path + QUERIES.get(path, ""), headers=headers) as resp:
        if resp.status == 401:
            assert resp.headers["WWW-Authenticate"].startswith("Bearer"), path
        if resp.content_type != "text/event-stream":
            await resp.read()
        return resp.status


@contextlib.asynccontextmanager
async def client(rep: ControlPlaneReplica) -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(
        f"http://127.0.0.1:{rep.http_port}", timeout=timeout
    ) as session:
        yield session


@pytest.mark.etcd
async def test_every_route_refuses_without_a_token_and_reads_with_one(etcd: object) -> None:
    async with replica(_topology(etcd, SECURITY)) as rep, client(rep) as http:
        paths = app_paths(rep)
        for path in paths:
            opened = path in OPEN_PATHS or path == METRICS_PATH
            assert await get(http, path) == (200 if opened else 401), path
            if opened:
                continue
            assert await get(http, path, new_token()) == 401, path  # in no entry
            forged = TOKENS["viewer"][:-4] + "AAAA"  # right selector, wrong secret
            assert await get(http, path, forged) == 401, path
            for role, token in TOKENS.items():
                assert await get(http, path, token) == 200, (path, role)
        # a path nobody serves tells a stranger nothing: 401 first, 404 with a token
        assert await get(http, "/v1/nowhere") == 401
        assert await get(http, "/v1/nowhere", TOKENS["viewer"]) == 404
        # the probes answer as before
        async with http.get("/readyz") as resp:
            assert resp.status in (200, 503)


@pytest.mark.etcd
async def test_a_role_without_the_permission_is_refused(
    etcd: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every role may read today, so no token meets a 403 on the read-only HTTP API; a
    table that asks OPERATE for every route shows that a lower role would."""
    async with replica(_topology(etcd, SECURITY), http_metrics_auth=True) as rep:
        paths = [p for p in app_paths(rep) if p not in OPEN_PATHS]
        # the guard is built on the first request, from this table
        monkeypatch.setattr(http_auth, "HTTP_PERMISSIONS", dict.fromkeys(paths, Permission.OPERATE))
        async with client(rep) as http:
            for path in paths:
                assert await get(http, path) == 401, path
                for role in (Role.VIEWER, Role.REPORTER, Role.DRILL_RUNNER):
                    assert await get(http, path, TOKENS[role.value]) == 403, (path, role)
                for role in (Role.OPERATOR, Role.ADMIN):
                    assert await get(http, path, TOKENS[role.value]) == 200, (path, role)
            for path in OPEN_PATHS:
                assert await get(http, path) in (200, 503), path


@pytest.mark.etcd
async def test_metrics_open_by_default_and_guarded_with_the_flag(etcd: object) -> None:
    topo = _topology(etcd, SECURITY)
    async with replica(topo) as rep, client(rep) as http:
        assert await get(http, METRICS_PATH) == 200
    async with replica(topo, http_metrics_auth=True) as rep, client(rep) as http:
        assert await get(http, METRICS_PATH) == 401
        async with http.get(
            METRICS_PATH, headers={"Authorization": f"Bearer {TOKENS['viewer']}"}
        ) as resp:
            assert resp.status == 200
            assert "tectonic_leader" in await resp.text()
        assert await get(http, "/healthz") == 200


@pytest.mark.etcd
async def test_without_security_the_api_is_open_on_loopback(etcd: object) -> None:
    async with replica(_topology(etcd, None)) as rep, client(rep) as http:
        for path in app_paths(rep):
            assert await get(http, path) in (200, 503), path


@pytest.mark.etcd
async def test_without_security_a_non_loopback_address_is_refused(
    etcd: object, caplog: pytest.LogCaptureFixture
) -> None:
    topo = _topology(etcd, None)
    for listen in ("0.0.0.0:0", "[::]:0"):
        with pytest.raises(InsecureListen, match="--insecure-listen-any"):
            async with replica(topo, http_listen=listen):
                pass
    with caplog.at_level(logging.WARNING, logger="tectonic"):
        async with (
            replica(topo, http_listen="0.0.0.0:0", insecure_listen_any=True) as rep,
            client(rep) as http,
        ):
            assert await get(http, "/v1/status") == 200
    assert any("INSECURE" in r.getMessage() for r in caplog.records)
    # with tokens, any address is fine
    async with (
        replica(_topology(etcd, SECURITY), http_listen="0.0.0.0:0") as rep,
        client(rep) as http,
    ):
        assert await get(http, "/v1/status") == 401


def test_the_command_exits_2_on_a_non_loopback_address(tmp_path: Path) -> None:
    topo = fast_topology(("127.0.0.1:1",), "bind")
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(topo.model_dump(mode="json", exclude_unset=True)))
    secured = tmp_path / "secured.yaml"
    secured.write_text(
        yaml.safe_dump(
            {
                **topo.model_dump(mode="json", exclude_unset=True),
                "security": SECURITY.model_dump(mode="json", exclude_unset=True),
            }
        )
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "controlplane", "--check", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = run("--topology", str(plain), "--http-listen", "0.0.0.0:8081")
    assert refused.returncode == 2, refused.stderr
    assert "--insecure-listen-any" in refused.stderr and "security" in refused.stderr
    for args in (
        ("--topology", str(plain), "--http-listen", "0.0.0.0:8081", "--insecure-listen-any"),
        ("--topology", str(plain), "--http-listen", "127.0.0.1:8081"),
        ("--topology", str(secured), "--http-listen", "0.0.0.0:8081"),
    ):
        ok = run(*args)
        assert ok.returncode == 0, (args, ok.stderr)
