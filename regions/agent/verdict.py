"""The agent's verdict on its region (pure: probes in, a :class:`RegionVerdict` out).

:func:`fold_verdict` folds one round of replica probes, and the round before it (for
counter deltas, see :mod:`controlplane.kernel.replica_signals`), into a health verdict
with the signals behind it and a one-line reason an operator can read. Its bounds are
the region's ``degraded_when`` in the topology, as the control plane sent them to the
agent (regions/agent/server.py). (The leader's
picture of a region in a tick is another thing: ``controlplane.kernel.snapshot.RegionView``.)
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.kernel.ladder import LOAD_SIGNAL
from controlplane.kernel.model import Frozen, Health
from controlplane.kernel.replica_signals import ReplicaWindow, fold_windows, replica_window
from regions.agent.probe_vllm import ReplicaProbe

MAX_DETAIL = 1024  # the control plane rejects longer details


class RegionVerdict(Frozen):
    """The agent's verdict on its region, with the signals behind it."""

    region: str
    health: Health
    signals: dict[str, float]
    detail: str
    probes: tuple[ReplicaProbe, ...] = ()


def replica_windows(
    probes: Sequence[ReplicaProbe], previous: Sequence[ReplicaProbe]
) -> list[ReplicaWindow]:
    """One window per up replica whose metrics were read; the previous round's probe of
    the same URL (if it read metrics) is the window's start."""
    before = {p.url: p.metrics for p in previous if p.up and p.metrics is not None}
    return [
        replica_window(before.get(p.url), p.metrics)
        for p in probes
        if p.up and p.metrics is not None
    ]


def fold_verdict(
    region: str,
    probes: Sequence[ReplicaProbe],
    max_queue: int | None = None,
    *,
    previous: Sequence[ReplicaProbe] = (),
    max_ttft_p99_s: float | None = None,
    max_error_rate: float | None = None,
) -> RegionVerdict:
    """HEALTHY when every replica is up and within every configured bound; DEGRADED when
    some are down, the region-wide queue exceeds ``max_queue``, the first-token p99
    exceeds ``max_ttft_p99_s`` or the 5xx share exceeds ``max_error_rate`` (both over
    the window since ``previous``); UNHEALTHY when none is up. A bound left ``None`` is
    not judged, nor is a figure the window cannot tell (no requests in it)."""
    up = [p for p in probes if p.up]
    queue = sum(p.waiting or 0.0 for p in up)
    running = sum(p.running or 0.0 for p in up)
    window = fold_windows(replica_windows(probes, previous))
    breaches = []
    if max_queue is not None and queue > max_queue:
        breaches.append(f"queue {queue:g} > {max_queue}")
    p99 = window.ttft_p99_s
    if max_ttft_p99_s is not None and p99 is not None and p99 > max_ttft_p99_s:
        breaches.append(f"ttft p99 {p99:.3g}s > {max_ttft_p99_s:g}s")
    errors = window.error_rate
    if max_error_rate is not None and errors is not None and errors > max_error_rate:
        breaches.append(f"error rate {errors:.1%} > {max_error_rate:.1%}")
    if not up:
        verdict = Health.UNHEALTHY
    elif len(up) < len(probes) or breaches:
        verdict = Health.DEGRADED
    else:
        verdict = Health.HEALTHY
    notes = [f"{len(up)}/{len(probes)} replicas up", *breaches]
    notes += [f"{p.url} down ({p.reason})" for p in probes if not p.up]
    signals = {
        "replicas_up": float(len(up)),
        "replicas_total": float(len(probes)),
        "queue_depth": queue,
        "running": running,
        **window.as_signals(),
    }
    if window.request_rate is not None:  # the served load failover headroom and CBU read
        signals[LOAD_SIGNAL] = window.request_rate
    detail = "; ".join(notes)[:MAX_DETAIL]
    return RegionVerdict(
        region=region, health=verdict, signals=signals, detail=detail, probes=tuple(probes)
    )
