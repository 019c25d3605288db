"""HTTP probing adapter for one vLLM replica (or the simulator, which speaks the same API).

``probe_replica`` asks ``GET /health`` and ``GET /metrics`` at once, each with its own
timeout, and returns a :class:`ReplicaProbe`: up or down (with a short human reason
such as ``connection refused``), the scheduler gauges ``vllm:num_requests_waiting`` /
``vllm:num_requests_running``, and the raw cumulative figures the window signals are
computed from (:class:`regions.replica_signals.ReplicaMetrics`):

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
import errno
import math
import time
from collections import defaultdict
from collections.abc import Iterable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from pydantic import BaseModel, ConfigDict

from regions.replica_signals import Histogram, ReplicaMetrics

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_CREATED = "vllm:prefix_cache_queries_created"  # the counters' start: a restart moves it
TTFT = "vllm:time_to_first_token_seconds"
HTTP_REQUESTS = "http_requests_total"
_READ = frozenset({WAITING, RUNNING, KV_USAGE, PREFIX_QUERIES, PREFIX_HITS, PREFIX_CREATED,
                   TTFT, f"{TTFT}_bucket", f"{TTFT}_sum", HTTP_REQUESTS})


class ReplicaProbe(BaseModel):
    """One probe of one replica."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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


def _wanted_lines(text: str, names: frozenset[str]) -> str:
    """Only the samples and ``# TYPE`` lines of ``names``: real vLLM writes ~600 lines
    and the parser is pure Python (~20 ms for all of them on a small machine)."""
    keep = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name = line[7:].split(" ", 1)[0]
        elif line.startswith("#") or not line:
            continue
        else:
            name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            keep.append(line)
    return "\n".join(keep) + "\n"


def _parse(text: str, names: frozenset[str]) -> tuple[set[str], list[Sample]]:
    """The declared family names and the samples of ``names``. Raises ValueError on
    text that is not the Prometheus text format."""
    declared: set[str] = set()
    out: list[Sample] = []
    for family in text_string_to_metric_families(_wanted_lines(text, names)):
        declared.add(family.name)
        out += family.samples
    return declared, out


def parse_gauges(text: str, names: frozenset[str]) -> dict[str, float]:
    """Sum the samples of each wanted metric across label sets (engines, models).
    Unparseable text gives no values."""
    try:
        _, found = _parse(text, names)
    except ValueError:
        return {}
    out: dict[str, float] = {}
    for s in found:
        out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _histogram(buckets: dict[float, float], total: float | None) -> Histogram | None:
    if math.inf not in buckets:
        return None
    bounds = tuple(sorted(buckets))
    return Histogram(bounds=bounds, counts=tuple(buckets[b] for b in bounds),
                     total=total or 0.0)


def _sum(samples: Iterable[Sample]) -> float | None:
    values = [s.value for s in samples]
    return sum(values) if values else None


def parse_metrics(text: str, at: float) -> tuple[dict[str, float], ReplicaMetrics]:
    """The gauges ``waiting``/``running`` and the cumulative figures of one scrape;
    ``at`` is the caller's monotonic clock. Raises ValueError on unparseable text."""
    declared, found = _parse(text, _READ)
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for s in found:
        if not math.isnan(s.value):
            by_name[s.name].append(s)
    buckets: dict[float, float] = defaultdict(float)
    for s in by_name[f"{TTFT}_bucket"]:
        le = float(s.labels.get("le", "nan"))  # ValueError for a malformed bound
        if not math.isnan(le):
            buckets[le] += s.value  # summed over engines and models
    requests = by_name[HTTP_REQUESTS]
    http_known = bool(requests) or "http_requests" in declared
    gauges = {k: v for k in (WAITING, RUNNING) if (v := _sum(by_name[k])) is not None}
    kv = [s.value for s in by_name[KV_USAGE]]
    created = [s.value for s in by_name[PREFIX_CREATED]]
    metrics = ReplicaMetrics(
        at=at,
        since=min(created) if created else None,
        ttft=_histogram(buckets, _sum(by_name[f"{TTFT}_sum"])),
        prefix_queries=_sum(by_name[PREFIX_QUERIES]),
        prefix_hits=_sum(by_name[PREFIX_HITS]),
        requests=sum(s.value for s in requests) if http_known else None,
        # "5xx" when grouped (vLLM's setting); "503" etc. if a server does not group
        server_errors=(sum(s.value for s in requests if s.labels.get("status", "")[:1] == "5")
                       if http_known else None),
        kv_usage=max(kv) if kv else None,
    )
    return gauges, metrics


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
    return ReplicaProbe(url=base_url, up=True, waiting=gauges.get(WAITING),
                        running=gauges.get(RUNNING), metrics=figures)
