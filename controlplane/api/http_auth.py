"""Who may read the HTTP API: the gRPC side's bearer tokens and roles, and where it binds.

With ``security.tokens`` configured, every request but the probes (``/healthz``,
``/readyz``) and, unless ``--http-metrics-auth`` is given, ``/metrics`` must carry
``Authorization: Bearer <token>``: the same tokens, checked by the same
:class:`~controlplane.kernel.security.TokenVerifier`, as the gRPC API. No or an unknown
token: 401 with ``WWW-Authenticate: Bearer``; a role without the path's permission: 403.
The HTTP API is read-only, so every path needs ``READ`` (:data:`HTTP_PERMISSIONS`; a
path missing there needs ``READ`` too, so a new route is never open by accident). The
dashboard and the API reference are guarded like the rest; there is no ``?token=``
(it would land in logs and browser history): see controlplane/SECURITY.md.

Without a ``security:`` section nothing checks a token, so the HTTP API binds loopback
only (:func:`bind_refusal`) unless the operator says ``--insecure-listen-any``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.kernel.security import (
    Permission,
    Principal,
    SecurityConfig,
    TokenVerifier,
    roles_with,
)

log = logging.getLogger("tectonic.http.auth")

OPEN_PATHS = frozenset({"/healthz", "/readyz"})  # probes: kubelet and load balancers
METRICS_PATH = "/metrics"
REALM = 'Bearer realm="tectonic"'
# Every route of controlplane/api/http.py; tests/unit/test_http_auth.py fails when one is
# missing. All reads: the HTTP API takes no commands (those stay on gRPC).
HTTP_PERMISSIONS: Mapping[str, Permission] = MappingProxyType(
    {
        "/": Permission.READ,  # the dashboard
        "/docs": Permission.READ,
        "/openapi.json": Permission.READ,
        "/metrics": Permission.READ,  # only with --http-metrics-auth
        "/v1/status": Permission.READ,
        "/v1/history": Permission.READ,
        "/v1/events": Permission.READ,
    }
)


def http_auth_on(security: SecurityConfig | None) -> bool:
    """Does the HTTP API check tokens? Only with ``security.tokens`` (as gRPC)."""
    return security is not None and bool(security.tokens)


class HttpAuth:
    """ASGI middleware: the bearer token and role check of every HTTP request.

    ``metrics_auth``: ``/metrics`` needs a token too (Prometheus ``authorization:``
    with a viewer token). ``table``: path -> permission (default
    :data:`HTTP_PERMISSIONS`; a path not in it needs ``READ``)."""

    def __init__(
        self,
        app: ASGIApp,
        security: SecurityConfig,
        *,
        metrics_auth: bool = False,
        table: Mapping[str, Permission] | None = None,
    ) -> None:
        self.app = app
        self.verifier = TokenVerifier(security.tokens)
        self.open = OPEN_PATHS if metrics_auth else OPEN_PATHS | {METRICS_PATH}
        self.table = table if table is not None else HTTP_PERMISSIONS

    def needs(self, path: str) -> Permission | None:
        """The permission ``path`` needs; None: open to anyone."""
        if path in self.open:
            return None
        return self.table.get(path, Permission.READ)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.verifier:
            refusal = await self.check(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def check(self, scope: Scope) -> JSONResponse | None:
        """None when the request may go ahead, else the 401 or 403 to answer."""
        path: str = scope.get("path", "")
        permission = self.needs(path)
        if permission is None:
            return None
        token = bearer(scope.get("headers", ()))
        if token is None:
            return _refuse(
                scope,
                401,
                "no bearer token: send 'Authorization: Bearer <token>' (a token of "
                "security.tokens; any role may read)",
                REALM,
            )
        principal: Principal | None = self.verifier.cached(token)
        if principal is None:
            # One scrypt (up to 0.4 s): off the event loop, as on the gRPC side.
            principal = await asyncio.to_thread(self.verifier.verify, token)
        if principal is None:
            return _refuse(
                scope,
                401,
                "invalid token: it matches no entry of security.tokens (revoked, mistyped, "
                "or for another deployment)",
                f'{REALM}, error="invalid_token"',
            )
        if not principal.may(permission):
            needs = " or ".join(r.value for r in roles_with(permission))
            return _refuse(
                scope,
                403,
                f"your token's role is {principal.role.value} (principal {principal.name}); "
                f"{path} needs {needs}",
                f'{REALM}, error="insufficient_scope"',
            )
        scope.setdefault("state", {})["principal"] = principal
        return None


def bearer(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if any."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _refuse(scope: Scope, status: int, detail: str, challenge: str) -> JSONResponse:
    client = scope.get("client")
    peer = f"{client[0]}:{client[1]}" if client else "?"
    log.warning("refused HTTP %d %s from %s: %s", status, scope.get("path", ""), peer, detail)
    return JSONResponse(
        {"detail": detail}, status_code=status, headers={"WWW-Authenticate": challenge}
    )


# ---- where the HTTP API may bind ------------------------------------------------------
def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (brackets allowed); any other name or address,
    ``0.0.0.0`` and ``::`` included, is not."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name may resolve anywhere
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def bind_refusal(
    listen: str, security: SecurityConfig | None, insecure_listen_any: bool
) -> str | None:
    """Why the HTTP API must not bind ``listen`` (None: it may): without a ``security:``
    section only a loopback host, unless ``insecure_listen_any``."""
    host = listen.rpartition(":")[0]
    if security is not None or insecure_listen_any or is_loopback(host):
        return None
    return (
        f"refusing to serve the HTTP API on {listen}: the topology has no security: section, "
        "so /v1/*, the event stream and the dashboard would be open to anyone who can reach "
        "this address. Add security.tokens (controlplane/SECURITY.md), bind a loopback "
        "address (127.0.0.1), or pass --insecure-listen-any if the network in front of it "
        "authenticates"
    )


def check_bind(listen: str, security: SecurityConfig | None, insecure_listen_any: bool) -> None:
    """Raise :class:`InsecureListen` for an address :func:`bind_refusal` refuses; warn
    loudly, on every start, when the HTTP API is reachable beyond loopback unguarded."""
    refusal = bind_refusal(listen, security, insecure_listen_any)
    if refusal is not None:
        raise InsecureListen(refusal)
    if http_auth_on(security) or is_loopback(listen.rpartition(":")[0]):
        return
    why = (
        "--insecure-listen-any, no security: section"
        if security is None
        else "security: has no tokens"
    )
    log.warning(
        "!!! INSECURE: the HTTP API on %s checks no token (%s): anyone who reaches it reads "
        "every region's state, history and live events. Configure security.tokens "
        "(controlplane/SECURITY.md) !!!",
        listen,
        why,
    )


class InsecureListen(ValueError):
    """The HTTP API was asked to bind beyond loopback with nothing to check a token."""


def route_paths(routes: Iterable[Any], prefix: str = "") -> Iterator[str]:
    """Every path of an app's routes, through included routers (FastAPI ≥ 0.160 keeps
    them as ``_IncludedRouter``s instead of copying their routes)."""
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            ctx = getattr(r, "include_context", None)
            yield from route_paths(inner.routes, prefix + getattr(ctx, "prefix", ""))
        elif isinstance(getattr(r, "path", None), str):
            yield prefix + r.path
