"""Forwarding one request to a replica of its region, streaming the answer back.

* Upstream requests go through ``UpstreamPool`` (``upstream.py``): pooled
  keep-alive connections, one write per request, bodies passed through as bytes
  (never decompressed or re-encoded).
* Streaming pass-through: response bytes are written to the client as they arrive,
  never collected; only a small body with a known length is read in one piece,
  which saves a write per chunk and holds at most ``small_body_bytes``.
* Retries go to another replica of the same region (never another region: that
  would break the session's pin) and only before the first byte reached the client:
  on a refused/failed connection, a disconnect before the first body bytes, or a
  5xx answer. No new attempt starts after ``retry_deadline_s`` from the request's
  arrival; a replica that refused a connection is skipped for ``eject_s``.
* After the first byte is sent, a streamed completion whose replica fails (reset, EOF
  before its end, vLLM's in-band error event) is continued on another replica of the
  region, or of the session's next region (``resume.py``, ``continuation.py``), when
  the request allows it; otherwise, or when no continuation takes, the failure cannot
  be hidden: an SSE stream gets a final ``data: {"error": ...}`` event (what vLLM
  itself sends), then the connection is closed without the terminating chunk, so the
  client sees the cut.
* Accounting: the first byte (first-token histogram, health vote) is counted when it
  is sent, the answer (``tectonic_gateway_requests_total``) when the stream ends: a
  stream cut mid-way counts as 502, the status its in-band error event carries, so
  that every 5xx error rate sees it. ``client_gone`` is a client that closed before it
  had the whole answer; clients close right after ``[DONE]`` (the official openai
  client does), often before the chunked body's end is written, and those are answers.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict
from opentelemetry.trace import Span, SpanKind, StatusCode

from controlplane.kernel import tracing
from controlplane.kernel.logs import REQUEST_ID, REQUEST_ID_HEADER
from regions.dataplane.admission_gate import ADMISSION_OFF, Gates, Grant, Refusal
from regions.dataplane.failures import ErrorKind
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.requests import error_body, error_type
from regions.gateway.continuation import Continuer
from regions.gateway.metrics import GatewayMetrics
from regions.gateway.resume import (
    SSE,
    STREAM_BROKEN_STATUS,
    Resume,
    Resumer,
    cut_stream,
    had_answer,
)
from regions.gateway.upstream import UpstreamError, UpstreamPool, UpstreamResponse

log = logging.getLogger("tectonic.gateway.proxy")
TRACER = "tectonic.gateway"
REGION_HEADER = "x-tectonic-region"
RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
# Hop-by-hop headers (RFC 9110 §7.6.1) and those the upstream client sets itself.
_SKIP_REQUEST = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
        "expect",
    }
)
_SKIP_RESPONSE = frozenset(
    {
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "trailer",
        "upgrade",
        "date",
        "server",
    }
)


@dataclass(frozen=True)
class ProxyConfig:
    retry_deadline_s: float = 10.0
    connect_timeout_s: float = 1.0
    read_timeout_s: float = 300.0  # between two chunks (and for the head): long prefill
    eject_s: float = 2.0
    small_body_bytes: int = 64 * 1024


class NoReplica(Exception):
    """No replica of the region took the request before the deadline (503)."""


@dataclass(frozen=True, slots=True)
class _Failed:
    kind: ErrorKind
    detail: str
    status: int = 0
    body: bytes = b""
    headers: CIMultiDict[str] | None = None


def new_pool(config: ProxyConfig) -> UpstreamPool:
    return UpstreamPool(
        connect_timeout_s=config.connect_timeout_s, read_timeout_s=config.read_timeout_s
    )


def forward_headers(request: web.BaseRequest) -> list[tuple[str, str]]:
    """The request's headers the model server gets, with the request id when the client
    sent none (``controlplane/kernel/logs.py``): vLLM takes it as its own request id."""
    keep = _FORWARD_REQUEST
    out = []
    for k, v in request.headers.items():
        passed = keep.get(k)
        if passed is None:
            passed = _remember(keep, k, _SKIP_REQUEST)
        if passed:
            out.append((k, v))
    if (rid := REQUEST_ID.get()) and REQUEST_ID_HEADER not in request.headers:
        out.append((REQUEST_ID_HEADER, rid))
    tracing.inject(out)  # the request's span is the model server's parent
    return out


# Header names as sent -> whether they are passed on: one dict lookup per header instead
# of a lowercased copy (clients send a few spellings of a few names; a full memo is
# emptied, so any number of distinct names stays bounded).
_FORWARD_REQUEST: dict[str, bool] = {}
_FORWARD_RESPONSE: dict[str, bool] = {}
_MEMO_MAX = 1024


def _remember(memo: dict[str, bool], name: str, skip: frozenset[str]) -> bool:
    passed = name.lower() not in skip
    if len(name) <= 256:
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[name] = passed
    return passed


def json_error(
    status: int,
    message: str,
    err_type: str,
    *,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(error_body(message, err_type, status, param)).encode(),
        content_type="application/json",
        headers=headers,
    )


class Forwarder:
    def __init__(
        self,
        pool: UpstreamPool,
        balancers: Mapping[str, ReplicaBalancer],
        metrics: GatewayMetrics,
        config: ProxyConfig | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        on_attempt: Callable[[str, bool, int], None] | None = None,
        time_first_byte: bool = True,
        admission: Gates = ADMISSION_OFF,
    ) -> None:
        # per-replica in-flight limits, or AdmissionOff (regions/dataplane/admission_gate.py)
        self._admission = admission
        # (region, answered, status or 0): the health vote (regions/dataplane/report.py)
        self._on_attempt = on_attempt
        # False: answers that are no generation stay out of the first-token histogram
        self._observe_first_byte = metrics.first_byte if time_first_byte else _untimed
        self._pool = pool
        self._balancers = balancers
        self._metrics = metrics
        self.config = config or ProxyConfig()
        self._monotonic = monotonic
        self._resumer = Resumer(pool, balancers, metrics, self.config.eject_s, monotonic)

    @property
    def regions(self) -> list[str]:
        return list(self._balancers)

    async def forward(
        self,
        request: web.BaseRequest,
        region: str,
        body: bytes,
        key: int,
        started: float,
        headers: Sequence[tuple[str, str]] | None = None,
        continuer: Continuer | None = None,
    ) -> web.StreamResponse:
        """Send ``body`` to ``request.path`` on a replica of ``region`` chosen by ``key``
        with ``headers`` (default: ``forward_headers(request)``); ``continuer``: how to
        continue its stream if the replica fails mid-way (None: the cut is visible).
        Returns the response (already streamed, or to be sent); raises NoReplica."""
        balancer = self._balancers.get(region)
        if balancer is None or not balancer.replicas:
            raise NoReplica(
                f"region {region!r} has no replica to route to (none configured, or its "
                "warm pool has no ACTIVE replica)"
            )
        if headers is None:
            headers = forward_headers(request)
        deadline = started + self.config.retry_deadline_s
        tried: set[str] = set()
        failed: _Failed | None = None
        while True:
            now = self._monotonic()
            replica = balancer.choose(key, now=now, exclude=tried)
            if replica is None or (tried and now >= deadline):
                break
            if tried:
                self._metrics.retry(region)
            # may wait for a slot, here or on another replica (AdmissionOff: never)
            with tracing.start(TRACER, "admission", attributes={"tectonic.region": region}):
                entered = await self._admission.enter(
                    region, request.headers, balancer, key, replica, tried, now
                )
            if isinstance(entered, Refusal):
                return self._overloaded(region, entered)
            grant = entered
            if grant is not None:
                replica = grant.replica
            tried.add(replica)
            resume = Resume(continuer, key, tried, headers) if continuer else None
            with tracing.start(
                TRACER,
                "upstream",
                kind=SpanKind.CLIENT,
                attributes={"server.address": replica, "tectonic.region": region},
            ) as span:
                outcome = await self._attempt_held(
                    request, region, balancer, replica, key, body, headers, started, resume, grant
                )
                if span is not None:
                    _outcome_on(span, outcome)
            if not isinstance(outcome, _Failed):
                balancer.readmit(replica)
                return outcome
            failed = outcome
            self._attempt_failed(request, region, balancer, replica, outcome)
        if failed is not None and failed.status:
            return self._relay_failure(failed, region)  # the replica's own 5xx answer
        raise NoReplica(
            f"no replica of {region} answered: {failed.detail if failed else 'none available'}"
        )

    async def _attempt_held(
        self,
        request: web.BaseRequest,
        region: str,
        balancer: ReplicaBalancer,
        replica: str,
        key: int,
        body: bytes,
        headers: Sequence[tuple[str, str]],
        started: float,
        resume: Resume | None,
        grant: Grant | None,
    ) -> web.StreamResponse | _Failed:
        """One attempt on ``replica``, counted in flight on its balancer (timed and
        keyed: the balancer foresees waits and what each replica caches) and holding
        admission control's ``grant`` until it ends."""
        balancer.acquire(replica, now=self._monotonic(), key=key)
        try:
            return await self._attempt(
                request, region, replica, body, headers, started, resume, grant
            )
        finally:
            balancer.release(replica)
            if grant is not None:
                self._admission.leave(region, grant)

    def _attempt_failed(
        self,
        request: web.BaseRequest,
        region: str,
        balancer: ReplicaBalancer,
        replica: str,
        failed: _Failed,
    ) -> None:
        """Count a failed attempt, vote against its region, and eject a replica that
        refused the connection for ``eject_s``."""
        self._metrics.error(region, failed.kind)
        if self._on_attempt is not None:
            self._on_attempt(region, False, failed.status)
        if failed.kind is ErrorKind.CONNECT:
            balancer.eject(replica, self._monotonic() + self.config.eject_s)
        log.info(
            "%s %s on %s: %s (%s)",
            request.method,
            request.path,
            replica,
            failed.kind,
            failed.detail,
        )

    async def _attempt(
        self,
        request: web.BaseRequest,
        region: str,
        replica: str,
        body: bytes,
        headers: Sequence[tuple[str, str]],
        started: float,
        resume: Resume | None = None,
        grant: Grant | None = None,
    ) -> web.StreamResponse | _Failed:
        try:
            up = await self._pool.request(replica, request.method, request.path_qs, headers, body)
        except UpstreamError as e:
            return _Failed(ErrorKind.of(e.kind), e.detail)
        try:
            if up.status in RETRYABLE_STATUS:
                return _Failed(
                    ErrorKind.UPSTREAM_5XX,
                    f"HTTP {up.status}",
                    up.status,
                    await up.read(),
                    _response_headers(up),
                )
            return await self._relay(request, up, region, started, resume, grant)
        except UpstreamError as e:  # raised by _relay only before the first byte
            return _Failed(ErrorKind.of(e.kind), e.detail)
        finally:
            up.release()

    async def _relay(
        self,
        request: web.BaseRequest,
        up: UpstreamResponse,
        region: str,
        started: float,
        resume: Resume | None = None,
        grant: Grant | None = None,
    ) -> web.StreamResponse:
        """Pass the replica's answer through. Until the first bytes are written, errors
        propagate (the caller retries); after them, they end the stream here. ``grant``:
        admission control's, told the first token of a streamed answer."""
        hdrs = _response_headers(up)
        hdrs[REGION_HEADER] = region
        length = up.content_length
        if length is not None and length <= self.config.small_body_bytes:
            data = await up.read()
            self._answered(region, up.status, started)
            return web.Response(status=up.status, body=data, headers=hdrs)
        first = await up.next_chunk() or b""
        resp = web.StreamResponse(status=up.status, headers=hdrs)
        if length is not None:
            resp.content_length = length
        try:
            await resp.prepare(request)
            await resp.write(first)
        except ConnectionError:
            self._metrics.error(region, ErrorKind.CLIENT_GONE)  # nobody left to tell
            return resp
        self._first_byte(region, up.status, started)
        if grant is not None and up.status == 200:
            self._admission.first_token(region, grant)
        if resume is not None and up.status == 200 and up.content_type == SSE:
            status = await self._resumer.stream(request, resp, up, region, first, resume)
        else:
            status = await self._stream_rest(request, resp, up, region, first)
        self._metrics.request(region, status)
        return resp

    async def _stream_rest(
        self,
        request: web.BaseRequest,
        resp: web.StreamResponse,
        up: UpstreamResponse,
        region: str,
        first: bytes,
    ) -> int:
        """Pass the body on after its first bytes; the status to count the answer with."""
        before, last = b"", first  # the last two chunks written, for ``_had_answer``
        ended = False
        try:
            while (chunk := await up.next_chunk()) is not None:
                await resp.write(chunk)
                before, last = last, chunk
            ended = True
            await resp.write_eof()
        except ConnectionError:
            if not (ended or had_answer(up, before, last)):
                self._metrics.error(region, ErrorKind.CLIENT_GONE)  # nobody left to tell
        except UpstreamError as e:
            self._metrics.error(region, ErrorKind.STREAM_BROKEN)
            log.warning("stream from a replica of %s broke after the first byte: %s", region, e)
            await cut_stream(request, resp, up.content_type == SSE)
            return STREAM_BROKEN_STATUS
        return up.status

    def _answered(self, region: str, status: int, started: float) -> None:
        self._first_byte(region, status, started)
        self._metrics.request(region, status)

    def _first_byte(self, region: str, status: int, started: float) -> None:
        self._observe_first_byte(region, self._monotonic() - started)
        if self._on_attempt is not None:
            self._on_attempt(region, True, status)

    def _overloaded(self, region: str, refusal: Refusal) -> web.Response:
        """429 with Retry-After: every replica of the region is at its in-flight limit
        (and the queue had no room or time for this request). Not an error of the
        region: no health vote, as for a degradation actuator's refusal."""
        self._metrics.request(region, 429)
        retry = str(refusal.retry_after_s)
        message = (
            f"region {region} is at its admission limit ({refusal.reason}, "
            f"{refusal.priority.value} request); retry after {retry} s"
        )
        headers = {"Retry-After": retry, REGION_HEADER: region}
        return json_error(429, message, error_type(429), headers=headers)

    def _relay_failure(self, failed: _Failed, region: str) -> web.Response:
        hdrs = failed.headers if failed.headers is not None else CIMultiDict[str]()
        hdrs[REGION_HEADER] = region
        self._metrics.request(region, failed.status)
        return web.Response(status=failed.status, body=failed.body, headers=hdrs)

    async def get_any(self, path: str, regions: Sequence[str]) -> web.Response | None:
        """``GET path`` from the first replica that answers 200, trying ``regions`` in
        order (for ``/v1/models``: any serving replica knows the model list)."""
        for region in regions:
            balancer = self._balancers.get(region)
            for replica in balancer.replicas if balancer else ():
                try:
                    up = await self._pool.request(replica, "GET", path, ())
                    try:
                        data = await up.read()
                    finally:
                        up.release()
                except UpstreamError as e:
                    log.info("GET %s on %s: %s", path, replica, e)
                    continue
                if up.status == 200:
                    hdrs = _response_headers(up)
                    hdrs[REGION_HEADER] = region
                    return web.Response(status=200, body=data, headers=hdrs)
        return None


def _outcome_on(span: Span, outcome: web.StreamResponse | _Failed) -> None:
    if isinstance(outcome, _Failed):
        span.set_attribute("error.type", outcome.kind.value)
        span.set_status(StatusCode.ERROR, outcome.detail)
    else:
        span.set_attribute("http.response.status_code", outcome.status)


def _untimed(region: str, seconds: float) -> None:
    pass


def _response_headers(up: UpstreamResponse) -> CIMultiDict[str]:
    keep = _FORWARD_RESPONSE
    out = []
    for k, v in up.headers:
        passed = keep.get(k)
        if passed is None:
            passed = _remember(keep, k, _SKIP_RESPONSE)
        if passed:
            out.append((k, v))
    h = CIMultiDict(out)
    if rid := REQUEST_ID.get():  # the gateway's own, whatever the model server said
        h[REQUEST_ID_HEADER] = rid
    return h
