"""The region agent's Prometheus metrics, and the small HTTP server that exposes them
(``tectonic-agent --metrics-listen HOST:PORT``; off by default, like the control
plane's ``--http-listen``).

On a registry of its own (never the process-wide default, so that agents sharing a
test process do not share series). Every series carries ``region``: an agent serves
one region, and Prometheus adds only ``instance`` / ``job``. Label sets known in
advance (verdicts, pool states, activation kinds, pre-warm outcomes, the static
replicas) are created at 0 when the agent starts, so that ``increase()`` sees the
first event and panels show 0 rather than "No data".

What feeds it: the agent's probe loop (:meth:`AgentMetrics.probed`, ``viewed``,
``reported``), the warm pool's activations (:meth:`activated`, a
``regions.pool.manager.WarmPool`` hook), the pool's snapshot read at each scrape
(:meth:`pool_snapshot`) and the pre-warm service (:meth:`prewarm_started` /
``prewarm_done``, a ``regions.agent.service.RegionAgentService`` hook).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from controlplane.kernel.metric_labels import exposition
from controlplane.kernel.model import Health
from controlplane.kernel.version import build_info
from regions.agent.prewarm_executor import PrewarmOutcome
from regions.agent.probe_vllm import ReplicaProbe
from regions.pool.hooks import ActivationKind
from regions.pool.snapshot import PoolSnapshot
from regions.pool.states import ReplicaState

log = logging.getLogger("tectonic.agent.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
PrewarmResult = Literal["complete", "partial", "failed"]
# A wake is /wake_up + /reset_prefix_cache: milliseconds on the simulator, seconds on a
# GPU (weights back into memory), longer while running requests hold blocks.
ACTIVATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# A pre-warm runs within its budget (30 s by default, at most the service's 600 s).
PREWARM_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0)
_ACTIVATIONS: tuple[tuple[ActivationKind, bool], ...] = (
    ("wake", True),
    ("wake", False),
    ("resume", True),
)


def prewarm_result(outcome: PrewarmOutcome, crashed: bool) -> PrewarmResult:
    """``complete``: every prefix warmed (or none to warm); ``failed``: the run raised or
    warmed nothing of something; ``partial``: the rest (budget cut, some replays refused)."""
    if crashed or (outcome.total > 0 and outcome.warmed == 0):
        return "failed"
    return "complete" if outcome.warmed >= outcome.total else "partial"


class AgentMetrics:
    def __init__(self, region: str, replicas: Sequence[str] = (), *, pool: bool = False) -> None:
        self.region = region
        self.registry = CollectorRegistry(auto_describe=True)
        # a model pool's unit -> its model, as the control plane answered (docs/models.md)
        self.pool_models: Mapping[str, str] = {}
        r = self.registry
        # with region, like every series of the agent's
        build_info(r, "agent", {"region": region})
        self.view_health = Gauge(
            "tectonic_agent_region_health",
            "1 for the agent's own verdict on its region (what it reports), 0 for the others",
            ["region", "verdict"],
            registry=r,
        )
        self.reports = Counter(
            "tectonic_agent_reports",
            "Health reports sent to the control plane, by result (accepted, failed: no "
            "listed control plane took it)",
            ["region", "result"],
            registry=r,
        )
        self.replica_up = Gauge(
            "tectonic_agent_replica_up",
            "1 if the replica's last probe (/health) answered, else 0; replicas the agent "
            "probes (the static ones, or the pool's ACTIVE ones)",
            ["region", "endpoint"],
            registry=r,
        )
        self.replica_probed = Gauge(
            "tectonic_agent_replica_last_probe_timestamp_seconds",
            "Unix time of the replica's last probe",
            ["region", "endpoint"],
            registry=r,
        )
        self.probes = Counter(
            "tectonic_agent_probes",
            "Replica probes, by result (up, down)",
            ["region", "endpoint", "result"],
            registry=r,
        )
        self.pool_replicas = Gauge(
            "tectonic_agent_pool_replicas",
            "Warm-pool replicas in each state (COLD, WARM, ACTIVE, IDLE); agents with a pool only",
            ["region", "state"],
            registry=r,
        )
        self.pool_shortfall = Gauge(
            "tectonic_agent_pool_shortfall",
            "ACTIVE replicas the pool wants and cannot reach yet (agents with a pool only)",
            ["region"],
            registry=r,
        )
        self.activations = Counter(
            "tectonic_agent_pool_activations",
            "Replicas brought into routing: wake (WARM -> ACTIVE, /wake_up + "
            "/reset_prefix_cache) or resume (IDLE -> ACTIVE), by result (ok, failed)",
            ["region", "kind", "result"],
            registry=r,
        )
        self.activation_seconds = Histogram(
            "tectonic_agent_pool_activation_duration_seconds",
            "Duration of the activations that succeeded, by kind",
            ["region", "kind"],
            buckets=ACTIVATION_BUCKETS,
            registry=r,
        )
        self.zero_wakes = Counter(
            "tectonic_agent_pool_zero_wakes",
            "Wakes of the pool from zero (scale to zero): asleep on purpose, then serving",
            ["region"],
            registry=r,
        )
        self.zero_wake_seconds = Histogram(
            "tectonic_agent_pool_zero_wake_duration_seconds",
            "From the last round the pool was asleep to its first ACTIVE replica",
            ["region"],
            buckets=ACTIVATION_BUCKETS,
            registry=r,
        )
        self.prewarm_runs = Counter(
            "tectonic_agent_prewarm_runs",
            "Pre-warm runs finished, by outcome (complete: every prefix warmed; partial: "
            "some, e.g. the budget ran out; failed: none, or the run raised)",
            ["region", "outcome"],
            registry=r,
        )
        self.prewarm_seconds = Histogram(
            "tectonic_agent_prewarm_duration_seconds",
            "Duration of finished pre-warm runs (activation, replays, verification)",
            ["region"],
            buckets=PREWARM_BUCKETS,
            registry=r,
        )
        self.prewarm_prefixes = Counter(
            "tectonic_agent_prewarm_prefixes",
            "Prefixes of finished pre-warm runs, by result (warmed, failed: refused by the "
            "replica, skipped: not replayed before the budget ran out)",
            ["region", "result"],
            registry=r,
        )
        self.prewarm_running = Gauge(
            "tectonic_agent_prewarm_running",
            "Pre-warm runs in progress",
            ["region"],
            registry=r,
        )
        self._probed: set[str] = set()  # replicas that have per-replica series now
        self._precreate(replicas, pool)

    def _precreate(self, replicas: Sequence[str], pool: bool) -> None:
        region = self.region
        self.viewed(Health.UNKNOWN)
        for result in ("accepted", "failed"):
            self.reports.labels(region, result)
        for url in replicas:
            self._replica_series(url)
        for outcome in ("complete", "partial", "failed"):
            self.prewarm_runs.labels(region, outcome)
        for result in ("warmed", "failed", "skipped"):
            self.prewarm_prefixes.labels(region, result)
        self.prewarm_seconds.labels(region)
        self.prewarm_running.labels(region).set(0)
        if pool:
            for state in ReplicaState:
                self.pool_replicas.labels(region, state.value).set(0)
            self.pool_shortfall.labels(region).set(0)
            for kind, ok in _ACTIVATIONS:
                self.activations.labels(region, kind, "ok" if ok else "failed")
                self.activation_seconds.labels(region, kind)

    def _replica_series(self, url: str) -> None:
        self._probed.add(url)
        for result in ("up", "down"):
            self.probes.labels(self.region, url, result)

    # ---- from the probe loop -------------------------------------------------------
    def probed(self, probes: Sequence[ReplicaProbe], at: float | None = None) -> None:
        """One probe round. Replicas no longer probed (a pool's drained or dead ones)
        lose their series: a frozen ``up`` would say something nobody measures."""
        at = time.time() if at is None else at
        for gone in self._probed - {p.url for p in probes}:
            self._probed.discard(gone)
            self.replica_up.remove(self.region, gone)
            self.replica_probed.remove(self.region, gone)
            for result in ("up", "down"):
                self.probes.remove(self.region, gone, result)
        for p in probes:
            if p.url not in self._probed:
                self._replica_series(p.url)
            self.replica_up.labels(self.region, p.url).set(1 if p.up else 0)
            self.replica_probed.labels(self.region, p.url).set(at)
            self.probes.labels(self.region, p.url, "up" if p.up else "down").inc()

    def viewed(self, health: Health) -> None:
        for v in Health:
            self.view_health.labels(self.region, v.value).set(1 if v is health else 0)

    def reported(self, accepted: bool) -> None:
        self.reports.labels(self.region, "accepted" if accepted else "failed").inc()

    # ---- from the warm pool -------------------------------------------------------
    def pool_snapshot(self, snap: PoolSnapshot) -> None:
        counts = {s: 0 for s in ReplicaState}
        for replica in snap.replicas:
            counts[replica.state] += 1
        for state, n in counts.items():
            self.pool_replicas.labels(self.region, state.value).set(n)
        self.pool_shortfall.labels(self.region).set(snap.shortfall)

    def activated(self, kind: ActivationKind, ok: bool, seconds: float) -> None:
        self.activations.labels(self.region, kind, "ok" if ok else "failed").inc()
        if ok:
            self.activation_seconds.labels(self.region, kind).observe(max(0.0, seconds))

    def woke_from_zero(self, seconds: float) -> None:
        self.zero_wakes.labels(self.region).inc()
        self.zero_wake_seconds.labels(self.region).observe(max(0.0, seconds))

    # ---- from the pre-warm service ------------------------------------------------
    def prewarm_started(self) -> None:
        self.prewarm_running.labels(self.region).inc()

    def prewarm_done(self, outcome: PrewarmOutcome, *, crashed: bool = False) -> None:
        region = self.region
        self.prewarm_running.labels(region).dec()
        self.prewarm_runs.labels(region, prewarm_result(outcome, crashed)).inc()
        self.prewarm_seconds.labels(region).observe(max(0.0, outcome.elapsed_s))
        skipped = max(0, outcome.total - outcome.warmed - outcome.failed)
        for result, n in (
            ("warmed", outcome.warmed),
            ("failed", outcome.failed),
            ("skipped", skipped),
        ):
            self.prewarm_prefixes.labels(region, result).inc(n)

    def render(self) -> bytes:
        """The exposition; a model pool's agent's series with the pool's ``model``."""
        return exposition(self.registry, self.pool_models)


class MetricsHttp:
    """``GET /metrics`` on its own listener. ``refresh`` runs before each scrape (the
    pool's state counts are read then, never stale)."""

    def __init__(self, metrics: AgentMetrics, refresh: Callable[[], None] = lambda: None) -> None:
        self.metrics = metrics
        self.refresh = refresh
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _page(self, request: web.Request) -> web.Response:
        self.refresh()
        resp = web.Response(body=self.metrics.render())
        resp.headers["content-type"] = CONTENT_TYPE
        return resp

    async def start(self, listen: str) -> int:
        """Listen on ``host:port`` (port 0: any free one); the port it got."""
        host, sep, port = listen.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit():
            raise OSError(f"cannot listen for metrics on {listen!r}: expected host:port")
        app = web.Application()
        app.router.add_get("/metrics", self._page)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, host, int(port)).start()
        except OSError as e:
            raise OSError(f"cannot listen for metrics on {listen}: {e}") from e
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
