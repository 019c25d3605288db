"""HTTP probing adapter for one vLLM replica (or the simulator, which speaks the same API).

``probe_replica`` asks ``GET /health`` and ``GET /metrics`` at once, each with its own
timeout, and returns a :class:`ReplicaProbe`: up or down (with a short human reason
such as ``connection refused``), plus the scheduler gauges
``vllm:num_requests_waiting`` / ``vllm:num_requests_running`` when they could be read.
Nothing here raises for a sick replica; cancellation always propagates.
"""

from __future__ import annotations

import asyncio
import errno
import re

import aiohttp
from pydantic import BaseModel, ConfigDict

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


class ReplicaProbe(BaseModel):
    """One probe of one replica."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    up: bool
    reason: str = ""  # why it is down, or why its metrics are missing
    waiting: float | None = None
    running: float | None = None


class _Fetched(BaseModel):
    model_config = ConfigDict(frozen=True)

    status: int | None = None
    body: str = ""
    error: str = ""


def parse_gauges(text: str, names: frozenset[str]) -> dict[str, float]:
    """Sum the samples of each wanted metric across label sets (engines, models)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None or m.group("name") not in names:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        out[m.group("name")] = out.get(m.group("name"), 0.0) + value
    return out


def describe_error(exc: BaseException, timeout: float) -> str:
    """A short reason for an operator: ``connection refused``, ``timeout after 0.5s``..."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        if exc.os_error.errno == errno.ECONNREFUSED:
            return "connection refused"
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, TimeoutError):
        return f"timeout after {timeout:g}s"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    return f"{type(exc).__name__}: {exc}".strip()


async def _fetch(session: aiohttp.ClientSession, url: str, request_timeout: float,
                 *, read_body: bool) -> _Fetched:
    try:
        limit = aiohttp.ClientTimeout(total=request_timeout)
        async with session.get(url, timeout=limit) as resp:
            body = await resp.text() if read_body and resp.status == 200 else ""
            return _Fetched(status=resp.status, body=body)
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        return _Fetched(error=describe_error(e, request_timeout))


async def probe_replica(session: aiohttp.ClientSession, base_url: str,
                        request_timeout: float) -> ReplicaProbe:
    """Probe one replica: up iff ``/health`` answers 200 within ``request_timeout``."""
    base = base_url.rstrip("/")
    health, metrics = await asyncio.gather(
        _fetch(session, base + "/health", request_timeout, read_body=False),
        _fetch(session, base + "/metrics", request_timeout, read_body=True),
    )
    if health.status != 200:
        reason = health.error or f"HTTP {health.status} from /health"
        return ReplicaProbe(url=base_url, up=False, reason=reason)
    if metrics.status != 200:
        reason = metrics.error or f"HTTP {metrics.status}"
        return ReplicaProbe(url=base_url, up=True, reason=f"metrics unavailable ({reason})")
    gauges = parse_gauges(metrics.body, frozenset({WAITING, RUNNING}))
    return ReplicaProbe(url=base_url, up=True, waiting=gauges.get(WAITING),
                        running=gauges.get(RUNNING))
