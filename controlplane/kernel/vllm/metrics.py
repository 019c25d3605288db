"""Reading a vLLM server's ``/metrics`` (the simulator writes the same families): the
scheduler gauges and the cumulative figures window signals are computed from. The
region agent probes its replicas with it and the drills observe them with it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from controlplane.kernel.vllm.signals import Histogram, ReplicaMetrics

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_CREATED = "vllm:prefix_cache_queries_created"  # the counters' start: a restart moves it
TTFT = "vllm:time_to_first_token_seconds"
HTTP_REQUESTS = "http_requests_total"
_READ = frozenset(
    {
        WAITING,
        RUNNING,
        KV_USAGE,
        PREFIX_QUERIES,
        PREFIX_HITS,
        PREFIX_CREATED,
        TTFT,
        f"{TTFT}_bucket",
        f"{TTFT}_sum",
        HTTP_REQUESTS,
    }
)


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
    return Histogram(bounds=bounds, counts=tuple(buckets[b] for b in bounds), total=total or 0.0)


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
        server_errors=(
            sum(s.value for s in requests if s.labels.get("status", "")[:1] == "5")
            if http_known
            else None
        ),
        kv_usage=max(kv) if kv else None,
    )
    return gauges, metrics
