"""What one scrape of a replica's ``/metrics`` says, and the prefix-cache hit rate
read from two of them: pure (the scraping is :mod:`chaos.capacity.replica_watch`), so
the hit rate is measured from the replica's own counters, never assumed."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from chaos.capacity.verdicts import AbortCause, Phase, ProbeAborted
from controlplane.kernel.vllm.signals import ReplicaMetrics

_CACHE_INFO = re.compile(r'^vllm:cache_config_info\{[^}]*enable_prefix_caching="(\w+)"', re.M)


def prefix_caching(metrics_text: str) -> bool | None:
    """Whether the server caches prefixes, from vLLM's ``cache_config_info``; None
    when it does not say."""
    found = _CACHE_INFO.search(metrics_text)
    return None if found is None else found.group(1).lower() == "true"


@dataclass(frozen=True, slots=True)
class Scrape:
    """One read of a replica's ``/metrics``: its gauges (running, waiting: is it idle?),
    its counters, and whether its cache config says it caches prefixes."""

    gauges: dict[str, float]
    metrics: ReplicaMetrics
    prefix_caching: bool | None


def hit_rate(before: Sequence[Scrape], after: Sequence[Scrape], phase: Phase) -> float:
    """Prefix-cache hits over queries (tokens) between two scrapes of each replica. A
    server that caches nothing counts no queries: its hit rate is 0 when its cache
    config says caching is off, and unknown (an abort) otherwise."""
    queries = hits = 0.0
    for b, a in zip(before, after, strict=True):
        queries += (a.metrics.prefix_queries or 0.0) - (b.metrics.prefix_queries or 0.0)
        hits += (a.metrics.prefix_hits or 0.0) - (b.metrics.prefix_hits or 0.0)
    if queries > 0:
        return min(1.0, max(0.0, hits / queries))
    if all(a.prefix_caching is False for a in after):
        return 0.0
    raise ProbeAborted(AbortCause.UNREADABLE, phase, "the prefix-cache query counter did not move")
