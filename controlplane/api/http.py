"""The control plane's HTTP API, beside gRPC: probes, metrics, reads and the dashboard.

With ``security.tokens`` it takes the gRPC API's bearer tokens and roles: everything
but ``/healthz`` and ``/readyz`` (and ``/metrics``, unless ``metrics_auth``) needs a
token whose role may read (``controlplane.api.http_auth``).

Read-only: every answer comes from ``controlplane.api.reads`` (the same logic as the
gRPC reads); operator commands stay on gRPC (``failoverctl``). Bad requests get 400
with a message that says what to change; an unreachable etcd gets 503.

``/v1/events`` is a server-sent event stream: one JSON ``EventView`` per message, its
``id`` the entry's etcd revision, so a browser's ``EventSource`` resumes after a
reconnect (``Last-Event-ID``) without gap or duplicate. Comments keep idle streams
alive; a broken etcd watch ends the stream with an ``error`` event (the client
reconnects), and so does shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.api.http_auth import HttpAuth, http_auth_on
from controlplane.api.reads import (
    DEFAULT_HISTORY,
    MAX_HISTORY,
    AuditRecord,
    BadRead,
    EventView,
    HistoryView,
    Reads,
    StatusView,
)
from controlplane.kernel.security import SecurityConfig
from controlplane.kernel.store.port import StoreUnavailable
from controlplane.metrics import CONTENT_TYPE

HEARTBEAT_S = 15.0
RETRY_MS = 2000  # how long an EventSource waits before it reconnects
MAX_STREAMS = 32  # open /v1/events streams per replica (each holds an etcd watch)
MAX_BODY_BYTES = 16 * 1024  # nothing here takes a body
MAX_QUERY_BYTES = 2048


class Problem(BaseModel):
    detail: str


class Liveness(BaseModel):
    status: str = "alive"
    replica: str


class ReadyView(BaseModel):
    ready: bool
    reason: str = ""


_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": Problem, "description": "bad request: the message says what to change"},
    503: {"model": Problem, "description": "etcd is unreachable; retry shortly"},
}


def create_http_app(
    reads: Reads,
    *,
    not_ready: Callable[[], str | None],
    metrics: Callable[[], bytes],
    stopping: asyncio.Event,
    heartbeat_s: float = HEARTBEAT_S,
    max_streams: int = MAX_STREAMS,
    security: SecurityConfig | None = None,
    metrics_auth: bool = False,
) -> FastAPI:
    """``not_ready`` returns why the replica should take no traffic (None: ready);
    ``metrics`` the Prometheus exposition; ``stopping`` ends event streams. With
    ``security.tokens``, every path but the probes (and ``/metrics`` unless
    ``metrics_auth``) needs a bearer token (controlplane/api/http_auth.py)."""
    app = FastAPI(
        title="Tectonic control plane",
        summary="Region states, routing, history and live events of one deployment",
        version="1",
        responses=_ERRORS,
        docs_url=None,  # Swagger UI and ReDoc load from a CDN; /docs is served from here
        redoc_url=None,
    )
    _handle_errors(app)
    app.include_router(_pages())
    app.include_router(_probes(reads, not_ready, metrics))
    app.include_router(_reads(reads))
    app.include_router(_events(reads, stopping, heartbeat_s, max_streams))
    app.add_middleware(_RequestLimits)
    if security is not None and http_auth_on(security):
        # added last, so outermost: an unauthenticated caller learns nothing
        app.add_middleware(HttpAuth, security=security, metrics_auth=metrics_auth)
    return app


def _handle_errors(app: FastAPI) -> None:
    """Bad input is a 400 and an unreachable etcd a 503, each as a Problem."""

    @app.exception_handler(BadRead)
    async def _bad_read(request: Request, exc: Exception) -> Response:
        return JSONResponse(Problem(detail=str(exc)).model_dump(), status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _bad_params(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'request'}: {e['msg']}"
            for e in exc.errors()
        )
        return JSONResponse(Problem(detail=detail).model_dump(), status_code=400)

    @app.exception_handler(StoreUnavailable)
    async def _no_store(request: Request, exc: Exception) -> Response:
        return JSONResponse(
            Problem(detail=f"etcd is unreachable ({exc}); retry shortly").model_dump(),
            status_code=503,
        )


def _pages() -> APIRouter:
    """The live dashboard and the API reference, served from the package."""
    static = resources.files("controlplane.api") / "static"
    dashboard, docs = (static / "dashboard.html").read_text(), (static / "docs.html").read_text()
    app = APIRouter()

    @app.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(dashboard)

    @app.get("/docs", include_in_schema=False)
    async def reference() -> HTMLResponse:
        return HTMLResponse(docs)

    return app


def _probes(
    reads: Reads, not_ready: Callable[[], str | None], metrics: Callable[[], bytes]
) -> APIRouter:
    app = APIRouter(tags=["probes"])

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> Liveness:
        return Liveness(replica=reads.replica_id)

    @app.get(
        "/readyz",
        summary="200 while the reconcile loop makes progress, else 503 and why",
        responses={503: {"model": ReadyView, "description": "not ready, and why"}},
    )
    async def readyz() -> Response:
        reason = not_ready()
        view = ReadyView(ready=reason is None, reason=reason or "")
        return JSONResponse(view.model_dump(), status_code=200 if reason is None else 503)

    @app.get(
        "/metrics",
        summary="Prometheus metrics of this replica",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE: {}}}},
    )
    async def prometheus() -> Response:
        return Response(metrics(), media_type=CONTENT_TYPE)

    return app


def _reads(reads: Reads) -> APIRouter:
    app = APIRouter(tags=["reads"])

    @app.get("/v1/status", summary="Every region's state, health and routing")
    async def status() -> StatusView:
        return await reads.status()

    @app.get("/v1/history", summary="Recent audit events, oldest first")
    async def history(
        region: Annotated[str, Query(max_length=64, description="one region; all if empty")] = "",
        limit: Annotated[int, Query(ge=1, le=MAX_HISTORY)] = DEFAULT_HISTORY,
    ) -> HistoryView:
        return HistoryView(events=[EventView.of(r) for r in await reads.history(region, limit)])

    return app


def _events(
    reads: Reads, stopping: asyncio.Event, heartbeat_s: float, max_streams: int
) -> APIRouter:
    """Live audit events as server-sent events, at most ``max_streams`` open at once."""
    app = APIRouter(tags=["reads"])
    open_streams = 0

    @app.get(
        "/v1/events",
        summary="Live audit events (server-sent events, one JSON EventView per message)",
        response_class=StreamingResponse,
        responses={
            200: {
                "content": {
                    "text/event-stream": {"schema": {"$ref": "#/components/schemas/EventView"}}
                },
                "description": "one `EventView` per message, `id` = its etcd revision",
            },
            503: {"model": Problem, "description": "too many event streams open"},
        },
    )
    async def events(
        region: Annotated[str, Query(max_length=64, description="one region; all if empty")] = "",
        replay: Annotated[
            int, Query(ge=0, le=MAX_HISTORY, description="first send the last N events")
        ] = 0,
        last_event_id: Annotated[
            str, Header(max_length=32, description="resume after this event id")
        ] = "",
    ) -> Response:
        after = 0
        if last_event_id:
            if not last_event_id.isdigit():
                raise BadRead("Last-Event-ID is the id of an event this stream sent (a number)")
            after = int(last_event_id)
        source = reads.events(region, replay, after)  # validates: BadRead is a 400
        if open_streams >= max_streams:
            return JSONResponse(
                Problem(
                    detail=f"{max_streams} event streams are open on this replica; "
                    "close one or use another replica"
                ).model_dump(),
                status_code=503,
            )

        async def body() -> AsyncIterator[bytes]:
            nonlocal open_streams
            open_streams += 1
            try:
                async with contextlib.aclosing(sse_stream(source, stopping, heartbeat_s)) as s:
                    async for chunk in s:
                        yield chunk
            finally:
                open_streams -= 1

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app


async def sse_stream(
    source: AsyncGenerator[AuditRecord, None], stop: asyncio.Event, heartbeat_s: float
) -> AsyncGenerator[bytes, None]:
    """``source`` as server-sent events, with a comment after every ``heartbeat_s``
    without an event; ends when ``stop`` is set or the source breaks."""
    yield f"retry: {RETRY_MS}\n: connected\n\n".encode()
    stopped = asyncio.ensure_future(stop.wait())
    pending: asyncio.Future[AuditRecord] | None = None
    try:
        while not stop.is_set():
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait(
                (pending, stopped), timeout=heartbeat_s, return_when=asyncio.FIRST_COMPLETED
            )
            if pending in done:
                got, pending = pending, None
                try:
                    rec = got.result()
                except StopAsyncIteration:
                    return
                except StoreUnavailable as e:
                    problem = Problem(detail=f"etcd watch broke ({e}); reconnect to resume")
                    yield _message(problem.model_dump_json(), event="error")
                    return
                yield _message(EventView.of(rec).model_dump_json(), event_id=str(rec.revision))
            elif not done:
                yield b": heartbeat\n\n"
        yield _message(Problem(detail="replica shutting down").model_dump_json(), event="error")
    finally:
        stopped.cancel()
        if pending is not None:
            pending.cancel()
            await asyncio.wait((pending,))
        with contextlib.suppress(RuntimeError, StopAsyncIteration):
            await source.aclose()


def _message(data: str, *, event: str = "", event_id: str = "") -> bytes:
    lines = [f"event: {event}"] if event else []
    if event_id:
        lines.append(f"id: {event_id}")
    lines.append(f"data: {data}")  # compact JSON: one line
    return ("\n".join(lines) + "\n\n").encode()


class _RequestLimits:
    """Refuse oversized requests before routing: bodies (nothing here takes one) and
    query strings. Header size is bounded by the server (h11's incomplete-event limit)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = _over_limit(scope)
            if problem is not None:
                status, detail = problem
                resp = JSONResponse(Problem(detail=detail).model_dump(), status_code=status)
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _over_limit(scope: Scope) -> tuple[int, str] | None:
    if len(scope.get("query_string", b"")) > MAX_QUERY_BYTES:
        return 414, f"the query string is at most {MAX_QUERY_BYTES} bytes"
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            if not value.isdigit() or int(value) > MAX_BODY_BYTES:
                return 413, f"request bodies are at most {MAX_BODY_BYTES} bytes"
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            return 411, "send a Content-Length: chunked request bodies are not accepted"
    return None
