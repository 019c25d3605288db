"""``failoverctl dashboard``: the control plane's dashboard in a browser when its HTTP API
asks for a token.

A browser cannot put ``Authorization: Bearer`` on a page it navigates to, nor on the
dashboard's event stream (``EventSource`` sends no headers), and the HTTP API takes no
token in a URL (it would land in logs and history: controlplane/SECURITY.md). So this
command listens on loopback and forwards every read (the dashboard, ``/v1/*``, the event
stream, the API reference) to the control plane's HTTP API with the token failoverctl
already has (``--token``, ``$TECTONIC_TOKEN`` or the context's ``token-file``): the
token stays in this process, never in the browser. On Kubernetes, first
``kubectl -n NS port-forward svc/RELEASE-controlplane 8081:8081``, then
``failoverctl dashboard --url http://127.0.0.1:8081``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Mapping
from typing import Annotated

import aiohttp
import typer
from aiohttp import web

from controlplane.cli.client import EXIT_BAD_INPUT, EXIT_UNAUTHENTICATED, EXIT_UNREACHABLE
from controlplane.cli.common import JsonOpt, _ctx, _error

# What is forwarded: the HTTP API's reads, nothing else (it takes no commands).
FORWARDED = frozenset({"/", "/docs", "/openapi.json", "/metrics"})
FORWARDED_UNDER = "/v1/"
# Hop-by-hop headers (RFC 9110 §7.6.1) and those aiohttp sets itself.
_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}
    | {"content-length", "proxy-authorization", "authorization"}
)

CHECK_TIMEOUT_S = 10.0  # the first read, which says whether the API and the token work

UrlOpt = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="TECTONIC_HTTP_URL",
        help="The control plane's HTTP API (its --http-listen), e.g. http://127.0.0.1:8081 "
        "after kubectl port-forward.",
    ),
]
ListenOpt = Annotated[
    str,
    typer.Option(
        "--listen",
        help="Where the browser connects: a loopback host:port (your token is added to "
        "what reaches it, so it never listens beyond this machine).",
    ),
]


def parse_listen(text: str) -> tuple[str, int]:
    """(host, port) of a loopback ``host:port``; ValueError saying what to type."""
    # The HTTP API's own rule (localhost, 127.0.0.0/8, ::1); imported here, so that
    # failoverctl's other commands do not load the API's web framework.
    from controlplane.api.http_auth import is_loopback

    host, sep, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not sep or number < 0:
        raise ValueError(f"--listen {text!r}: give a loopback host:port, e.g. 127.0.0.1:8090")
    if not is_loopback(host):
        raise ValueError(
            f"--listen {text!r}: only a loopback address (127.0.0.1, ::1, localhost): "
            "what reaches it is sent on with your token"
        )
    if number > 65535:
        raise ValueError(f"--listen {text!r}: the port must be 0..65535")
    return host.strip("[]"), number


def forwarded(path: str) -> bool:
    return path in FORWARDED or path.startswith(FORWARDED_UNDER)


def upstream_headers(given: Mapping[str, str], token: str | None) -> dict[str, str]:
    """The browser's headers less hop-by-hop and credentials, with the token."""
    out = {k: v for k, v in given.items() if k.lower() not in _HOP}
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


class DashboardProxy:
    """Forwards the browser's GETs to ``url`` with ``token``; streams each answer (the
    event stream is one long answer)."""

    def __init__(self, url: str, token: str | None, ca: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._ssl: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if ca else True
        self._http: aiohttp.ClientSession | None = None
        self._runner: web.ServerRunner | None = None
        self.port = 0

    async def check(self) -> None:
        """The API answers and takes the token: a CLI error naming what to fix if not."""
        try:
            async with self.http.get(
                self.url + "/v1/status",
                headers=upstream_headers({}, self.token),
                ssl=self._ssl,
                timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S),
            ) as r:
                status = r.status
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise DashboardError(
                f"cannot reach the HTTP API at {self.url}: {e}; is it listening (the control "
                "plane's --http-listen), or is kubectl port-forward running?",
                EXIT_UNREACHABLE,
            ) from None
        if status == 401:
            raise DashboardError(
                f"{self.url} refused the token (401): give one with --token, "
                "$TECTONIC_TOKEN or the context's token-file",
                EXIT_UNAUTHENTICATED,
            )
        if status == 403:
            raise DashboardError(
                f"{self.url}: the token's role may not read (403): the dashboard needs the "
                "viewer role or above",
                EXIT_UNAUTHENTICATED,
            )
        if status != 200:
            raise DashboardError(f"{self.url}/v1/status answered HTTP {status}", EXIT_UNREACHABLE)

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            # No total timeout: the event stream stays open as long as the browser does.
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5), auto_decompress=False
            )
        return self._http

    async def start(self, host: str, port: int) -> None:
        self._runner = web.ServerRunner(web.Server(self._handle))
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        self.port = int(self._runner.addresses[0][1])  # the one chosen for port 0

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD") or not forwarded(request.path):
            return web.Response(status=404, text="not forwarded: the dashboard reads only\n")
        headers = upstream_headers(request.headers, self.token)
        resp: web.StreamResponse | None = None
        try:
            async with self.http.request(
                request.method, self.url + request.path_qs, headers=headers, ssl=self._ssl
            ) as up:
                resp = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in up.headers.items():
                    if k.lower() not in _HOP:
                        resp.headers.add(k, v)
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            if resp is not None and resp.prepared:
                # Cut mid-answer (the API or the browser went away): the browser sees
                # the stream end, and an EventSource reconnects by itself.
                return resp
            return web.Response(status=502, text=f"the control plane's HTTP API: {e}\n")


class DashboardError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def dashboard(
    ctx: typer.Context,
    url: UrlOpt = "http://127.0.0.1:8081",
    listen: ListenOpt = "127.0.0.1:8090",
    json_out: JsonOpt = False,
) -> None:
    """Open the dashboard with your token: serve it on loopback, forwarding each read to
    the control plane's HTTP API with the token added (a browser cannot send one).
    Runs until Ctrl-C.

    Example: failoverctl dashboard --url http://127.0.0.1:8081

    On Kubernetes, after: kubectl -n tectonic port-forward svc/tectonic-controlplane 8081
    """
    c = _ctx(ctx, json_out)
    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        raise _error(str(e), EXIT_BAD_INPUT, json_out) from None
    creds = c.client.credentials
    proxy = DashboardProxy(url, creds.token, creds.ca)

    async def serve() -> None:
        try:
            await proxy.check()
            await proxy.start(host, port)
            where = f"http://{host}:{proxy.port}/"
            if json_out:
                typer.echo(json.dumps({"dashboard": where, "forwarding_to": proxy.url}))
            else:
                typer.echo(f"dashboard: {where}  (forwarding to {proxy.url}; Ctrl-C to stop)")
            await asyncio.Event().wait()
        finally:
            await proxy.stop()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve())
    except DashboardError as e:
        raise _error(str(e), e.code, json_out) from None
    except OSError as e:
        raise _error(f"cannot listen on {listen}: {e}", EXIT_BAD_INPUT, json_out) from None
