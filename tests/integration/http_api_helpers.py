"""Helpers for the HTTP API tests (test_http_api*.py): a real HTTP client on a replica's
port, the event stream parsed message by message, /metrics read as samples, and one
headless Chromium page driven over the DevTools protocol for the dashboard."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from controlplane.server import ControlPlaneReplica

Message = dict[str, str]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@contextlib.asynccontextmanager
async def http_client(replica: ControlPlaneReplica) -> AsyncIterator[aiohttp.ClientSession]:
    assert replica.http_port, "the replica serves no HTTP"
    async with aiohttp.ClientSession(f"http://127.0.0.1:{replica.http_port}") as session:
        yield session


async def get_json(http: aiohttp.ClientSession, path: str, **kw: Any) -> tuple[int, Any]:
    async with http.get(path, **kw) as resp:
        return resp.status, await resp.json()


async def sse_messages(resp: aiohttp.ClientResponse) -> AsyncGenerator[Message, None]:
    """Parse a text/event-stream: one dict per message (``comment`` for comments)."""
    msg: Message = {}
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if msg:
                yield msg
            msg = {}
        elif line.startswith(":"):
            msg["comment"] = line[1:].strip()
        else:
            name, _, value = line.partition(":")
            msg[name] = value.removeprefix(" ")


async def data_messages(resp: aiohttp.ClientResponse, n: int) -> list[Message]:
    out: list[Message] = []
    async for m in sse_messages(resp):
        if "data" in m:
            out.append(m)
            if len(out) == n:
                break
    return out


async def metric_samples(http: aiohttp.ClientSession) -> Samples:
    async with http.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


# ---- the dashboard in a real browser (headless Chromium over the DevTools protocol) ----
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium page, driven over the DevTools protocol (no extra deps)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self._ids = ws, itertools.count(1)

    async def call(self, method: str, **params: Any) -> Any:
        msg_id = next(self._ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        async for msg in self.ws:
            data = json.loads(msg.data)
            if data.get("id") == msg_id:
                if "error" in data:
                    raise AssertionError(f"{method}: {data['error']}")
                return data["result"]
        raise AssertionError("the browser went away")

    async def js(self, expression: str) -> Any:
        res = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res["result"].get("value")


@contextlib.asynccontextmanager
async def chromium_page(url: str, profile: str) -> AsyncIterator[Browser]:
    assert CHROMIUM
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--window-size=1400,900",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        url,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        async with asyncio.timeout(30):
            while b"DevTools listening on" not in (line := await proc.stderr.readline()):
                assert line, "chromium exited before it listened"
        port = line.decode().split("ws://", 1)[1].split("/", 1)[0]
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://{port}/json/list") as resp:
                page = next(t for t in await resp.json() if t["type"] == "page")
            async with s.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield Browser(ws)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
