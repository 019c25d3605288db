"""The gateway's HTTP/1.1 client (regions.gateway.upstream / http1) against tiny raw
asyncio servers on 127.0.0.1, so that every edge case is produced byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from regions.gateway.http1 import HIGH_WATER
from regions.gateway.upstream import UpstreamError, UpstreamPool, UpstreamResponse

Handler = Callable[["RawServer", asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class RawServer:
    """Runs ``handler(server, reader, writer, index)`` per accepted connection; counts
    connections and records every request read with ``read_request``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        index = self.connections
        self.connections += 1
        try:
            await self.handler(self, reader, writer, index)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the test is over (asyncio logs a cancelled one)
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


def serve_each(*responses: bytes) -> Handler:
    """Answer the requests on every connection with ``responses`` in turn (the last one
    repeated), keeping the connection open."""

    async def handler(
        srv: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        n = 0
        while True:
            await srv.read_request(reader)
            writer.write(responses[min(n, len(responses) - 1)])
            await writer.drain()
            n += 1

    return handler


OK_HELLO = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    p = UpstreamPool(connect_timeout_s=2.0, read_timeout_s=5.0)
    yield p
    p.close()


async def get(pool: UpstreamPool, url: str, method: str = "GET") -> tuple[UpstreamResponse, bytes]:
    up = await pool.request(url, method, "/x", [("Accept", "*/*")])
    try:
        return up, await up.read()
    finally:
        up.release()


async def test_a_content_length_body_and_its_head() -> None:
    async with RawServer(serve_each(OK_HELLO)) as srv:
        p = UpstreamPool()
        try:
            up = await p.request(srv.url, "POST", "/v1/x?a=1", [("X-Id", "7")], b'{"a":1}')
            assert (up.status, up.content_length, up.content_type) == (200, 5, "text/plain")
            assert ("Content-Type", "text/plain") in up.headers
            assert await up.read() == b"hello"
            up.release()
        finally:
            p.close()
        head = srv.requests[0]
        assert head.startswith(b"POST /v1/x?a=1 HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"\r\nX-Id: 7\r\n" in head and b"\r\nContent-Length: 7\r\n" in head
        assert head.endswith(b'\r\n\r\n{"a":1}')


async def test_chunked_with_extensions_and_trailers_fed_in_pieces(pool: UpstreamPool) -> None:
    pieces = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n",
        b"\r\n5;name=value\r\nhel",
        b'lo\r\n6;a=b;c="d e"\r\n wor',
        b"ld\r\n0\r\nX-Trailer: t\r\n",
        b"\r\n",
    ]

    async def handler(
        srv: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        while True:
            await srv.read_request(reader)
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.01)

    async with RawServer(handler) as srv:
        for _ in range(2):
            up, body = await get(pool, srv.url)
            assert (up.status, up.content_length, body) == (200, None, b"hello world")
            assert up.content_type == "text/event-stream"
            assert all(name != "X-Trailer" for name, _ in up.headers)  # trailers not passed on
        assert srv.connections == 1  # a chunked response ends cleanly: reused


async def test_a_body_read_until_the_connection_closes(pool: UpstreamPool) -> None:
    async def handler(
        srv: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nfirst ")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"second")
        await writer.drain()

    async with RawServer(handler) as srv:
        for _ in range(2):
            up, body = await get(pool, srv.url)
            assert (up.status, up.content_length, body) == (200, None, b"first second")
        assert srv.connections == 2  # framed by the close: never reused


async def test_informational_responses_before_the_final_one(pool: UpstreamPool) -> None:
    response = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" + OK_HELLO
    )
    async with RawServer(serve_each(response)) as srv:
        for _ in range(2):
            up, body = await get(pool, srv.url)
            assert (up.status, body) == (200, b"hello")
            assert [name for name, _ in up.headers] == ["Content-Length", "Content-Type"]
        assert srv.connections == 1


async def test_connection_close_is_not_reused(pool: UpstreamPool) -> None:
    close = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    async with RawServer(serve_each(close)) as srv:  # the server itself keeps it open
        for _ in range(3):
            _, body = await get(pool, srv.url)
            assert body == b"ok"
        assert srv.connections == 3


async def test_keep_alive_is_reused(pool: UpstreamPool) -> None:
    async with RawServer(serve_each(OK_HELLO)) as srv:
        for _ in range(5):
            up, body = await get(pool, srv.url)
            assert (up.status, body) == (200, b"hello")
        assert srv.connections == 1 and len(srv.requests) == 5


async def test_head_and_no_content_responses_end_with_their_head(pool: UpstreamPool) -> None:
    responses = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",  # to HEAD: no body follows
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n",
        OK_HELLO,
    )
    async with RawServer(serve_each(*responses)) as srv:
        up, body = await get(pool, srv.url, "HEAD")
        assert (up.status, up.content_length, body) == (200, 0, b"")
        for status in (204, 304):
            up, body = await get(pool, srv.url)
            assert (up.status, body) == (status, b"")
        up, body = await get(pool, srv.url)
        assert (up.status, body) == (200, b"hello")
        assert srv.connections == 1


async def test_a_stale_pooled_connection_is_retried_once_on_a_new_one(pool: UpstreamPool) -> None:
    async def handler(
        srv: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        await srv.read_request(reader)
        writer.write(OK_HELLO)
        await writer.drain()
        if index == 0:  # closes while the next request is on its way, answering none
            await srv.read_request(reader)
            return
        await asyncio.Event().wait()

    async with RawServer(handler) as srv:
        _, body = await get(pool, srv.url)
        up, body = await get(pool, srv.url)
        assert (up.status, body) == (200, b"hello")
        assert srv.connections == 2 and len(srv.requests) == 3


async def test_a_fresh_connection_that_dies_is_not_retried(pool: UpstreamPool) -> None:
    async def handler(
        srv: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        await srv.read_request(reader)  # and close without a word

    async with RawServer(handler) as srv:
        with pytest.raises(UpstreamError) as e:
            await get(pool, srv.url)
        assert e.value.kind == "disconnect" and srv.connections == 1


async def test_a_2_mb_body_is_streamed_in_pieces(pool: UpstreamPool) -> None:
    body = bytes(range(256)) * (2 * 1024 * 1024 // 256)

    async def handler(
        srv: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 64 * 1024):
            writer.write(body[i : i + 64 * 1024])
            await writer.drain()

    async with RawServer(handler) as srv:
        up = await pool.request(srv.url, "GET", "/big", [])
        try:
            assert up.content_length == len(body)
            pieces = []
            while (chunk := await up.next_chunk()) is not None:
                pieces.append(chunk)
        finally:
            up.release()
        assert b"".join(pieces) == body
        assert len(pieces) > 1


async def test_a_slow_reader_pauses_the_socket(pool: UpstreamPool) -> None:
    size = 64 * 1024 * 1024  # more than the kernel buffers between the two ends
    block = b"x" * (1024 * 1024)
    sent = 0

    async def handler(
        srv: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        nonlocal sent
        await srv.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // len(block)):
            writer.write(block)
            await writer.drain()
            sent += len(block)

    async with RawServer(handler) as srv:
        up = await pool.request(srv.url, "GET", "/big", [])
        try:
            await asyncio.sleep(0.5)  # not reading
            assert sent < size  # the server is held up by back-pressure
            received = 0
            while (chunk := await up.next_chunk()) is not None:
                assert len(chunk) <= HIGH_WATER + 256 * 1024
                received += len(chunk)
        finally:
            up.release()
        assert received == size == sent


@pytest.mark.parametrize(
    "cut",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_a_response_cut_mid_body_raises(pool: UpstreamPool, cut: bytes) -> None:
    async def handler(
        srv: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        await srv.read_request(reader)
        writer.write(cut)
        await writer.drain()

    async with RawServer(handler) as srv:
        up = await pool.request(srv.url, "GET", "/", [])
        try:
            with pytest.raises(UpstreamError) as e:
                await up.read()
        finally:
            up.release()
        assert e.value.kind == "disconnect"


async def test_silence_times_out_before_and_after_the_head() -> None:
    async def handler(
        srv: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        await srv.read_request(reader)
        if index == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await writer.drain()
        await asyncio.Event().wait()

    p = UpstreamPool(read_timeout_s=0.2)
    try:
        async with RawServer(handler) as srv:
            with pytest.raises(UpstreamError) as e:
                await p.request(srv.url, "GET", "/", [])
            assert e.value.kind == "timeout"
            up = await p.request(srv.url, "GET", "/", [])
            try:
                assert await up.next_chunk() == b"abc"
                with pytest.raises(UpstreamError) as e:
                    await up.next_chunk()
                assert e.value.kind == "timeout"
            finally:
                up.release()
    finally:
        p.close()


async def test_a_refused_connection(pool: UpstreamPool) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(UpstreamError) as e:
        await pool.request(f"http://127.0.0.1:{port}", "GET", "/", [])
    assert e.value.kind == "connect"


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
    ],
    ids=["status", "status-line", "two-lengths", "header"],
)
async def test_a_malformed_response_is_a_protocol_error(
    pool: UpstreamPool, response: bytes
) -> None:
    async with RawServer(serve_each(response)) as srv:
        with pytest.raises(UpstreamError) as e:
            await get(pool, srv.url)
        assert e.value.kind == "protocol"


async def test_bytes_after_the_response_spoil_it_and_its_connection(pool: UpstreamPool) -> None:
    async def handler(
        srv: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        while True:
            await srv.read_request(reader)
            writer.write(OK_HELLO + (b"HTTP/1.1 200 OK\r\n" if index == 0 else b""))
            await writer.drain()

    async with RawServer(handler) as srv:
        with pytest.raises(UpstreamError) as e:
            await get(pool, srv.url)
        assert e.value.kind == "protocol"
        for _ in range(2):
            _, body = await get(pool, srv.url)
            assert body == b"hello"
        assert srv.connections == 2


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/", [("X-A", "v\r\nX-Injected: 1")]),
        ("/", [("X-A", "v\nX-Injected: 1")]),
        ("/", [("X-A", "v\r")]),
        ("/", [("X-A\r\nX-Injected", "1")]),
        ("/", [("X-A: 1\r\n", "2")]),
        ("/ HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET /", []),
    ],
)
async def test_crlf_in_the_request_is_rejected(
    pool: UpstreamPool, target: str, headers: list[tuple[str, str]]
) -> None:
    async with RawServer(serve_each(OK_HELLO)) as srv:
        with pytest.raises(UpstreamError) as e:
            await pool.request(srv.url, "GET", target, headers)
        assert e.value.kind == "request"
        assert srv.connections == 0  # nothing was sent


def test_the_request_head_byte_for_byte_and_the_first_bad_field_named() -> None:
    from regions.gateway.upstream import Origin, _serialise

    origin = Origin.parse("http://[::1]:8000")
    headers = [("Content-Type", "application/json"), ("X-Session-Id", "s-1")]
    for _ in range(2):  # the second time, the method and names are known good
        got = _serialise(origin, "POST", "/v1/x?a=1", iter(headers), b"{}")
        assert got == (
            b"POST /v1/x?a=1 HTTP/1.1\r\nHost: [::1]:8000\r\nContent-Type: application/json"
            b"\r\nX-Session-Id: s-1\r\nContent-Length: 2\r\n\r\n{}"
        )
    assert _serialise(origin, "GET", "/", [], b"") == b"GET / HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n"
    # The first bad field in request order is named, whichever cheap check caught it.
    cases = [
        ("GE T", "/", [("X-A", "v\r")], "method 'GE T'"),
        ("GET", "", [], "target ''"),
        ("GET", "/", [("X-A", "v\n"), ("Bad Name", "1")], "value of header X-A 'v\\n'"),
        ("GET", "/", [("X-A", "v"), ("Bad:Name", "1\r")], "header name 'Bad:Name'"),
        ("GET", "/", [("X-A", "v"), ("X-B", "a\0b")], "value of header X-B 'a\\x00b'"),
    ]
    for method, target, hdrs, named in cases:
        with pytest.raises(UpstreamError) as e:
            _serialise(origin, method, target, hdrs, b"")
        assert e.value.kind == "request" and e.value.detail.startswith(named), e.value.detail
