"""Envoy's external processing service: one bidirectional gRPC stream per HTTP request,
driven by the messages Envoy sends. The body mode comes from the stream's first
message (``protocol_config``; the configured default for an Envoy that does not say):

- header-only (body mode NONE, or a request without a body): the picker answers the
  request headers with the destination, from the session header alone;
- BUFFERED: the headers are let through unchanged, the whole body comes in one
  message, and the answer to it carries the destination (and a replaced body, when an
  actuator changed it);
- FULL_DUPLEX_STREAMED: the headers' answer waits for the body's last piece; then the
  destination goes out with the headers' answer and the body is streamed back (Envoy
  forwards what the picker sends, not what it received).

The response headers are answered with ``x-tectonic-region`` (the region that served);
response bodies are not asked for and stream through Envoy untouched.

A request for a pool at zero is held while the pool wakes (scale to zero,
``regions/dataplane/wake.py``): seconds to a minute, far past Envoy's ext_proc
``message_timeout`` (1 s shipped), after which Envoy would fail the request open. So
before holding, the picker asks Envoy to wait the hold plus ``HOLD_MARGIN_S``
(``override_message_timeout``, at most ``max_message_timeout_s``: Envoy's filter must
allow as much with its ``max_message_timeout``). The pick runs as a task, so that this
goes out while the answer is still being worked out.

Admission control (``tectonic-epp --admission``) holds the request's slot from the
pick until the ext_proc stream ends, which Envoy does when the HTTP request ends (the
last byte of a streamed answer, or a reset): the one end every configuration shows, as
response bodies are not sent to the picker by default. The limit is steered by the
first response body chunk when Envoy sends bodies (``response_body_mode`` other than
NONE, as ``protocol_config`` says), else by the response headers, which a streaming
server may send before its first token (then the measured bound does more of the work).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from controlplane.kernel.logs import REQUEST_ID, REQUEST_ID_HEADER
from regions.picker import extproc
from regions.picker.extproc import BODY_BUFFERED, BODY_FULL_DUPLEX, BODY_NONE
from regions.picker.pick import Answer, Pick, Picker

log = logging.getLogger("tectonic.picker")
# Envoy's ext_proc max_message_timeout in deploy/envoy/envoy.yaml: the longest the
# picker may ask Envoy to wait for one answer (a longer ask is ignored by Envoy)
MAX_MESSAGE_TIMEOUT_S = 90.0
# asked beyond the hold itself: placing the request after it (admission's wait
# included, which stays under Envoy's message_timeout) and the way back to Envoy
HOLD_MARGIN_S = 5.0


class ExtProcService(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self,
        picker: Picker,
        *,
        default_body_mode: int = BODY_BUFFERED,
        max_body_bytes: int,
        max_message_timeout_s: float = MAX_MESSAGE_TIMEOUT_S,
    ) -> None:
        self.picker = picker
        self.default_body_mode = default_body_mode
        self.max_body_bytes = max_body_bytes
        self.max_message_timeout_s = max_message_timeout_s

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[pb.ProcessingRequest, pb.ProcessingResponse],
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = _Stream(self)
        try:
            async for message in request_iterator:
                if not stream.read(message):  # answered at once: no hold to tell of
                    for answer in await stream.on(message):
                        yield answer
                    continue
                # the pick's work in a task: what it tells Envoy meanwhile (the hold's
                # extension) goes out at once, then its answers
                told: asyncio.Queue[pb.ProcessingResponse | None] = asyncio.Queue()
                stream.tell = told.put_nowait
                work = asyncio.ensure_future(stream.on(message))
                work.add_done_callback(partial(_worked, told))
                try:
                    while (early := await told.get()) is not None:
                        yield early
                    answers = work.result()
                finally:  # Envoy gave up on the stream: so does the work (the hold)
                    stream.tell = None
                    work.cancel()
                for answer in answers:
                    yield answer
        finally:  # Envoy ends the stream when the HTTP request ends: the in-flight count
            if stream.pick is not None:
                self.picker.release(stream.pick)


def _worked(told: asyncio.Queue[pb.ProcessingResponse | None], _: object) -> None:
    told.put_nowait(None)  # the message's work is done: its answers follow


class _Stream:
    """One HTTP request's exchange."""

    __slots__ = (
        "awaiting_body",
        "body",
        "headers",
        "mode",
        "pick",
        "response_mode",
        "service",
        "subset",
        "tell",
    )

    def __init__(self, service: ExtProcService) -> None:
        self.service = service
        self.mode = service.default_body_mode
        self.response_mode = BODY_NONE  # response bodies, when Envoy says it sends them
        self.awaiting_body = False  # the first response body chunk is the first token
        self.headers: dict[str, str] = {}
        self.subset: frozenset[str] | None = None
        self.body = bytearray()
        self.pick: Pick | None = None
        # sends to Envoy before the answer to the message being worked on (Process)
        self.tell: Callable[[pb.ProcessingResponse], None] | None = None

    def read(self, message: pb.ProcessingRequest) -> bool:
        """Take in what ``message`` says of the request before it is worked on: its
        headers, body mode and id (here, in the exchange's own context, so that what
        its later messages log names the request). Whether the pick answers it (the
        headers in header-only mode or without a body, else the body's last piece):
        the one answer a hold for a pool at zero delays."""
        kind = message.WhichOneof("request")
        if kind == "request_body":
            return bool(message.request_body.end_of_stream)
        if kind != "request_headers":
            return False
        if message.HasField("protocol_config"):
            self.mode = message.protocol_config.request_body_mode
            self.response_mode = message.protocol_config.response_body_mode
        self.headers = extproc.headers_of(message.request_headers)
        # The stream is one HTTP request: what it logs names Envoy's request id.
        REQUEST_ID.set(self.headers.get(REQUEST_ID_HEADER, ""))
        self.subset = extproc.subset_of(message.metadata_context)
        return bool(message.request_headers.end_of_stream) or self.mode not in (
            BODY_BUFFERED,
            BODY_FULL_DUPLEX,
        )

    async def on(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return await self._request_headers(message)
        if kind == "request_body":
            return await self._request_body(message.request_body)
        if kind == "response_headers":
            return await self._response_headers(message)
        if kind == "response_body":
            if self.awaiting_body and self.pick is not None:
                self.awaiting_body = False
                self.service.picker.first_token(self.pick)
            return [extproc.CONTINUE_RESPONSE_BODY]
        if kind == "request_trailers":
            return [extproc.CONTINUE_REQUEST_TRAILERS]
        if kind == "response_trailers":
            return [extproc.CONTINUE_RESPONSE_TRAILERS]
        return []

    async def _request_headers(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        # read() has taken in the headers
        if message.request_headers.end_of_stream or self.mode not in (
            BODY_BUFFERED,
            BODY_FULL_DUPLEX,
        ):
            if self.mode not in (BODY_NONE, BODY_BUFFERED, BODY_FULL_DUPLEX):
                log.warning("body mode %d is not supported: picking on headers", self.mode)
            return [await self._route(None, on_body=False)]
        if self.mode == BODY_BUFFERED:
            return [extproc.CONTINUE_REQUEST_HEADERS]
        return []  # full duplex: the headers' answer waits for the body

    async def _request_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        self.body += body.body
        if len(self.body) > self.service.max_body_bytes:
            return [self._too_large()]
        if not body.end_of_stream:
            return []
        data = bytes(self.body)
        if self.mode == BODY_BUFFERED:
            return [await self._route(data, on_body=True)]
        first = await self._route(data, on_body=False)
        if first.WhichOneof("response") == "immediate_response":
            return [first]
        assert self.pick is not None
        sent = self.pick.body if self.pick.body is not None else data
        return [first, *extproc.body_chunks(sent)]

    async def _route(self, body: bytes | None, *, on_body: bool) -> pb.ProcessingResponse:
        picked = await self.service.picker.pick(self.headers, body, self.subset, on_hold=self._held)
        if isinstance(picked, Answer):
            return extproc.immediate(picked.status, picked.body, picked.headers)
        self.pick = picked
        return extproc.routed(
            picked.endpoints,
            picked.headers,
            on_body=on_body,
            # full duplex streams the body back instead
            body=picked.body if on_body else None,
        )

    async def _response_headers(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        if self.pick is None:  # e.g. Envoy's own answer to a request the picker refused
            return [extproc.CONTINUE_RESPONSE_HEADERS]
        headers = extproc.headers_of(message.response_headers)
        try:
            status = int(headers.get(":status", "0"))
        except ValueError:
            status = 0
        served = extproc.served_of(message.metadata_context)
        region = await self.service.picker.served(self.pick, served, status)
        if status == 200 and self.response_mode == BODY_NONE:
            self.service.picker.first_token(self.pick)
        elif status == 200:
            self.awaiting_body = True
        return [extproc.region_header(region)]

    def _held(self, hold_s: float) -> None:
        """The request is about to be held ``hold_s`` while its pool wakes: ask Envoy to
        wait that long for the answer, and the margin (at most what Envoy allows)."""
        if self.tell is not None:
            wait_s = min(hold_s + HOLD_MARGIN_S, self.service.max_message_timeout_s)
            self.tell(extproc.extend(wait_s))

    def _too_large(self) -> pb.ProcessingResponse:
        limit = self.service.max_body_bytes
        answer = self.service.picker.too_large(limit)
        return extproc.immediate(answer.status, answer.body, answer.headers)
