"""A lean HTTP/1.1 client for the gateway's hop to vLLM: keep-alive pool, one write
per request, response body handed over as it arrives. Responses are parsed by
``httptools`` (llhttp) in ``http1.py``; only the request is written here.

Why not aiohttp's client here: measured against the simulator, aiohttp's client
spends ~260 us of CPU per small request, this one ~60 us; on the gateway that is
most of its per-request cost (its server side stays aiohttp). The scope is what the
upstream is known to speak — vLLM's uvicorn (or the simulator's aiohttp): bodies
framed by Content-Length, chunked transfer coding, or the connection's end; 1xx
heads are skipped; no Expect: 100-continue sent, no upgrades, no pipelining (one
request per connection at a time).

* A pool of idle connections per replica, newest first; a connection idle longer
  than ``idle_s`` is closed rather than reused (uvicorn drops idle ones after 5 s).
  A *reused* connection that dies before any response byte is retried once on a new
  one: the server closed it while idle, so the request was never processed.
* A response's body is queued as it arrives; reading pauses the socket when more
  than ``http1.HIGH_WATER`` bytes wait, so a slow client slows the replica, not memory.
* Errors are ``UpstreamError`` with a kind (connect / disconnect / timeout /
  protocol, or request for a request that would inject CR/LF); the proxy decides
  whether a retry is still possible.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass

from yarl import URL

from regions.dataplane.failures import UpstreamFailure
from regions.gateway.http1 import Connection, UpstreamError

__all__ = ["Origin", "UpstreamError", "UpstreamPool", "UpstreamResponse"]


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def parse(cls, base_url: str) -> Origin:
        url = URL(base_url)
        if url.scheme not in ("http", "https") or not url.host or url.port is None:
            raise ValueError(f"not an http(s) base URL: {base_url!r}")
        return cls(url.scheme, url.host, url.port)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @functools.cached_property
    def host_line(self) -> str:
        """The request's Host field line, built once per origin."""
        return f"Host: {self.host_header}\r\n"


class UpstreamResponse:
    """A response whose head has arrived; read its body once, then ``release()``
    (also on errors: a half-read connection is closed, never reused)."""

    def __init__(self, pool: UpstreamPool, origin: Origin, conn: Connection) -> None:
        self._pool, self._origin, self._conn = pool, origin, conn
        self.status = conn.status
        self.headers = conn.headers
        self.content_length = conn.content_length
        self._released = False

    @property
    def content_type(self) -> str:
        for name, value in self.headers:
            if name.lower() == "content-type":
                return value.split(";", 1)[0].strip().lower()
        return ""

    async def next_chunk(self) -> bytes | None:
        """The body bytes that arrived since the last call (waiting for some), or None
        at the end of the body."""
        conn = self._conn
        while not conn.chunks:
            if conn.done:
                return None
            await conn.wait()
        return conn.take()

    async def read(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        conn = self._conn
        # A pooled connection keeps its silence timer: it ends itself when it fires
        # with the response done, or serves the next request (``Connection.start``).
        if conn.done and conn.keep_alive and conn.exc is None and conn.open:
            self._pool.put_back(self._origin, conn)
        else:
            conn.close()


class UpstreamPool:
    def __init__(
        self,
        *,
        connect_timeout_s: float = 1.0,
        read_timeout_s: float = 300.0,
        idle_s: float = 4.0,
        max_idle: int = 256,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.idle_s = idle_s
        self.max_idle = max_idle
        self._idle: dict[Origin, list[Connection]] = {}
        self._origins: dict[str, Origin] = {}
        self._ssl: ssl.SSLContext | None = None

    def origin(self, base_url: str) -> Origin:
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = Origin.parse(base_url)
        return origin

    async def request(
        self,
        base_url: str,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes = b"",
    ) -> UpstreamResponse:
        """Send one request and wait for the response head. Raises UpstreamError (kind
        ``request`` for a method, target or header that would split the request)."""
        origin = self.origin(base_url)
        payload = _serialise(origin, method, target, headers, body)
        is_head = method == "HEAD"
        conn = await self._acquire(origin)
        try:
            try:
                return await self._exchange(origin, conn, payload, is_head)
            except UpstreamError as e:
                if not (
                    conn.reused and not conn.got_bytes and e.kind is UpstreamFailure.DISCONNECT
                ):
                    raise
            conn.close()  # a stale keep-alive connection: once more on a fresh one
            conn = await self._connect(origin)
            return await self._exchange(origin, conn, payload, is_head)
        except BaseException:
            conn.close()
            raise

    async def _exchange(
        self, origin: Origin, conn: Connection, payload: bytes, is_head: bool
    ) -> UpstreamResponse:
        conn.start(payload, head_method=is_head, silence_s=self.read_timeout_s)
        while conn.status == 0:
            await conn.wait()
        return UpstreamResponse(self, origin, conn)

    async def _acquire(self, origin: Origin) -> Connection:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.open and now - conn.idle_since < self.idle_s:
                conn.reused = True
                return conn
            conn.close()
        return await self._connect(origin)

    async def _connect(self, origin: Origin) -> Connection:
        loop = asyncio.get_running_loop()
        ctx = self._ssl_context() if origin.scheme == "https" else None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: Connection(loop),
                    origin.host,
                    origin.port,
                    ssl=ctx,
                    server_hostname=origin.host if ctx else None,
                )
        except TimeoutError:
            raise UpstreamError(
                UpstreamFailure.CONNECT, f"timeout after {self.connect_timeout_s:g} s"
            ) from None
        except OSError as e:
            raise UpstreamError(UpstreamFailure.CONNECT, e.strerror or str(e)) from e
        return conn

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def put_back(self, origin: Origin, conn: Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if len(idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                with contextlib.suppress(Exception):
                    conn.close()
        self._idle.clear()


def _serialise(
    origin: Origin, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
) -> bytes:
    """The request in one piece. Every field is checked, so that no caller can split it
    with CR/LF (aiohttp's server already refuses them in what it accepted; this guards
    anything else that builds requests).

    The checks are cheap on the hot path and exact: a method and a header name once
    seen valid are remembered (bounded sets: few distinct ones), and the values are
    checked all at once on the assembled header lines, whose CR and LF counts must be
    those of their own line ends and which must hold no NUL. Only when that fails are
    the fields checked one by one, for the error naming the first bad one."""
    if not isinstance(headers, list | tuple):
        headers = list(headers)  # iterated twice when one is bad
    if method not in _GOOD_METHODS or _BAD_TARGET.search(target) is not None:
        _validate(method, target, headers)
        _remember(_GOOD_METHODS, method)
    lines = []
    for name, value in headers:
        if name not in _GOOD_NAMES:
            if _BAD_TOKEN.search(name) is not None:
                _validate(method, target, headers)
            _remember(_GOOD_NAMES, name)
        lines.append(f"{name}: {value}\r\n")
    fields = "".join(lines)
    n = len(lines)
    if fields.count("\r") != n or fields.count("\n") != n or "\0" in fields:
        _validate(method, target, headers)
    end = f"Content-Length: {len(body)}\r\n\r\n" if body or method != "GET" else "\r\n"
    head = f"{method} {target} HTTP/1.1\r\n{origin.host_line}{fields}{end}"
    return head.encode("utf-8", "surrogateescape") + body


def _validate(method: str, target: str, headers: Iterable[tuple[str, str]]) -> None:
    """Every field, one by one, in order: raises for the first that would split the
    request (the slow path, for a request that failed a cheap check)."""
    _check("method", method, _BAD_TOKEN)
    _check("target", target, _BAD_TARGET)
    for name, value in headers:
        _check("header name", name, _BAD_TOKEN)
        _check(f"value of header {name}", value, _BAD_VALUE)


_BAD_VALUE = re.compile("[\r\n\0]")
_BAD_TARGET = re.compile("[\r\n\0 \t]|^$")
_BAD_TOKEN = re.compile("[\r\n\0 \t:]|^$")
# Methods and header names already found valid (checked once, then a set lookup); a
# set that fills up is emptied: the checks are then simply done again.
_GOOD_METHODS: set[str] = set()
_GOOD_NAMES: set[str] = set()
_GOOD_MAX = 1024
_GOOD_CHARS = 256  # longer ones are checked every time, never kept


def _remember(good: set[str], token: str) -> None:
    if len(token) > _GOOD_CHARS:
        return
    if len(good) >= _GOOD_MAX:
        good.clear()
    good.add(token)


def _check(what: str, text: str, bad: re.Pattern[str]) -> None:
    if bad.search(text) is not None:
        raise UpstreamError(
            UpstreamFailure.REQUEST, f"{what} {text[:80]!r} would split the request"
        )
