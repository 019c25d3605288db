"""HTTP probing adapter for one vLLM replica (or the simulator, which speaks the same API).

``probe_replica`` asks ``GET /health`` and ``GET /metrics`` at once, each with its own
timeout, and returns a :class:`ReplicaProbe`: up or down (with a short human reason
such as ``connection refused``), the scheduler gauges ``vllm:num_requests_waiting`` /
``vllm:num_requests_running``, and the raw cumulative figures the window signals are
computed from (:class:`controlplane.kernel.vllm.signals.ReplicaMetrics`):

- ``vllm:time_to_first_token_seconds`` (``_bucket`` / ``_sum``), summed over label sets;
- ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (tokens);
- ``vllm:kv_cache_usage_perc`` (the fullest engine's);
- ``http_requests_total{handler,method,status}`` from the FastAPI instrumentator vLLM
  mounts: every API answer, ``status`` grouped as ``2xx``/``4xx``/``5xx``. vLLM leaves
  out its own probe endpoints (``/metrics``, ``/health``, ``/ping``, ``/version``...),
  so probing does not count as traffic. Its label sets appear on first use: a declared
  family without samples means 0 requests, a missing family means unknown.

Nothing here raises for a sick replica; cancellation always propagates.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from pydantic import BaseModel, ConfigDict

from controlplane.kernel.model import Frozen
from controlplane.kernel.vllm.metrics import RUNNING, WAITING, parse_metrics
from controlplane.kernel.vllm.signals import ReplicaMetrics
from regions.http_errors import describe_error


class ReplicaProbe(Frozen):
    """One probe of one replica."""

    url: str
    up: bool
    reason: str = ""  # why it is down, or why its metrics are missing
    waiting: float | None = None
    running: float | None = None
    metrics: ReplicaMetrics | None = None  # cumulative figures, when /metrics was read


class _Fetched(BaseModel):
    model_config = ConfigDict(frozen=True)

    status: int | None = None
    body: str = ""
    error: str = ""


async def _fetch(
    session: aiohttp.ClientSession, url: str, request_timeout: float, *, read_body: bool
) -> _Fetched:
    try:
        limit = aiohttp.ClientTimeout(total=request_timeout)
        async with session.get(url, timeout=limit) as resp:
            body = await resp.text() if read_body and resp.status == 200 else ""
            return _Fetched(status=resp.status, body=body)
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        return _Fetched(error=describe_error(e, request_timeout))


async def probe_replica(
    session: aiohttp.ClientSession, base_url: str, request_timeout: float
) -> ReplicaProbe:
    """Probe one replica: up iff ``/health`` answers 200 within ``request_timeout``."""
    base = base_url.rstrip("/")
    health, metrics = await asyncio.gather(
        _fetch(session, base + "/health", request_timeout, read_body=False),
        _fetch(session, base + "/metrics", request_timeout, read_body=True),
    )
    at = time.monotonic()  # when the counters were read; windows are measured with it
    if health.status != 200:
        reason = health.error or f"HTTP {health.status} from /health"
        return ReplicaProbe(url=base_url, up=False, reason=reason)
    if metrics.status != 200:
        reason = metrics.error or f"HTTP {metrics.status}"
        return ReplicaProbe(url=base_url, up=True, reason=f"metrics unavailable ({reason})")
    try:
        gauges, figures = parse_metrics(metrics.body, at)
    except ValueError as e:
        return ReplicaProbe(url=base_url, up=True, reason=f"metrics unparseable ({e})"[:200])
    return ReplicaProbe(
        url=base_url,
        up=True,
        waiting=gauges.get(WAITING),
        running=gauges.get(RUNNING),
        metrics=figures,
    )
