"""The HTTP API's token check and bind rule, in process (controlplane/api/http_auth.py):
open paths, 401 for no or an unknown token, 200 for a viewer's read, 403 for a role
without the path's permission, /metrics open unless --http-metrics-auth, every route
of the app in the access table, and which addresses count as loopback.

End to end on a real replica and etcd: tests/integration/test_http_api_auth.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from unittest.mock import MagicMock

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from controlplane.api.http import create_http_app
from controlplane.api.http_auth import (
    HTTP_PERMISSIONS,
    METRICS_PATH,
    OPEN_PATHS,
    HttpAuth,
    InsecureListen,
    bearer,
    bind_refusal,
    check_bind,
    http_auth_on,
    is_loopback,
    route_paths,
)
from controlplane.kernel.security import (
    Permission,
    Role,
    SecurityConfig,
    TokenEntry,
    hash_token,
    new_token,
)

FAST_N = 2**10
ROLES = {r.value: r for r in Role}
TOKENS = {name: new_token() for name in ROLES}  # one principal per role, named after it
SECURITY = SecurityConfig(
    tokens=tuple(
        TokenEntry(name=n, role=r, hash=hash_token(TOKENS[n], n=FAST_N)) for n, r in ROLES.items()
    )
)


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def client(
    *, metrics_auth: bool = False, table: Mapping[str, Permission] | None = None
) -> httpx.AsyncClient:
    app = HttpAuth(_ok, SECURITY, metrics_auth=metrics_auth, table=table)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp")


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_probes_and_metrics_are_open_by_default() -> None:
    async with client() as c:
        for path in (*OPEN_PATHS, METRICS_PATH):
            assert (await c.get(path)).status_code == 200, path


async def test_no_token_is_401_with_a_bearer_challenge() -> None:
    async with client() as c:
        for path in ("/v1/status", "/v1/events", "/", "/docs", "/openapi.json", "/nowhere"):
            r = await c.get(path)
            assert r.status_code == 401, path
            assert r.headers["WWW-Authenticate"].startswith("Bearer"), path
            assert "Authorization: Bearer" in r.json()["detail"]


@pytest.mark.parametrize(
    "header",
    [
        f"Bearer {new_token()}",  # well formed, in no entry
        f"Bearer {TOKENS['viewer'][:-4]}AAAA",  # right selector, wrong secret
        "Bearer not-a-token",
        f"Basic {TOKENS['viewer']}",  # the right secret, the wrong scheme
        "Bearer ",
    ],
    # fixed ids: the tokens are random, and pytest-xdist's workers must collect alike
    ids=["unknown", "wrong-secret", "malformed", "wrong-scheme", "empty"],
)
async def test_unknown_or_malformed_token_is_401(header: str) -> None:
    async with client() as c:
        r = await c.get("/v1/status", headers={"Authorization": header})
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Bearer")


async def test_every_role_reads() -> None:
    """Reads need READ, which every role has (controlplane/kernel/security.py)."""
    async with client() as c:
        for name, token in TOKENS.items():
            for path in ("/v1/status", "/v1/history", "/v1/events", "/", "/docs"):
                r = await c.get(path, headers=auth(token))
                assert r.status_code == 200, (name, path)
            # the second call takes the cache, not the scrypt: same answer
            assert (await c.get("/v1/status", headers=auth(token))).status_code == 200


async def test_a_role_without_the_permission_is_403() -> None:
    # No role lacks READ today; a path needing OPERATE shows the refusal.
    async with client(table={"/v1/status": Permission.OPERATE}) as c:
        r = await c.get("/v1/status", headers=auth(TOKENS["viewer"]))
        assert r.status_code == 403
        assert "viewer" in r.json()["detail"] and "operator or admin" in r.json()["detail"]
        assert 'error="insufficient_scope"' in r.headers["WWW-Authenticate"]
        assert (await c.get("/v1/status", headers=auth(TOKENS["operator"]))).status_code == 200
        # other paths keep their own permission
        assert (await c.get("/v1/history", headers=auth(TOKENS["viewer"]))).status_code == 200


async def test_metrics_need_a_token_with_the_flag() -> None:
    async with client(metrics_auth=True) as c:
        r = await c.get(METRICS_PATH)
        assert r.status_code == 401
        assert (await c.get(METRICS_PATH, headers=auth(TOKENS["viewer"]))).status_code == 200
        for path in OPEN_PATHS:
            assert (await c.get(path)).status_code == 200, path


def _app(security: SecurityConfig | None, metrics_auth: bool = False) -> object:
    return create_http_app(
        MagicMock(),
        not_ready=lambda: None,
        metrics=lambda: b"",
        stopping=asyncio.Event(),
        security=security,
        metrics_auth=metrics_auth,
    )


def test_every_route_has_an_entry_and_only_the_probes_are_open() -> None:
    """A new route of controlplane/api/http.py must be added to HTTP_PERMISSIONS (and is
    guarded by READ meanwhile); only /healthz, /readyz (and /metrics) are open."""
    app = _app(SECURITY)
    paths = set(route_paths(app.routes))  # type: ignore[attr-defined]
    assert {"/", "/docs", "/openapi.json", "/v1/status", "/healthz"} <= paths
    assert paths - OPEN_PATHS <= set(HTTP_PERMISSIONS), paths - OPEN_PATHS - set(HTTP_PERMISSIONS)
    guard = HttpAuth(_ok, SECURITY)
    strict = HttpAuth(_ok, SECURITY, metrics_auth=True)
    for path in paths:
        assert (guard.needs(path) is None) == (path in OPEN_PATHS | {METRICS_PATH}), path
        assert (strict.needs(path) is None) == (path in OPEN_PATHS), path


def test_the_guard_is_on_with_tokens_only() -> None:
    assert http_auth_on(SECURITY)
    assert not http_auth_on(None)
    assert not http_auth_on(SecurityConfig())  # TLS only (or nothing): no token checks
    app = _app(SecurityConfig())
    assert not any(m.cls is HttpAuth for m in app.user_middleware)  # type: ignore[attr-defined]
    app = _app(SECURITY)
    assert any(m.cls is HttpAuth for m in app.user_middleware)  # type: ignore[attr-defined]


def test_bearer_header_parsing() -> None:
    assert bearer([(b"authorization", b"Bearer abc")]) == "abc"
    assert bearer([(b"Authorization", b"bearer  abc ")]) == "abc"
    assert bearer([(b"authorization", b"Basic abc")]) is None
    assert bearer([(b"x-token", b"Bearer abc")]) is None
    assert bearer([]) is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("[::1]", True),
        ("::1", True),
        ("[::ffff:127.0.0.1]", True),
        ("0.0.0.0", False),
        ("[::]", False),
        ("10.1.2.3", False),
        ("192.168.0.1", False),
        ("cp.example.com", False),
        ("", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_bind_rule() -> None:
    refusal = bind_refusal("0.0.0.0:8081", None, insecure_listen_any=False)
    assert refusal is not None
    assert "--insecure-listen-any" in refusal and "security" in refusal
    assert bind_refusal("[::]:8081", None, insecure_listen_any=False) is not None
    assert bind_refusal("127.0.0.1:8081", None, insecure_listen_any=False) is None
    assert bind_refusal("[::1]:0", None, insecure_listen_any=False) is None
    assert bind_refusal("0.0.0.0:8081", None, insecure_listen_any=True) is None
    assert bind_refusal("0.0.0.0:8081", SECURITY, insecure_listen_any=False) is None
    with pytest.raises(InsecureListen, match="insecure-listen-any"):
        check_bind("0.0.0.0:0", None, insecure_listen_any=False)


def test_insecure_listen_any_warns_loudly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tectonic.http.auth"):
        check_bind("0.0.0.0:0", None, insecure_listen_any=True)
    assert any("INSECURE" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tectonic.http.auth"):
        check_bind("127.0.0.1:0", None, insecure_listen_any=True)
        check_bind("0.0.0.0:0", SECURITY, insecure_listen_any=False)
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="tectonic.http.auth"):
        check_bind("0.0.0.0:0", SecurityConfig(), insecure_listen_any=False)
    assert any("security: has no tokens" in r.getMessage() for r in caplog.records)
