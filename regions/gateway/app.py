"""The gateway's HTTP surface (aiohttp): the OpenAI-compatible endpoints, health, metrics.

Per request: read the body (bounded), validate just what routing needs, take the
session key (a configurable header, else the body's ``user`` field), resolve the
region (local cache, read-through to etcd on a miss), apply that region's degradation
actuators (``regions/dataplane/actuators.py``: shed, cap the context, force
``parallel_tool_calls`` off), tell the prefix observer (the whole prompt, for
pre-warm), pick a replica by prompt prefix, forward and stream back; a stream whose
replica fails mid-way is continued elsewhere when it may be (``continuation.py``).
Every answer says which region served it in ``x-tectonic-region`` (a continued stream:
the region it started in).

``/tokenize`` and ``/detokenize`` (vLLM's, which clients such as ``vllm bench serve``
use to size their prompts) go to a replica of the region a request without a session
would go to. An unknown path or method is answered as vLLM answers it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from opentelemetry.trace import SpanKind

from controlplane.kernel import tracing
from controlplane.kernel.ladder.record import FeatureFlags
from controlplane.kernel.logs import REQUEST_ID, REQUEST_ID_HEADER, request_id
from controlplane.kernel.sessions.resolve import NoRegionServing, self_routed, spill_region
from controlplane.kernel.sessions.store import InvalidSessionId
from regions.dataplane.actuators import Refusal
from regions.dataplane.admission import Admission, Refused
from regions.dataplane.failures import ErrorKind
from regions.dataplane.models import ModelRoutes, families
from regions.dataplane.observe import NoopObserver, PrefixObserver
from regions.dataplane.options import RequestConfig
from regions.dataplane.prompts import BadRequest
from regions.dataplane.requests import (
    TOKENIZER_PATHS,
    Endpoint,
    ProxyRequest,
    error_type,
    tokenizer_model,
    tokenizer_prefix,
)
from regions.dataplane.ring import DEFAULT_PREFIX_CHARS, prefix_key
from regions.dataplane.routing_cache import RoutingCache
from regions.dataplane.scrape import OffLoopRender
from regions.dataplane.sessions import SessionResolver
from regions.dataplane.wake import Held, Waker
from regions.gateway.continuation import ContinuationConfig, Continuer
from regions.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from regions.gateway.model_list import union
from regions.gateway.proxy import Forwarder, NoReplica, forward_headers, json_error
from regions.gateway.warmth import WarmUps, warmup_body
from regions.http_expect import expect_handler

log = logging.getLogger("tectonic.gateway")
TRACER = "tectonic.gateway"
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
NO_REGION = "none"  # the region label of requests refused before a region was chosen
NOT_DEGRADED = FeatureFlags()


@dataclass(frozen=True)
class AppConfig(RequestConfig):
    """The data plane's request settings (``RequestConfig``) and the gateway's own."""

    # while routing splits home (graduated recovery), place a new session whose prompt
    # home has not answered yet on the other targets and warm home with it; replay at a
    # region that serves again the prompts it answered before (warmth.py)
    warm_first: bool = True
    # continue a stream whose replica fails after the first byte (continuation.py)
    continuation: ContinuationConfig = field(default_factory=ContinuationConfig)


def _routing_error(allowed: set[str] | None) -> web.Response:
    """What vLLM answers when no route matches (FastAPI's handler, not vLLM's error
    object): 404 ``{"detail": "Not Found"}`` for an unknown path; for a known path with
    another method (``allowed`` are its methods), 405 with ``Allow``."""
    if allowed is None:
        return web.json_response({"detail": "Not Found"}, status=404)
    resp = web.json_response({"detail": "Method Not Allowed"}, status=405)
    resp.headers[hdrs.ALLOW] = ",".join(sorted(allowed))
    return resp


class _WarmCheck:
    """``WarmCheck`` for one request's prompt. A prompt this gateway has never had
    answered counts as warm: it is cold everywhere, so moving its session gains nothing
    (and most prompts that are never seen again would be replayed for nothing).
    Remembers a region it found cold (the session's weighted pick, home), which is the
    one to warm if the session went elsewhere."""

    __slots__ = ("cold", "key", "warm_ups")

    def __init__(self, warm_ups: WarmUps, key: int) -> None:
        self.warm_ups, self.key, self.cold = warm_ups, key, ""

    def __call__(self, region: str) -> bool:
        if self.warm_ups.warmth.is_warm(region, self.key):
            return True
        if not self.warm_ups.memory.knows(self.key):
            return True
        self.cold = region
        return False


class GatewayApp:
    def __init__(
        self,
        config: AppConfig,
        routing: RoutingCache,
        resolver: SessionResolver | ModelRoutes[SessionResolver],
        forwarder: Forwarder,
        metrics: GatewayMetrics,
        observer: PrefixObserver | None = None,
        flags: Callable[[str], FeatureFlags] | None = None,
        warm_ups: WarmUps | None = None,
        tokenizer_forwarder: Forwarder | None = None,
        waker: Waker | None = None,
    ) -> None:
        self.config = config
        self.waker = waker  # scale to zero (regions/dataplane/wake.py); None: never held
        self._chars = DEFAULT_PREFIX_CHARS if config.prefix_chars is None else config.prefix_chars
        # /tokenize and /detokenize: kept out of the first-token histogram; None: forwarder
        self.tokenizer_forwarder = tokenizer_forwarder or forwarder
        self.warm_ups = warm_ups  # None: warm first is off
        # A region's degradation flags (DegradationCache.flags); None: never degraded.
        self.flags: Callable[[str], FeatureFlags] = flags or (lambda region: NOT_DEGRADED)
        self.routing = routing
        # one session resolver per model family (regions/dataplane/models.py)
        self.resolvers = families(resolver)
        self.resolver = self.resolvers.default
        self.forwarder = forwarder
        self.metrics = metrics
        self.observer: PrefixObserver = observer or NoopObserver()
        self.admission = Admission(
            self.resolvers,
            metrics,
            self.flags,
            chars=self._chars,
            session_header=config.session_header,
            actuators=config.actuators,
        )
        self.stopping = False
        # /metrics: rendered in a thread, one render at a time (regions/dataplane/scrape.py)
        self.scrape = OffLoopRender(lambda: self.metrics.render())

    def server(self) -> web.Server:
        """aiohttp's low-level server over a fixed table of routes: one dict lookup per
        request, whatever the table holds. An Application would add a router, match
        info and the middleware machinery to every request (~10 % of the gateway's CPU
        per proxied request) for nothing this needs. Must be called with the event
        loop running."""
        routes: dict[tuple[str, str], Handler] = {}
        for ep in (Endpoint.COMPLETIONS, Endpoint.CHAT):
            routes[hdrs.METH_POST, ep.value] = self._endpoint(ep)
        for path in TOKENIZER_PATHS:
            routes[hdrs.METH_POST, path] = self.tokenizer
        for path, handler in (
            ("/v1/models", self.models),
            ("/health", self.health),
            ("/metrics", self.metrics_page),
        ):
            routes[hdrs.METH_GET, path] = routes[hdrs.METH_HEAD, path] = handler
        allowed: dict[str, set[str]] = {}
        for method, path in routes:
            allowed.setdefault(path, set()).add(method)
        loop = asyncio.get_running_loop()
        limit = self.config.max_body_bytes

        def make_request(
            message: RawRequestMessage,
            payload: StreamReader,
            protocol: RequestHandler,
            writer: AbstractStreamWriter,
            task: asyncio.Task[None],
        ) -> web.BaseRequest:
            # client_max_size: aiohttp refuses a larger body while reading it (413), so
            # a chunked upload without Content-Length is bounded too.
            return web.BaseRequest(
                message, payload, protocol, writer, task, loop, client_max_size=limit
            )

        async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
            handler = routes.get((request.method, request.path))
            if handler is None:
                return _routing_error(allowed.get(request.path))
            if hdrs.EXPECT in request.headers:
                await expect_handler(request)  # 100 Continue, or a 417 raised
            # Each request is its own task: what it logs names it (kernel/logs.py).
            rid = request_id(request.headers)
            REQUEST_ID.set(rid)
            resp = await handler(request)
            if not resp.prepared:  # a streamed answer sent it with its headers
                resp.headers[REQUEST_ID_HEADER] = rid
            return resp

        return web.Server(dispatch, request_factory=make_request)

    def _endpoint(self, endpoint: Endpoint) -> Handler:
        async def handler(request: web.BaseRequest) -> web.StreamResponse:
            return await self.proxy(request, endpoint)

        return handler

    async def proxy(self, request: web.BaseRequest, endpoint: Endpoint) -> web.StreamResponse:
        """One generation request, traced when tracing is on (kernel/tracing.py)."""
        if not tracing.enabled():
            return await self._proxy(request, endpoint)
        with tracing.start(
            TRACER,
            f"{request.method} {request.path}",
            kind=SpanKind.SERVER,
            carrier=request.headers,
            attributes={"http.request.method": request.method, "url.path": request.path},
        ) as span:
            resp = await self._proxy(request, endpoint)
            if span is not None:
                span.set_attribute("http.response.status_code", resp.status)
                span.set_attribute("tectonic.request_id", REQUEST_ID.get())
            return resp

    async def _proxy(self, request: web.BaseRequest, endpoint: Endpoint) -> web.StreamResponse:
        started = time.monotonic()
        try:
            with tracing.start(TRACER, "route") as span:
                routed = await self._route(request, endpoint)
                if span is not None and not isinstance(routed, web.Response):
                    span.set_attribute("tectonic.region", routed[2])
        except BadRequest as e:
            return self._refuse(e.status, e.message, e.param)
        except InvalidSessionId as e:
            return self._refuse(400, str(e))
        except NoRegionServing as e:
            return self._unavailable(NO_REGION, ErrorKind.NO_REGION, str(e))
        if isinstance(routed, web.Response):
            return routed
        req, session, region, key, check = routed
        held = await self.waker.hold(region) if self.waker is not None else None
        if held is not None and not held.served:
            return self._waking(region, held)
        body = req.body
        headers = forward_headers(request)  # once: forwarded, and remembered for warm-ups
        try:
            self.observer.observe(region, session, req.prompt)
        except Exception:  # an observer bug must not fail requests
            log.exception("prefix observer failed")
        if check is not None and check.cold and check.cold != region:
            self._warm(check.cold, key, request.path, headers, body)  # placed elsewhere
        warm_ups = self.warm_ups
        generation = warm_ups.warmth.generation(region) if warm_ups is not None else 0
        continuer = self._continuer(request, req, session, key)
        try:
            resp = await self.forwarder.forward(
                request, region, body, key, started, headers, continuer
            )
        except NoReplica as e:
            failed = e
        else:
            if warm_ups is not None and resp.status < 400:
                warm_ups.warmth.served(region, key, generation)
                warm_ups.memory.answered(region, key, request.path, headers, body)
            return resp
        return await self._spill(
            request, region, session, body, key, started, headers, failed, continuer=continuer
        )

    def _continuer(
        self, request: web.BaseRequest, req: ProxyRequest, session: str, key: int
    ) -> Continuer | None:
        """How to continue this request's stream if its replica fails mid-way; None when
        it is no stream, or continuation is off for the gateway or the request."""
        cfg = self.config.continuation
        if not (req.stream and cfg.enabled):
            return None
        if request.headers.get(cfg.header, "").strip().lower() in ("off", "false", "0"):
            return None
        return Continuer(req.endpoint, req.body, partial(self._next_region, session, key), cfg)

    async def _next_region(self, session: str, key: int, failed: str) -> str | None:
        """Where a cut stream goes on when ``failed`` has no replica left: a serving
        region of its zone, the session moved there with it (once, as a spill)."""
        other = spill_region(self.routing.routings, self.config.zones, failed, session or str(key))
        if other is not None and session:
            try:
                other = await self.resolvers.for_unit(failed).move(session, failed, other)
            except NoRegionServing:
                return None  # the move cannot be recorded: the stream ends here
        return other

    async def _spill(
        self,
        request: web.BaseRequest,
        region: str,
        session: str,
        body: bytes,
        key: int,
        started: float,
        headers: list[tuple[str, str]] | None,
        failed: NoReplica,
        forwarder: Forwarder | None = None,
        continuer: Continuer | None = None,
    ) -> web.StreamResponse:
        """Nothing reached the client and no replica of ``region`` answered: rather than
        lose the request while the control plane confirms the region down, send it to a
        serving region of the same zone and move its session there (once, for good)."""
        other = spill_region(self.routing.routings, self.config.zones, region, session or str(key))
        if other is None:
            return self._unavailable(region, ErrorKind.NO_REPLICA, str(failed))
        if session:
            try:
                other = await self.resolvers.for_unit(region).move(session, region, other)
            except NoRegionServing as e:
                return self._unavailable(region, ErrorKind.NO_REPLICA, f"{failed}; {e}")
        self.metrics.spill(region, other)
        try:
            return await (forwarder or self.forwarder).forward(
                request, other, body, key, started, headers, continuer
            )
        except NoReplica as e:
            return self._unavailable(other, ErrorKind.NO_REPLICA, f"{failed}; then {e}")

    async def tokenizer(self, request: web.BaseRequest) -> web.StreamResponse:
        """``/tokenize`` or ``/detokenize``, forwarded as it is to a replica of the region
        a request without a session goes to (keyed by its prompt, so the choice is
        stable). Every replica of the model tokenizes alike, so no session is pinned,
        nothing is counted for pre-warm, warmed or degraded, and the replica validates
        the body: its errors are vLLM's own."""
        started = time.monotonic()
        chars = self._chars
        try:
            body = await self._body(request)
            prefix = tokenizer_prefix(body, chars)
            model = tokenizer_model(body)
            resolver = self.resolvers.for_model(model) if model else self.resolver
            region = resolver.region_for_sessionless(prefix)
        except BadRequest as e:
            return self._refuse(e.status, e.message, e.param)
        except NoRegionServing as e:
            return self._unavailable(NO_REGION, ErrorKind.NO_REGION, str(e))
        key = prefix_key(prefix, chars)
        forwarder = self.tokenizer_forwarder
        try:
            return await forwarder.forward(request, region, body, key, started)
        except NoReplica as e:
            return await self._spill(request, region, "", body, key, started, None, e, forwarder)

    async def _route(
        self, request: web.BaseRequest, endpoint: Endpoint
    ) -> tuple[ProxyRequest, str, str, int, _WarmCheck | None] | web.Response:
        """Parse, resolve the region, apply its degradation actuators
        (``regions/dataplane/admission.py``): the request as it will be sent, its
        session, region, ring key and warm check; or a refusal."""
        checks: list[_WarmCheck] = []
        warm_ups = self.warm_ups

        def warm(key: int) -> _WarmCheck:
            assert warm_ups is not None
            checks.append(check := _WarmCheck(warm_ups, key))
            return check

        body = await self._body(request)
        admitted = await self.admission.admit(
            endpoint, body, request.headers, warm if warm_ups is not None else None
        )
        if isinstance(admitted, Refused):
            return self._degraded(admitted.region, admitted.refusal)
        check = checks[0] if checks else None
        return admitted.req, admitted.session, admitted.region, admitted.key, check

    def _warm(
        self, cold: str, key: int, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> None:
        assert self.warm_ups is not None
        replay = warmup_body(body)
        if replay is None:
            return
        self.warm_ups.steered.labels(cold).inc()
        self.warm_ups.want(cold, key, path, headers, replay)

    async def _body(self, request: web.BaseRequest) -> bytes:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise BadRequest(
                f"request body of {request.content_length} bytes exceeds the "
                f"limit of {limit} bytes",
                status=413,
            )
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as e:
            raise BadRequest(f"request body exceeds the limit of {limit} bytes", status=413) from e
        except web.RequestPayloadError as e:  # e.g. Content-Encoding: gzip on a plain body
            raise BadRequest(f"cannot read the request body: {e}") from e

    def _refuse(self, status: int, message: str, param: str | None = None) -> web.Response:
        self.metrics.error(NO_REGION, ErrorKind.BAD_REQUEST)
        self.metrics.request(NO_REGION, status)
        return json_error(status, message, error_type(status), param=param)

    def _degraded(self, region: str, refusal: Refusal) -> web.Response:
        """A request an actuator refused: counted as degraded, not as an error (the region
        is working as told; this gateway's health vote never sees it)."""
        self.metrics.degrade(region, refusal.action)
        self.metrics.request(region, refusal.status)
        headers = None
        if refusal.retry_after_s is not None:
            headers = {"Retry-After": str(refusal.retry_after_s)}
        return json_error(
            refusal.status,
            refusal.message,
            error_type(refusal.status),
            param=refusal.param,
            headers=headers,
        )

    def _waking(self, region: str, held: Held) -> web.Response:
        """503 with Retry-After the pool's measured wake: its pool was at zero and did
        not wake within the hold. Not an error of the region (asleep is not down):
        counted as a request, never a health vote, never spilled."""
        self.metrics.request(region, 503)
        return json_error(
            503,
            f"region {region!r} is waking from zero (held {held.waited_s:.1f} s); retry",
            "ServiceUnavailableError",
            headers={"Retry-After": str(held.retry_after_s)},
        )

    def _unavailable(self, region: str, kind: ErrorKind, message: str) -> web.Response:
        """503 with Retry-After: the client should retry shortly (a failover is usually
        under way, and the retry lands on the new region)."""
        self.metrics.error(region, kind)
        self.metrics.request(region, 503)
        retry = str(self.config.retry_after_s)
        return json_error(503, message, "ServiceUnavailableError", headers={"Retry-After": retry})

    async def models(self, request: web.BaseRequest) -> web.StreamResponse:
        """vLLM's model list: from a serving replica, the home region's first; with
        model pools, the union of one replica of each pool's, each cut to the names its
        pool answers (what this gateway routes)."""
        routings = self.routing.routings
        lists = []
        for family, resolver in self.resolvers.by_family.items():
            home = resolver.home
            units = self.resolvers.units_of(family) or self.forwarder.regions
            regions = [home] if self_routed(routings, home) else []
            regions += sorted(r for r in units if r != home and self_routed(routings, r))
            resp = await self.forwarder.get_any("/v1/models", regions)
            if resp is not None:
                lists.append((resp, self.resolvers.models_of(family)))
        if not lists:
            return self._unavailable(NO_REGION, ErrorKind.NO_REPLICA, "no serving replica answered")
        return union(lists)

    async def health(self, request: web.BaseRequest) -> web.Response:
        body = {
            "status": "stopping" if self.stopping else "serving",
            "home": self.config.home,
            "routing_revision": self.routing.revision,
            "routing_connected": self.routing.connected,
            "store_up": all(r.store_up for r in self.resolvers),
            "pending_pins": sum(r.pending for r in self.resolvers),
        }
        return web.Response(
            status=503 if self.stopping else 200,
            text=json.dumps(body),
            content_type="application/json",
        )

    async def metrics_page(self, request: web.BaseRequest) -> web.Response:
        """The exposition, rendered in a thread (0.4 s at 512 regions: on the event
        loop, every request would wait for it); scrapes during a render share it."""
        self.metrics.routing_revision.set(self.routing.revision)
        resp = web.Response(body=await self.scrape())
        resp.headers["Content-Type"] = CONTENT_TYPE
        return resp
