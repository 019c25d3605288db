"""A raw HTTP/1.1 client for the HTTP fuzzing (tests/fuzz/test_fuzz_http.py), and what
its answers must be.

Requests are written byte for byte on a socket (``request_bytes``, ``exchange``), so
that a fuzzed request reaches the server as generated, whatever a client library would
refuse or fix. ``clean``: OK, or a clean refusal (a 4xx with a JSON error that says what
is wrong, or an upstream 502/503/504); ``still_serving``: a good request right after is
answered 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from tests.fuzz.http_strategies import GOOD_COMPLETION, _dumps

UPSTREAM_5XX = frozenset({502, 503, 504})


# ---- a raw HTTP/1.1 client ------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


class NoAnswer(AssertionError):
    """The server closed the connection (or stayed silent) without an answer."""


def request_bytes(
    method: str,
    target: str,
    headers: Sequence[tuple[str, bytes]] = (),
    body: bytes | None = None,
) -> bytes:
    """An HTTP/1.1 request, ``Connection: close``, with a Content-Length for ``body``."""
    lines = [f"{method} {target} HTTP/1.1".encode("latin-1"), b"Host: fuzz"]
    lines += [name.encode("latin-1") + b": " + value for name, value in headers]
    if body is not None:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


async def exchange(port: int, raw: bytes, *, within: float = 30.0) -> Answer:
    """Send ``raw`` and read the whole answer (Content-Length, chunked or until close;
    an event stream only up to its head). Raises NoAnswer when the server drops the
    connection first, or answers nothing ``within`` seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:
        # The server may answer (413) and close before reading everything.
        with contextlib.suppress(ConnectionError):
            writer.write(raw)
            await writer.drain()

    sender = asyncio.ensure_future(send())
    try:
        async with asyncio.timeout(within):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                raise NoAnswer(f"connection closed without an answer: {e!r}") from e
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            parts = status_line.split(" ", 2)
            assert parts[0].startswith("HTTP/1."), status_line
            headers: dict[str, str] = {}
            for line in header_lines:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            status = int(parts[1])
            if raw.startswith(b"HEAD ") or status in (204, 304) or 100 <= status < 200:
                return Answer(status, headers, b"")
            if headers.get("content-type", "").startswith("text/event-stream"):
                return Answer(status, headers, b"")  # a live stream: its head is enough
            return Answer(status, headers, await _body(reader, headers))
    except TimeoutError as e:
        raise NoAnswer(f"no complete answer within {within}s") from e
    finally:
        sender.cancel()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            out = bytearray()
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.read()  # trailers, then close
                    return bytes(out)
                out += await reader.readexactly(size)
                await reader.readexactly(2)
        if "content-length" in headers:
            return await reader.readexactly(int(headers["content-length"]))
        return await reader.read()
    except (asyncio.IncompleteReadError, ConnectionError) as e:
        raise NoAnswer(f"connection dropped mid-answer: {e!r}") from e


# ---- properties -----------------------------------------------------------------------------


def _error_message(answer: Answer) -> str:
    """The message of a JSON error body (vLLM's shape or FastAPI's ``detail``)."""
    assert answer.headers.get("content-type", "").startswith("application/json"), (
        f"{answer.status} without a JSON body: {answer.headers} {answer.body[:200]!r}"
    )
    doc = answer.json()
    assert isinstance(doc, dict), doc
    if "error" in doc:
        error = doc["error"]
        assert isinstance(error, dict) and isinstance(error.get("message"), str), doc
        return str(error["message"])
    detail = doc.get("detail")
    assert isinstance(detail, str), doc
    return detail


def clean(answer: Answer, what: str) -> None:
    """OK, or a clean refusal: a 4xx with a JSON message, or an upstream 502/503/504."""
    assert answer.status < 500 or answer.status in UPSTREAM_5XX, (
        f"{what}: {answer.status} {answer.body[:300]!r}"
    )
    if answer.status >= 400:
        message = _error_message(answer)
        assert len(message.strip()) >= 5, f"{what}: {answer.status} with message {message!r}"


async def still_serving(port: int, path: str = "/v1/completions") -> None:
    answer = await exchange(
        port,
        request_bytes(
            "POST", path, [("Content-Type", b"application/json")], _dumps(GOOD_COMPLETION)
        ),
    )
    assert answer.status == 200, (answer.status, answer.body[:300])
