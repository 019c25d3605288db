"""The agent's verdict on its region (pure: probes in, a :class:`RegionVerdict` out).

:func:`fold_verdict` folds one round of replica probes, and the round before it (for
counter deltas, see :mod:`controlplane.kernel.vllm.signals`), into a health verdict
with the signals behind it and a one-line reason an operator can read. Its bounds are
the region's ``degraded_when`` in the topology, as the control plane sent them to the
agent (regions/agent/server.py). (The leader's
picture of a region in a tick is another thing: ``controlplane.kernel.snapshot.RegionView``.)

**Served load.** ``load_rps`` (``ladder.LOAD_SIGNAL``, what the planner, CBU and the
degradation ladder read) is the inference requests the region's replicas started per
second (first tokens, :mod:`controlplane.kernel.vllm.signals`), smoothed over
``replica_signals.LOAD_WINDOW_S`` (30 s) by a :class:`LoadWindow` the verdict carries
to the next round (``load=``); ``load_rps_raw`` is this round's own window (one probe
interval) for the live view. What Tectonic itself sends is left out:

- the warm pool's and Kubernetes discovery's ``GET /is_sleeping``, ``/health``,
  ``/metrics``, ``/wake_up``, ``/reset_prefix_cache``: no first token, never counted;
- replicas out of rotation (WARM and IDLE pool members, LENT ones under a capacity
  probe's load): the agent probes only ACTIVE replicas (``server._replicas``), so their
  requests are in no window; a replica that comes back into rotation starts a window
  only at its second probe, so what it served before is not counted either;
- the agent's own pre-warm replays and their verification (regions/agent/
  prewarm_executor.py): they are inference requests on ACTIVE replicas, counted by
  vLLM like any other; the agent knows how many it had answered, and passes that
  cumulative count as ``sent``: its increase since the last round is subtracted;
- the gateways' warm-up replays (regions/gateway/warmth.py: recall and warm-first
  one-token replays when a region serves again): the agent cannot see them (they go
  from the gateway to the replicas, and vLLM cannot tell them from users' requests), so
  they **are** counted. They are bounded: ``concurrency`` at a time per gateway and
  region (1 by default), one-token prefills of prompts the region served, during the
  first minutes after a region serves again; and they are work the replicas do.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.kernel.ladder.model import LOAD_SIGNAL
from controlplane.kernel.model import Frozen, Health
from controlplane.kernel.vllm.signals import (
    LOAD_RAW_SIGNAL,
    LoadWindow,
    ReplicaWindow,
    fold_windows,
    replica_window,
)
from regions.agent.probe_vllm import ReplicaProbe

MAX_DETAIL = 1024  # the control plane rejects longer details


class RegionVerdict(Frozen):
    """The agent's verdict on its region, with the signals behind it."""

    region: str
    health: Health
    signals: dict[str, float]
    detail: str
    probes: tuple[ReplicaProbe, ...] = ()
    # The served load's window, for the next round's ``fold_verdict(load=...)``.
    load: LoadWindow = LoadWindow()
    # The cumulative count of the agent's own inference requests (``sent``) at this round.
    sent: float = 0.0


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
    before: RegionVerdict | None = None,
    sent: float = 0.0,
) -> RegionVerdict:
    """HEALTHY when every replica is up and within every configured bound; DEGRADED when
    some are down, the region-wide queue exceeds ``max_queue``, the first-token p99
    exceeds ``max_ttft_p99_s`` or the 5xx share exceeds ``max_error_rate`` (both over
    the window since ``previous``); UNHEALTHY when none is up. A bound left ``None`` is
    not judged, nor is a figure the window cannot tell (no requests in it).

    ``before``: the previous verdict, whose :class:`LoadWindow` the served load is
    smoothed in (None: a fresh window, the smoothed load is this round's alone).
    ``sent``: how many inference requests the agent itself has had answered by these
    replicas so far (pre-warm replays and their verification), cumulative; its increase
    since ``before.sent`` is not load."""
    up = [p for p in probes if p.up]
    queue = sum(p.waiting or 0.0 for p in up)
    running = sum(p.running or 0.0 for p in up)
    windows = replica_windows(probes, previous)
    window = fold_windows(windows)
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
    own = max(0.0, sent - before.sent) if before is not None else 0.0
    raw = served_round(windows, own)
    load = before.load if before is not None else LoadWindow()
    if raw is not None:
        load = load.add(*raw)
        signals[LOAD_RAW_SIGNAL] = raw[2] / raw[1]
    if load.rate is not None:  # the served load failover headroom and CBU read
        signals[LOAD_SIGNAL] = load.rate
    detail = "; ".join(notes)[:MAX_DETAIL]
    return RegionVerdict(
        region=region,
        health=verdict,
        signals=signals,
        detail=detail,
        probes=tuple(probes),
        load=load,
        sent=sent,
    )


def served_round(
    windows: Sequence[ReplicaWindow], own: float = 0.0
) -> tuple[float, float, float] | None:
    """This round's served load as ``(at, seconds, requests)``: the replicas' first-token
    rates summed, over their mean window, less ``own`` requests the agent sent itself
    (never below 0). None when no replica's window can tell (a first probe, no
    first-token histogram)."""
    known = [w for w in windows if w.served_rate is not None and w.seconds and w.at is not None]
    if not known:
        return None
    seconds = sum(w.seconds or 0.0 for w in known) / len(known)
    rate = sum(w.served_rate or 0.0 for w in known)
    at = max(w.at or 0.0 for w in known)
    return at, seconds, max(0.0, rate * seconds - own)
