"""A TCP proxy that adds a one-way delay to each direction: a long link in a lab on
loopback (``bench etcd_rtt``: etcd's peer and client links across regions).

Each chunk read on one side is delivered to the other side ``delay_s`` after it was
read, in order: a writer per direction waits for each chunk's own due time
(arrival + delay), so a stream of chunks is shifted by the delay once, not delayed
chunk after chunk (sleeping per chunk before forwarding the next would add the delay
up for every chunk in flight). A round trip through it costs at least 2 x delay_s.
What is not delayed: the TCP handshake (the upstream connection is opened when a
client connects) and the end of a connection is delivered in order, after its data.

Three ways to run it:

* in an event loop: ``async with LatencyProxy(target, delay_s) as proxy: proxy.port``;
* in a thread of its own: ``with ProxyThread([Route(...), ...]): ...``;
* as a process: ``python -m chaos.lab.latency_proxy --route LISTEN=HOST:PORT@MS ...``
  prints ``ready`` once every route listens, and runs until SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

LOCALHOST = "127.0.0.1"
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Route:
    """Listen on ``listen_port`` (0: any free port), forward to ``target`` (host:port),
    delaying each direction by ``delay_s``."""

    listen_port: int
    target: str
    delay_s: float

    def __post_init__(self) -> None:
        if self.delay_s < 0:
            raise ValueError(f"a delay cannot be negative, got {self.delay_s}")
        host, _, port = self.target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"target must be host:port, got {self.target!r}")


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Forward ``reader`` to ``writer``, each chunk due ``delay_s`` after it was read."""
    loop = asyncio.get_running_loop()
    due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            at, data = await due.get()
            wait = at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:  # the end, after everything read before it
                with contextlib.suppress(OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(CHUNK)
            due.put_nowait((loop.time() + delay_s, data))
            if not data:
                break
        await sender
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await sender


class LatencyProxy:
    """One listening port forwarding to ``target`` with ``delay_s`` each way."""

    def __init__(self, target: str, delay_s: float, *, listen_port: int = 0) -> None:
        self.route = Route(listen_port, target, delay_s)
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.port = listen_port

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._serve, LOCALHOST, self.route.listen_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for t in list(self._conns):
                t.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        host, _, port = self.route.target.rpartition(":")
        try:
            try:
                u_reader, u_writer = await asyncio.open_connection(host, int(port))
            except OSError:
                return  # nothing listens there (yet): the client sees the connection close
            try:
                d = self.route.delay_s
                await asyncio.gather(_pump(c_reader, u_writer, d), _pump(u_reader, c_writer, d))
            except OSError:
                pass  # one side reset: close both
            except asyncio.CancelledError:
                # stop() ends open connections; the streams' callback would log a
                # cancelled serving task as an error
                pass
            finally:
                u_writer.close()
        finally:
            c_writer.close()
            self._conns.discard(task)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


class ProxyThread:
    """Routes served by an event loop in a thread of their own (so that a caller's
    blocking code, e.g. starting etcd, does not stall the links)."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = tuple(routes)
        self.ports: list[int] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="latency-proxy", daemon=True)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        proxies = [
            LatencyProxy(r.target, r.delay_s, listen_port=r.listen_port) for r in self.routes
        ]
        try:
            for p in proxies:
                await p.start()
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        finally:
            self.ports = [p.port for p in proxies]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            for p in proxies:
                await p.stop()

    def start(self) -> Self:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def parse_route(text: str) -> Route:
    """``LISTEN=HOST:PORT@MS``: listen on LISTEN, forward to HOST:PORT, MS one way."""
    try:
        listen, rest = text.split("=", 1)
        target, ms = rest.rsplit("@", 1)
        return Route(int(listen), target, float(ms) / 1000)
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"expected LISTEN=HOST:PORT@ONE_WAY_MS with a delay >= 0, got {text!r} ({e})"
        ) from None


async def _serve_forever(routes: Sequence[Route]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    proxies = [LatencyProxy(r.target, r.delay_s, listen_port=r.listen_port) for r in routes]
    try:
        for p in proxies:
            await p.start()
        print("ready " + " ".join(str(p.port) for p in proxies), flush=True)
        await stop.wait()
    finally:
        for p in proxies:
            await p.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m chaos.lab.latency_proxy",
        description="TCP proxies that delay each direction by a fixed time (RTT = 2 x it).",
    )
    p.add_argument(
        "--route",
        type=parse_route,
        action="append",
        required=True,
        metavar="LISTEN=HOST:PORT@MS",
        help="listen port (0: any), where to forward, one-way delay in ms; repeatable",
    )
    args = p.parse_args(argv)
    asyncio.run(_serve_forever(args.route))
    return 0


if __name__ == "__main__":
    sys.exit(main())
