"""The lab's latency proxy (chaos/lab/latency_proxy.py): a round trip through it takes
at least twice the injected one-way delay (a lower bound only, which a loaded machine
cannot break: no timing goal), a large payload arrives intact and in order, and its forms (in a
thread, as a process) forward too."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from chaos.lab.latency_proxy import LatencyProxy, ProxyThread, Route, parse_route

REPO = Path(__file__).resolve().parent.parent


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _echo_server() -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _round_trip(port: int, payload: bytes) -> tuple[float, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.perf_counter()
    writer.write(payload)
    await writer.drain()
    got = await reader.readexactly(len(payload))
    elapsed = time.perf_counter() - t0
    writer.close()
    return elapsed, got


@pytest.fixture
async def echo() -> AsyncIterator[str]:
    server, target = await _echo_server()
    async with server:
        yield target


async def test_a_round_trip_pays_both_directions(echo: str) -> None:
    delay = 0.05
    async with LatencyProxy(echo, delay) as proxy:
        elapsed, got = await _round_trip(proxy.port, b"ping")
    assert got == b"ping"
    assert elapsed >= 2 * delay


async def test_a_large_payload_arrives_intact_and_in_order(echo: str) -> None:
    payload = os.urandom(4 << 20)  # many chunks in flight at once
    delay = 0.02
    async with LatencyProxy(echo, delay) as proxy:
        elapsed, got = await _round_trip(proxy.port, payload)
    assert got == payload
    assert elapsed >= 2 * delay


async def test_chunks_sent_in_a_row_come_back_in_order_each_delayed(echo: str) -> None:
    """Ten pings 10 ms apart through a 100 ms delay all come back, in order, the first
    no sooner than its round trip. That each waits its own due time, not the delays of
    those before it, is the figure ``bench etcd_rtt`` shows (a commit of ~2 RTT at every
    RTT), not a timing asserted here."""
    delay = 0.1
    async with LatencyProxy(echo, delay) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        t0 = time.perf_counter()
        for i in range(10):
            writer.write(bytes([i]))
            await writer.drain()
            await asyncio.sleep(0.01)
        first = await reader.readexactly(1)
        elapsed = time.perf_counter() - t0
        got = first + await reader.readexactly(9)
        writer.close()
    assert got == bytes(range(10))
    assert elapsed >= 2 * delay  # held back: a lower bound, which load cannot break


def test_a_thread_of_its_own_forwards() -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        target = f"127.0.0.1:{srv.getsockname()[1]}"
        with (
            ProxyThread([Route(0, target, 0.01)]) as proxies,
            socket.create_connection(("127.0.0.1", proxies.ports[0]), timeout=5) as c,
        ):
            conn, _ = srv.accept()
            with conn:
                c.sendall(b"hello")
                conn.settimeout(5)
                assert conn.recv(5) == b"hello"


def test_a_process_forwards_and_says_ready() -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        target = f"127.0.0.1:{srv.getsockname()[1]}"
        args = [sys.executable, "-m", "chaos.lab.latency_proxy", "--route", f"0={target}@5"]
        with subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            words = proc.stdout.readline().split()
            assert words[0] == "ready"
            with socket.create_connection(("127.0.0.1", int(words[1])), timeout=5) as c:
                conn, _ = srv.accept()
                with conn:
                    c.sendall(b"x")
                    conn.settimeout(5)
                    assert conn.recv(1) == b"x"
            proc.terminate()
            assert proc.wait(10) == 0


def test_bad_routes_are_refused() -> None:
    for text in ("1=127.0.0.1:2@-5", "1=nowhere@5", "x=127.0.0.1:2@5", "127.0.0.1:2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_route(text)
    with pytest.raises(ValueError, match="negative"):
        Route(0, "127.0.0.1:1", -0.1)
