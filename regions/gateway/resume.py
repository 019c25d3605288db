"""Relaying a stream that may be continued, and continuing it when its replica fails
after the first byte (docs/reliability.md, "What a continued stream guarantees").

``continuation.py`` is the pure half (what may be continued, what the client has, the
continuation's body, the splice); this is the I/O: the relay that records what the
client receives and writes only whole events, the search for a replica (of the region,
then of the session's next region) that takes the continuation, the count of tokens
generated (vLLM's ``/tokenize``), and the splice into the client's stream. When none
takes it, the cut is visible as without continuation (:func:`cut_stream`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web

from controlplane.kernel import tracing
from regions.dataplane.failures import ErrorKind, UpstreamFailure
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.requests import error_body
from regions.gateway.continuation import (
    DONE,
    INBAND_ERROR,
    Broken,
    Continuer,
    Partial,
    Splice,
    Transcript,
    continuation_body,
    last_event_end,
    loads_object,
    refusal,
    wants_usage,
)
from regions.gateway.metrics import GatewayMetrics
from regions.gateway.upstream import UpstreamError, UpstreamPool, UpstreamResponse

log = logging.getLogger("tectonic.gateway.proxy")
TRACER = "tectonic.gateway"
STREAM_BROKEN_STATUS = 502  # a stream cut after its first byte: its error event and its count
SSE = "text/event-stream"
# The end of an answer among an SSE stream's last events: ``[DONE]``, or a choice's
# finish_reason (a client may stop there: it has the whole answer; the usage chunk and
# ``[DONE]`` may follow, so the last two chunks written are searched).
_ANSWER_END = re.compile(rb'data: \[DONE\]|"finish_reason": ?"')


@dataclass(slots=True)
class Resume:
    """A continuer with what ``Forwarder.forward`` knows: the ring key, the replicas
    tried (a continuation goes elsewhere), the headers to send."""

    continuer: Continuer
    key: int
    tried: set[str]
    headers: Sequence[tuple[str, str]]


class Resumer:
    """The Forwarder's relay for streams that may be continued."""

    def __init__(
        self,
        pool: UpstreamPool,
        balancers: Mapping[str, ReplicaBalancer],
        metrics: GatewayMetrics,
        eject_s: float,
        monotonic: Callable[[], float],
    ) -> None:
        self._pool, self._balancers, self._metrics = pool, balancers, metrics
        self._eject_s, self._monotonic = eject_s, monotonic

    async def stream(
        self,
        request: web.BaseRequest,
        resp: web.StreamResponse,
        up: UpstreamResponse,
        region: str,
        first: bytes,
        resume: Resume,
    ) -> int:
        """Pass on a stream that may be continued, after its first bytes: what the
        client receives is recorded, only whole events are written (a continuation
        cannot follow half of one), each chunk is checked for vLLM's in-band error
        event before it is written, and a failure hands over to ``_continue``."""
        transcript = Transcript(resume.continuer.endpoint)
        transcript.add(first)
        before, last, held = b"", first, b""
        try:
            while (chunk := await up.next_chunk()) is not None:
                if held:
                    chunk, held = held + chunk, b""
                if (at := chunk.find(INBAND_ERROR)) >= 0:
                    if at:  # the events before it are the client's
                        await resp.write(chunk[:at])
                        transcript.add(chunk[:at])
                    raise Broken("the replica sent an in-band error event")
                end = last_event_end(chunk)
                if end < len(chunk):
                    chunk, held = chunk[:end], chunk[end:]
                if chunk:
                    await resp.write(chunk)
                    transcript.add(chunk)
                    before, last = last, chunk
            if held:
                await resp.write(held)
            if not had_answer(up, before, last + held):
                raise Broken("the stream ended before its last event")
            await resp.write_eof()
        except ConnectionError:
            if not had_answer(up, before, last):
                self._metrics.error(region, ErrorKind.CLIENT_GONE)
        except (UpstreamError, Broken) as e:
            self._metrics.error(region, ErrorKind.STREAM_BROKEN)
            log.warning("stream from a replica of %s broke after the first byte: %s", region, e)
            with tracing.start(
                TRACER,
                "continuation",
                attributes={"tectonic.region": region, "tectonic.cut": str(e)},
            ) as span:
                status = await self._continue(request, resp, region, transcript, resume)
                if span is not None:
                    span.set_attribute("http.response.status_code", status)
                return status
        return up.status

    async def _continue(
        self,
        request: web.BaseRequest,
        resp: web.StreamResponse,
        region: str,
        transcript: Transcript,
        resume: Resume,
    ) -> int:
        """Go on with a cut stream elsewhere (continuation.py); the status to count the
        answer with: 200 when the client got one whole stream, else the cut's."""
        cont = resume.continuer
        data = loads_object(cont.body)
        partial = transcript.partial()
        if partial.done or partial.finished:
            # The whole answer was sent; only its end (usage, [DONE]) was lost.
            with contextlib.suppress(ConnectionError):
                if not partial.done:
                    await resp.write(DONE)
                await resp.write_eof()
            self._metrics.continuation(region, "ended")
            return 200
        why = partial.refusal() or (
            "an unreadable request body" if data is None else refusal(cont.endpoint, data)
        )
        if why is not None:
            log.info("the cut stream of %s is not continued: %s", region, why)
            self._metrics.continuation(region, "refused")
            await cut_stream(request, resp, True)
            return STREAM_BROKEN_STATUS
        assert data is not None
        deadline = self._monotonic() + cont.config.deadline_s
        at = region
        for n in range(1, cont.config.max_continuations + 1):
            opened = await self._open_continuation(request, at, data, partial, resume, deadline)
            if opened is None:
                break
            up, at, generated = opened
            splice = Splice(partial, wants_usage(data), generated)
            try:
                await self._splice(resp, up, splice, transcript, region)
            except ConnectionError:
                return 200  # the client left while it was answered
            except (UpstreamError, Broken) as e:
                log.warning("continuation %d of a stream of %s broke: %s", n, region, e)
                partial = transcript.partial()
                if (why := partial.refusal()) is not None:
                    log.info("the cut stream of %s is not continued again: %s", region, why)
                    break
                continue
            finally:
                up.release()
            log.info("a cut stream of %s continued on %s (continuation %d)", region, at, n)
            return 200
        log.warning("the cut stream of %s could not be continued anywhere", region)
        self._metrics.continuation(region, "failed")
        await cut_stream(request, resp, True)
        return STREAM_BROKEN_STATUS

    async def _open_continuation(
        self,
        request: web.BaseRequest,
        region: str,
        data: dict[str, object],
        partial: Partial,
        resume: Resume,
        deadline: float,
    ) -> tuple[UpstreamResponse, str, int] | None:
        """A streaming answer that goes on from ``partial``, from another replica of
        ``region``, else (once) of the session's next region; with the region it came
        from and the tokens counted as generated before it."""
        moved = False
        while True:
            opened = await self._open_in(request, region, data, partial, resume, deadline)
            if opened is not None:
                return opened[0], region, opened[1]
            if moved or self._monotonic() >= deadline:
                return None
            nxt = await resume.continuer.next_region(region)
            if nxt is None:
                return None
            region, moved = nxt, True

    async def _open_in(
        self,
        request: web.BaseRequest,
        region: str,
        data: dict[str, object],
        partial: Partial,
        resume: Resume,
        deadline: float,
    ) -> tuple[UpstreamResponse, int] | None:
        balancer = self._balancers.get(region)
        endpoint = resume.continuer.endpoint
        while balancer is not None and (now := self._monotonic()) < deadline:
            replica = balancer.choose(resume.key, now=now, exclude=resume.tried)
            if replica is None:
                return None
            resume.tried.add(replica)
            try:
                generated = await self._generated(replica, data, partial, resume.headers)
                body = continuation_body(endpoint, data, partial, generated)
                up = await self._pool.request(
                    replica, "POST", request.path_qs, resume.headers, body
                )
            except UpstreamError as e:
                if e.kind is UpstreamFailure.CONNECT:
                    balancer.eject(replica, now + self._eject_s)
                continue
            if up.status == 200 and up.content_type == SSE:
                return up, generated
            log.info("continuation on %s refused: HTTP %d", replica, up.status)
            up.release()
            if up.status < 500:
                return None  # e.g. 404: this region does not serve the model
        return None

    async def _generated(
        self,
        replica: str,
        data: dict[str, object],
        partial: Partial,
        headers: Sequence[tuple[str, str]],
    ) -> int:
        """How many tokens the text sent so far is, by ``replica``'s tokenizer (vLLM's
        ``/tokenize``); the content-bearing events counted when it cannot say."""
        body = {"model": data.get("model"), "prompt": "".join(partial.text)}
        body["add_special_tokens"] = False
        up = await self._pool.request(
            replica, "POST", "/tokenize", headers, json.dumps(body).encode()
        )
        try:
            answer = loads_object(await up.read()) if up.status == 200 else None
        finally:
            up.release()
        count = answer.get("count") if answer is not None else None
        if isinstance(count, int) and not isinstance(count, bool):
            return count
        log.info("%s cannot tokenize (HTTP %d): tokens counted as events", replica, up.status)
        return partial.tokens

    async def _splice(
        self,
        resp: web.StreamResponse,
        up: UpstreamResponse,
        splice: Splice,
        transcript: Transcript,
        region: str,
    ) -> None:
        while (chunk := await up.next_chunk()) is not None:
            for out in splice.feed(chunk):
                if out is DONE:  # counted before the client can have it
                    self._metrics.continuation(region, "continued")
                await resp.write(out)
                transcript.add(out)
        if not splice.done:
            raise Broken("the continuation ended before [DONE]")
        await resp.write_eof()


async def cut_stream(request: web.BaseRequest, resp: web.StreamResponse, sse: bool) -> None:
    """The replica failed mid-stream: say so in-band if the stream is SSE, then drop
    the connection so that the truncation is visible."""
    if sse:
        event = error_body(
            "the replica failed mid-stream", "ServiceUnavailableError", STREAM_BROKEN_STATUS
        )
        with contextlib.suppress(ConnectionError):
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    if request.transport is not None:
        request.transport.close()


def had_answer(up: UpstreamResponse, before: bytes, last: bytes) -> bool:
    """Whether an SSE stream's last two chunks written end the answer (searched only
    when the client has closed: nothing is parsed on the way through)."""
    if up.content_type != SSE:
        return False
    return _ANSWER_END.search(last) is not None or _ANSWER_END.search(before) is not None
