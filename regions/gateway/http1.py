"""One HTTP/1.1 client connection to a vLLM replica; its responses are parsed by
``httptools`` (llhttp, the parser uvicorn and Node.js use), not by hand.

``Connection`` is an ``asyncio.Protocol``: it writes a request in one piece and feeds
the response's bytes to a fresh ``httptools.HttpResponseParser`` as they arrive. The
parser's callbacks record the final status and headers (1xx heads and trailers are
skipped) and queue body bytes for the consumer; framing (Content-Length, chunked with
extensions and trailers, 204/304) is llhttp's. Two cases llhttp cannot know about are
ours: a response to HEAD ends with its head, and one framed by the connection's end
ends at EOF (httptools does not expose ``llhttp_finish``). Reading pauses while more
than ``HIGH_WATER`` bytes wait (a slow client slows the replica, not our memory), and
one timer per response fails it after ``silence_s`` without a byte. The pool and the
response object that use it are in ``upstream.py``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser

from regions.dataplane.failures import UpstreamFailure

HIGH_WATER = 256 * 1024
MAX_HEAD = 64 * 1024  # llhttp has no limit of its own on a head's size
_NO_BODY_STATUS = frozenset({204, 304})


class UpstreamError(Exception):
    def __init__(self, kind: UpstreamFailure, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


class _ProtocolViolation(Exception):
    """Raised inside a parser callback; llhttp stops and ``feed_data`` raises."""


class Connection(asyncio.Protocol):
    """One connection and the response in flight on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.reused = False
        self._timer: asyncio.TimerHandle | None = None  # outlives a response: see start
        self._reset(None)

    def _reset(self, parser: HttpResponseParser | None) -> None:
        self._parser = parser  # None while no request is in flight
        self.status = 0  # of the final response; 0 until its head has arrived
        self.headers: list[tuple[str, str]] = []
        self.content_length: int | None = None
        self.keep_alive = True
        self.done = False  # the whole response arrived
        self._parsed = False  # ... and llhttp itself ended it (its parser can go on)
        self.got_bytes = False
        self.head_method = False
        self._chunked = False
        self._until_eof = False
        self._head_bytes = 0
        self.chunks: deque[bytes] = deque()
        self._queued = 0
        self._paused = False
        self.exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._last_data = 0.0
        self._silence_s = 0.0

    # ---- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self._last_data = self._loop.time()
        parser = self._parser
        try:
            if parser is None or self.done:  # bytes nobody asked for: cannot be trusted
                raise _ProtocolViolation("data after the end of the response")
            parser.feed_data(data)
            if not self.status:
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD:
                    raise _ProtocolViolation("response head too long")
        except HttpParserUpgrade:
            self._violation("an upgrade was not asked for")
        except HttpParserError as e:  # a callback's own exception is its context
            self._violation(str(e.__context__ or e))
        except _ProtocolViolation as e:
            self._violation(str(e))
        self._wake()

    def eof_received(self) -> bool | None:
        if self._until_eof and self.status and not self.done:
            self.done, self.keep_alive = True, False
        self._wake()
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.stop_timer()  # no byte can come now: the response is done or failed below
        if self._until_eof and self.status:
            self.done = True
        if not self.done and self._parser is not None:
            what = "connection closed" if exc is None else f"{type(exc).__name__}: {exc}"
            self._fail(UpstreamError(UpstreamFailure.DISCONNECT, what))
        self._wake()

    def pause_writing(self) -> None:  # request bodies are small; nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    # ---- httptools callbacks ---------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.done:  # a second response to one request
            raise _ProtocolViolation("data after the end of the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.status:
            return  # a trailer field: not passed on
        low = name.lower()
        if low == b"content-length":
            self.content_length = int(value)
        elif low == b"transfer-encoding":
            self._chunked = value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
            self.content_length = None
        self.headers.append((name.decode("latin-1"), value.decode("latin-1").strip()))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        if status < 200:  # informational (100 Continue, 103 Early Hints): skipped
            self.headers, self.content_length, self._chunked = [], None, False
            return
        self.status = status
        self.keep_alive = self._parser.should_keep_alive()
        if self.head_method or status in _NO_BODY_STATUS:
            self.content_length = 0
            self.done = self.head_method  # llhttp ends a 204/304 itself
        elif self._chunked:
            self.content_length = None
        elif self.content_length is None:
            self._until_eof, self.keep_alive = True, False

    def on_body(self, body: bytes) -> None:
        if self.done:  # a body after a HEAD response's head
            raise _ProtocolViolation("data after the end of the response")
        self.chunks.append(body)
        self._queued += len(body)
        if self._queued > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.status:  # not the end of a 1xx
            self.done = True
            self._parsed = True

    # ---- the consumer side -----------------------------------------------------------

    def take(self) -> bytes:
        """Everything queued so far, in one piece."""
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self._queued = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def wait(self) -> None:
        """Until more of the response arrived, it ended, or it failed (also by the
        silence timer: no byte for ``silence_s``)."""
        if self.exc is not None:
            raise self.exc
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None
        if self.exc is not None:
            raise self.exc

    def _check_silence(self) -> None:
        """One timer per response, re-armed from the last byte's time, instead of a
        timeout scope per wait (which cost ~6 % of the gateway's CPU)."""
        self._timer = None
        if self.done or self.exc is not None:
            return
        now = self._loop.time()
        due = self._last_data + self._silence_s
        if self._paused:  # the consumer is slow, not the replica: check again later
            due = now + self._silence_s
        if due > now:
            self._timer = self._loop.call_at(due, self._check_silence)
            return
        self._fail(UpstreamError(UpstreamFailure.TIMEOUT, f"no data for {self._silence_s:g} s"))
        self._wake()
        self.close()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.exc is None:
            self.exc = exc

    def _violation(self, detail: str) -> None:
        self._fail(UpstreamError(UpstreamFailure.PROTOCOL, f"bad response: {detail}"))
        self.close()

    def start(self, request: bytes, *, head_method: bool, silence_s: float) -> None:
        """Send ``request``. The previous response's parser goes on if llhttp ended that
        response cleanly (as a server's parser goes on from request to request); else a
        fresh one starts (after a HEAD, llhttp still expects the announced body). The
        silence timer of the previous response too, if still pending and not due later
        than this one's: when it fires, it re-arms from this response's last byte."""
        parser = self._parser if self._parsed and self.exc is None else None
        self._reset(parser or HttpResponseParser(self))
        self.head_method = head_method
        self._silence_s = silence_s
        now = self._last_data = self._loop.time()
        timer = self._timer
        if timer is None or timer.when() > now + silence_s:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(now + silence_s, self._check_silence)
        assert self.transport is not None
        self.transport.write(request)

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self.stop_timer()
        if self.transport is not None:
            self.transport.close()
