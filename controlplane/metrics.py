"""The control plane's Prometheus metrics, on a registry per replica (never the
process-wide default, so that replicas sharing a test process do not share series).

``ControlPlaneMetrics`` observes; it never reads the store. The reconcile loop calls
``tick_done`` after every tick that made progress (with the snapshot the leader
decided on and the result it applied), and the orchestrator calls ``transitioned`` /
``failover_step_done`` after each write that succeeded.

Region gauges (state, health, pre-warm attainment, routing weights, drill readiness,
capacity utilisation and the capacity behind it) are exported by the leader only: a
follower reads no snapshot, so it drops them rather than export stale values, and
``max by (region, state) (tectonic_region_state)`` over all replicas has exactly one
answer. Counters and the histograms count what each replica did while it led. Session
moves are counted by the gateways (``tectonic_gateway_*``), not here.

Given the topology's regions, every transition the state machine allows exists from
the start at 0 for each: a series born at its first event hides that event from
``increase()`` (a dashboard would show no transition in a blackout).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from controlplane.core.actions import TickResult
from controlplane.core.bearing import HIT_RATE_SIGNAL, hit_rate_of, load_of, region_bearing
from controlplane.core.cold_start import cold_starts
from controlplane.core.machine import TRANSITIONS
from controlplane.core.spend import allowed_scopes, cost_report
from controlplane.kernel.capacity.bearing import utilization
from controlplane.kernel.capacity.record import Bearing, critical_hit_rate
from controlplane.kernel.config import Topology
from controlplane.kernel.metric_labels import exposition
from controlplane.kernel.model import (
    Cause,
    Decision,
    FailoverProgress,
    FailoverStep,
    Health,
    PrewarmFigures,
    RegionState,
)
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.prefix.catalog import PrefixCatalog
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.kernel.version import build_info

log = logging.getLogger("tectonic.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Failover start -> routing switch recorded: about a tick when the switch comes first,
# up to the 30 s pre-warm budget (and more on a slow store) when it warms first.
FAILOVER_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0)
# A leader's tick: milliseconds on a healthy store, up to its period (1 s by default)
# when slow, cut at period + 2 x retry timeout (5 s by default).
UNKNOWN_STATE = "UNKNOWN"  # the state label while the store refuses writes
TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


def prewarm_fraction(result: PrewarmFigures) -> float | None:
    """Budget attainment from a failover record's ``prewarm_result``: the pre-warmer's
    own ``attained_fraction`` if it reports one, else warmed / total prefixes; None when
    there was nothing to warm (no data is not 0 % and not 100 %)."""
    if result.attained_fraction is not None:
        return max(0.0, min(1.0, result.attained_fraction))
    total = result.prefixes_total or 0.0
    if total <= 0:
        return None
    return max(0.0, min(1.0, (result.prefixes_warmed or 0.0) / total))


def pool_info(registry: CollectorRegistry, topology: Topology | None) -> None:
    """``tectonic_pool_info``: with model pools (docs/models.md), one series per pool's
    failover unit, whose ``region`` label is the one every per-region series of that
    pool carries (``<region>.<pool>``): join on it for the region, pool or models, e.g.
    ``tectonic_region_state * on(region) group_left(models) tectonic_pool_info``."""
    if topology is None or not topology.pooled:
        return
    info = Gauge(
        "tectonic_pool_info",
        "1 per model pool: its failover unit (region), its region as the topology names "
        "it (pool_of), its pool and the model names it answers (comma-separated)",
        ["region", "pool_of", "pool", "models"],
        registry=registry,
    )
    for name in topology.names:
        if (pool := topology.pool_of(name)) is not None:
            info.labels(name, pool.region, pool.pool, ",".join(pool.models)).set(1)


class _FlushFirst(Collector):
    """No metric of its own: it runs ``flush`` when the registry collects, before the
    collectors registered after it (the registry collects in registration order)."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush

    def collect(self) -> Iterable[Metric]:
        self._flush()
        return ()

    def describe(self) -> Iterable[Metric]:
        return ()  # names nothing: never a duplicate


class ControlPlaneMetrics:
    def __init__(self, regions: Iterable[str] = (), topology: Topology | None = None) -> None:
        """``regions``: the topology's, whose transition series start at 0;
        ``topology``: what the capacity gauges are judged by (None: none exported)."""
        self.topology = topology
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # first in the registry: whatever collects (a scrape, a test's read) sees the
        # newest tick's gauges, set then rather than on every tick (at 512 pools that
        # was half of each tick, for a scrape every 15 s)
        r.register(_FlushFirst(self.flush))
        self._pending: tuple[Snapshot, TickResult | None] | None = None
        build_info(r, "controlplane")
        pool_info(r, topology)
        self.region_state = Gauge(
            "tectonic_region_state",
            "1 for the region's current state, 0 for the others (leader only)",
            ["region", "state"],
            registry=r,
        )
        self.region_cause = Gauge(
            "tectonic_region_state_cause",
            "1 for what started the region's current state (automatic: the leader on what "
            "the observers saw; manual: an operator; drill: a drill on the region; "
            "capacity), 0 for the others (leader only)",
            ["region", "cause"],
            registry=r,
        )
        self.region_health = Gauge(
            "tectonic_region_health",
            "1 for the region's folded health verdict, 0 for the others (leader only)",
            ["region", "verdict"],
            registry=r,
        )
        self.transitions = Counter(
            "tectonic_transitions",
            "Region state transitions this replica recorded",
            ["region", "from", "to", "trigger"],
            registry=r,
        )
        self.failover_duration = Histogram(
            "tectonic_failover_duration_seconds",
            "Failover start to routing switch recorded",
            buckets=FAILOVER_BUCKETS,
            registry=r,
        )
        self.prewarm_attained = Gauge(
            "tectonic_prewarm_attained_fraction",
            "Pre-warm budget attainment of the region's current or last failover (leader only)",
            ["region"],
            registry=r,
        )
        self.leader = Gauge("tectonic_leader", "1 while this replica leads", registry=r)
        self.store_writable = Gauge(
            "tectonic_store_writable",
            "0 while etcd refuses writes (its NOSPACE alarm, or a permanent refusal of the "
            "leader's writes): region states then show UNKNOWN; 1 otherwise",
            registry=r,
        )
        self.store_writable.set(1)
        self.compacted_revision = Gauge(
            "tectonic_store_compacted_revision",
            "The etcd revision this replica last compacted the history to (0: none yet)",
            registry=r,
        )
        self.compactions = Counter(
            "tectonic_store_compactions",
            "Compactions of etcd's history this replica ran",
            registry=r,
        )
        self.loop_ticks = Counter(
            "tectonic_loop_ticks", "Reconcile ticks that completed", registry=r
        )
        self.tick_duration = Histogram(
            "tectonic_loop_tick_duration_seconds",
            "Reconcile ticks this replica ran as leader (read, decide, act), however they "
            "ended; a tick is cut at loop_period_s + 2 x retry_timeout_s",
            buckets=TICK_BUCKETS,
            registry=r,
        )
        self.loop_last_progress = Gauge(
            "tectonic_loop_last_progress_timestamp",
            "Unix time of the last reconcile tick that completed",
            registry=r,
        )
        self.routing_weight = Gauge(
            "tectonic_routing_weight",
            "Share of the traffic homed in region that routing/<region> sends to target "
            "(leader only)",
            ["region", "target"],
            registry=r,
        )
        self.region_barred = Gauge(
            "tectonic_region_barred",
            "1 while a failed last drill bars the region as a failover target and no "
            "operator overrode it, else 0 (leader only)",
            ["region"],
            registry=r,
        )
        self.drill_timestamp = Gauge(
            "tectonic_region_drill_timestamp_seconds",
            "Unix time of the region's last drill verdict in regions/<region>/readiness; "
            "absent while it has none (leader only)",
            ["region"],
            registry=r,
        )
        self.automation_paused = Gauge(
            "tectonic_automation_paused",
            "1 while operators paused automation (automatic transitions: failovers and "
            "recovery steps), else 0 (a follower says 0)",
            registry=r,
        )
        self.region_held = Gauge(
            "tectonic_region_held",
            "1 while an operator holds the unit's automation (failoverctl hold), else 0 "
            "(leader only)",
            ["region"],
            registry=r,
        )
        self.catalog_payloads = Gauge(
            "tectonic_prefix_catalog_payloads",
            "Replay payloads in the unit's prefix catalog as last written, by the data key "
            'that sealed them (docs/residency.md; key="clear": not sealed). After a '
            "rotation, a key can be removed once no catalog counts it (leader only)",
            ["region", "key"],
            registry=r,
        )
        self.capacity_utilization = Gauge(
            "tectonic_region_capacity_utilization",
            "Capacity utilisation (CBU): served load over the load the region bears at the "
            "hit rate of what it serves; +Inf when it serves load and bears none (leader only)",
            ["region"],
            registry=r,
        )
        self.allowed_rps = Gauge(
            "tectonic_region_allowed_rps",
            "Requests/s the region bears now at its hit rate: its capacity probe's allowed "
            "load when fresh, else the topology's capacity_rps (leader only)",
            ["region"],
            registry=r,
        )
        self.capacity_stale = Gauge(
            "tectonic_region_capacity_stale",
            "1 while the region's capacity probe is too old or of another engine (the "
            "typed capacity_rps is used instead), else 0, also without a probe (leader only)",
            ["region"],
            registry=r,
        )
        self.capacity_age = Gauge(
            "tectonic_region_capacity_age_seconds",
            "Age of the region's last capacity probe (capacity/<region>); absent while it "
            "has none (leader only)",
            ["region"],
            registry=r,
        )
        self.hit_rate = Gauge(
            "tectonic_region_hit_rate",
            "Prefix-cache hit rate of what the region serves, as its agent reports it; "
            "absent while none reports one (leader only)",
            ["region"],
            registry=r,
        )
        self.critical_hit_rate = Gauge(
            "tectonic_region_critical_hit_rate",
            "The hit rate under which the region bears less than the load it serves now, "
            "by its last capacity probe's measured beta (fresh or stale); at or under 0 it "
            "bears its load even fully cold (-Inf: at any hit rate); absent without a probe "
            "(leader only)",
            ["region"],
            registry=r,
        )
        self.desired_replicas = Gauge(
            "tectonic_pool_desired_replicas",
            "Replicas the leader's scaler wants of a pool (scale/<unit>), by state: active "
            "(serving) and warm (asleep, ready); an HPA may target the active series in "
            "advisory mode (docs/scaling.md) (leader only, with scaling: on)",
            ["region", "state"],
            registry=r,
        )
        self.forecast_rps = Gauge(
            "tectonic_pool_forecast_rps",
            "The load the scaler sized a pool on: observed (its agent's last report), "
            "forecast (a horizon ahead) and upper (the forecast's P90 band) (leader only)",
            ["region", "series"],
            registry=r,
        )
        self.cost = Gauge(
            "tectonic_cost_dollars_per_hour",
            "What the replicas cost now, $ per hour at the topology's prices per state "
            "(docs/scaling.md, Cost): scope pool (name: the unit), zone or fleet (leader "
            "only, with cost: set)",
            ["scope", "name"],
            registry=r,
        )
        self.budget_utilisation = Gauge(
            "tectonic_budget_utilisation",
            "Spend now over the budget, per scope with a budget (pool, zone, fleet); the "
            "scaler aims at cost.target_utilisation (leader only)",
            ["scope", "name"],
            registry=r,
        )
        self.budget_allowed = Gauge(
            "tectonic_budget_allowed",
            "1 while a scope with a budget may spend past it (an operator's lift, or a "
            "failover target's allowance; a zone or the fleet: one of its pools'), else 0; "
            "doctor's week of utilisation leaves those times out (leader only)",
            ["scope", "name"],
            registry=r,
        )
        self.budget_binding = Gauge(
            "tectonic_budget_binding",
            "1 while the budget holds a pool under what its forecast needs (the scaler "
            "capped it and the ladder sheds instead), else 0 (leader only)",
            ["pool"],
            registry=r,
        )
        self.pool_efficiency = Gauge(
            "tectonic_pool_efficiency",
            "A pool's served load over the capacity it pays for (every paid replica at the "
            "hit rate now); absent without a load (leader only)",
            ["pool"],
            registry=r,
        )
        # The cold-start budget (core/cold_start.py, docs/scaling.md "Cold-start budget").
        self.activation_p95 = Gauge(
            "tectonic_pool_activation_p95_seconds",
            "p95 of a pool's last wakes (WARM -> ACTIVE) as its agent measures and "
            "publishes them (pools/<unit>); absent before the first wake (leader only)",
            ["pool"],
            registry=r,
        )
        self.cold_start_budget = Gauge(
            "tectonic_pool_cold_start_budget_seconds",
            "The most a pool's activation p95 may take: a third of its first-token SLO "
            "(slo.ttft_p99_s / 3) (leader only)",
            ["pool"],
            registry=r,
        )
        self.warm_standby = Gauge(
            "tectonic_pool_warm_standby",
            "WARM replicas (with IDLE) a pool has standing by now (pools/<unit>) (leader "
            "only, with scaling: on)",
            ["pool"],
            registry=r,
        )
        self.warm_needed = Gauge(
            "tectonic_pool_warm_needed",
            "WARM replicas the sizing formula needs for the pool's planned burst "
            "(standby_rps or the forecast's band, beyond ACTIVE now), on the measured "
            "activation p95, activation rate and capacity where measured (leader only, "
            "with scaling: on)",
            ["pool"],
            registry=r,
        )
        self.warm_needed_inputs = Gauge(
            "tectonic_pool_warm_needed_inputs_measured",
            "1 where tectonic_pool_warm_needed used a measured input, 0 where a typed one "
            "stood in: input activation_s (the wake p95), activation_rate (the rate the "
            "pool's batches of wakes achieved; else the typed scaling.activation_rate) or "
            "replica_rps (the capacity probe) (leader only)",
            ["pool", "input"],
            registry=r,
        )
        self._epochs: dict[str, int] = {}  # per region: newest epoch the gauges show
        self._catalog_keys: dict[str, set[str]] = {}  # per region: keys the gauge shows
        self._targets: dict[str, set[str]] = {}  # per region: targets routing_weight shows
        self._drilled: set[str] = set()  # regions drill_timestamp shows
        self._probed: set[str] = set()  # regions capacity_age shows
        for region in regions:
            for trigger, sources, dest in TRANSITIONS:
                for source in sources:
                    self.transitions.labels(region, source.value, dest.value, trigger)

    def scrape(self, *, leader: bool, writable: bool = True) -> bytes:
        """The exposition, with leadership and the store's writability as of now (ticks
        stop when the store does): while it refuses writes, every region's state is
        UNKNOWN, not the last one recorded."""
        self.leader.set(1 if leader else 0)
        self.store_writable.set(1 if writable else 0)
        self.flush()  # before the overrides below, which a later flush would undo
        if not writable:
            for region in self._epochs:
                for s in RegionState:
                    self.region_state.labels(region, s.value).set(0)
                self.region_state.labels(region, UNKNOWN_STATE).set(1)
                self._set_health(region, Health.UNKNOWN)
        models = self.topology.pool_models() if self.topology is not None else {}
        return exposition(self.registry, models)

    # ---- from the reconcile loop ------------------------------------------------------
    def tick_done(
        self, *, leader: bool, snapshot: Snapshot | None, result: TickResult | None = None
    ) -> None:
        self.loop_ticks.inc()
        self.loop_last_progress.set(time.time())
        self.leader.set(1 if leader else 0)
        if snapshot is not None:
            self._pending = (snapshot, result)  # the gauges follow at the next collect
        elif not leader:
            self._pending = None
            self._drop_region_gauges()
            self.automation_paused.set(0)

    def flush(self) -> None:
        """Set the gauges from the newest tick not shown yet (the registry does this
        before each collect; only the newest tick matters, each is whole)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        snapshot, result = pending
        sizes = result.sizes if result is not None else {}
        self._from_snapshot(snapshot)
        self._set_scale(sizes)
        self._set_cost(snapshot, sizes)
        self._set_cold_start(snapshot, sizes)
        # This tick's fold is newer than the snapshot's stored health.
        for h in result.health if result is not None else ():
            self._set_health(h.region, h.health.verdict)

    def catalog_written(self, region: str, catalog: PrefixCatalog) -> None:
        """A prefix catalog the leader wrote: its payloads counted by sealing key."""
        counts: dict[str, int] = {}
        for e in catalog.entries:
            if e.payload is not None:
                key = e.payload.sealed.kid if e.payload.sealed is not None else "clear"
                counts[key] = counts.get(key, 0) + 1
        for labels in list(self._catalog_keys.get(region, ())):
            if labels not in counts:
                self.catalog_payloads.remove(region, labels)
        for key, n in counts.items():
            self.catalog_payloads.labels(region, key).set(n)
        self._catalog_keys[region] = set(counts)

    def compacted(self, revision: int) -> None:
        self.compacted_revision.set(revision)
        self.compactions.inc()

    def tick_timed(self, seconds: float) -> None:
        self.tick_duration.observe(seconds)

    def _from_snapshot(self, snap: Snapshot) -> None:
        for name, view in snap.regions.items():
            rec = view.record
            # The snapshot was read before this tick's writes: never step back from a
            # transition ``transitioned`` has already shown.
            if rec.epoch >= self._epochs.get(name, 0):
                cause = rec.last_decision.cause if rec.last_decision else Cause.AUTOMATIC
                self._set_state(name, rec.state, rec.epoch, cause)
            self._set_health(name, view.health.verdict)
            if rec.failover is not None:
                self._set_prewarm(name, rec.failover.prewarm_result)
            self._set_routing(name, view.effective_routing().targets)
            self._set_readiness(name, view)
            self._set_capacity(name, view, snap.now)
            self.region_held.labels(name).set(1 if view.held(snap.now) else 0)
        self.automation_paused.set(1 if snap.paused else 0)

    def _drop_region_gauges(self) -> None:
        if self._epochs:
            self.region_state.clear()
            self.region_cause.clear()
            self.region_health.clear()
            self.prewarm_attained.clear()
            self.routing_weight.clear()
            self.region_barred.clear()
            self.region_held.clear()
            self.drill_timestamp.clear()
            self.capacity_utilization.clear()
            self.allowed_rps.clear()
            self.capacity_stale.clear()
            self.capacity_age.clear()
            self.hit_rate.clear()
            self.critical_hit_rate.clear()
            self.desired_replicas.clear()
            self.forecast_rps.clear()
            self._clear_cold_start()
            self._epochs.clear()
            self._targets.clear()
            self._drilled.clear()
            self._probed.clear()

    def _set_routing(self, region: str, targets: dict[str, float]) -> None:
        for gone in self._targets.get(region, set()) - targets.keys():
            self.routing_weight.remove(region, gone)
        self._targets[region] = set(targets)
        for target, weight in targets.items():
            self.routing_weight.labels(region, target).set(weight)

    def _set_readiness(self, region: str, view: RegionView) -> None:
        self.region_barred.labels(region).set(1 if view.barred else 0)
        at = view.readiness.at if view.readiness is not None else 0.0
        if at > 0:
            self.drill_timestamp.labels(region).set(at)
            self._drilled.add(region)
        elif region in self._drilled:
            self.drill_timestamp.remove(region)
            self._drilled.discard(region)

    def _set_capacity(self, region: str, view: RegionView, now: float) -> None:
        """CBU against the bearing the planner uses (``core.bearing``), so that the alert
        and the failover plan never disagree about what a region bears."""
        if self.topology is None:
            return
        bearing = region_bearing(view, self.topology, now)
        allowed = bearing.allowed(hit_rate_of(view))
        self.capacity_utilization.labels(region).set(utilization(load_of(view), allowed))
        self.allowed_rps.labels(region).set(allowed)
        self.capacity_stale.labels(region).set(1 if bearing.stale else 0)
        if bearing.record is not None:
            self.capacity_age.labels(region).set(max(0.0, now - bearing.record.measured_at))
            self._probed.add(region)
        elif region in self._probed:
            self.capacity_age.remove(region)
            self._probed.discard(region)
        self._set_hit_rates(region, view, bearing)

    def _set_hit_rates(self, region: str, view: RegionView, bearing: Bearing) -> None:
        """The hit rate served and the one under which the region bears less than its
        load (TectonicHitRateNearCritical compares them). The critical one is of the last
        probe's record, fresh or stale: beta is a measurement either way, and a stale
        probe has its own alert (TectonicCapacityStale)."""
        served = view.health.signals.get(HIT_RATE_SIGNAL)
        if served is None:
            self.hit_rate.remove(region)
        else:
            self.hit_rate.labels(region).set(hit_rate_of(view))
        rec = bearing.record
        if rec is None:
            self.critical_hit_rate.remove(region)
            return
        n = view.active_replicas if view.active_replicas is not None else rec.active_replicas
        self.critical_hit_rate.labels(region).set(critical_hit_rate(rec, n, load_of(view)))

    def _set_scale(self, sizes: Mapping[str, ScaleRecord]) -> None:
        """The scaler's newest record of each pool (written or not this tick); a pool it
        no longer sizes (scaling switched off, paused) keeps no stale series."""
        self.desired_replicas.clear()
        self.forecast_rps.clear()
        for unit, rec in sizes.items():
            self.desired_replicas.labels(unit, "active").set(rec.active)
            self.desired_replicas.labels(unit, "warm").set(rec.warm)
            for series, value in (
                ("observed", rec.load_rps),
                ("forecast", rec.forecast_rps),
                ("upper", rec.upper_rps),
            ):
                if value is not None:
                    self.forecast_rps.labels(unit, series).set(value)

    def _set_cost(self, snap: Snapshot, sizes: Mapping[str, ScaleRecord]) -> None:
        """Spend, utilisation and efficiency of every pool, zone and the fleet, from the
        replicas running now; binding from the scaler's newest records. Nothing without
        ``cost:`` (no stale series either)."""
        gauges = (self.cost, self.budget_utilisation, self.budget_allowed, self.budget_binding)
        for g in (*gauges, self.pool_efficiency):
            g.clear()
        report = cost_report(snap, self.topology) if self.topology is not None else None
        if report is None:
            return
        for (scope, name), why in allowed_scopes(report).items():
            self.budget_allowed.labels(scope, name).set(1 if why else 0)
        for p in report.pools:
            self.cost.labels("pool", p.unit).set(p.dollars_per_hour)
            if p.utilisation is not None:
                self.budget_utilisation.labels("pool", p.unit).set(p.utilisation)
            if p.efficiency is not None:
                self.pool_efficiency.labels(p.unit).set(p.efficiency)
            note = sizes[p.unit].budget if p.unit in sizes else None
            self.budget_binding.labels(p.unit).set(1 if note is not None and note.short else 0)
        for s in report.scopes:
            self.cost.labels(s.scope, s.name).set(s.dollars_per_hour)
            if s.utilisation is not None:
                self.budget_utilisation.labels(s.scope, s.name).set(s.utilisation)

    def _cold_start_gauges(self) -> tuple[Gauge, ...]:
        return (
            self.activation_p95,
            self.cold_start_budget,
            self.warm_standby,
            self.warm_needed,
            self.warm_needed_inputs,
        )

    def _clear_cold_start(self) -> None:
        for g in self._cold_start_gauges():
            g.clear()

    def _set_cold_start(self, snap: Snapshot, sizes: Mapping[str, ScaleRecord]) -> None:
        """Each pool's activation p95 against its budget, and its WARM standby against
        the sizing formula (``core/cold_start.py``); no stale series of a pool gone."""
        self._clear_cold_start()
        if self.topology is None:
            return
        for c in cold_starts(snap, self.topology, sizes):
            self.cold_start_budget.labels(c.unit).set(c.budget_s)
            if c.activation_p95_s is not None:
                self.activation_p95.labels(c.unit).set(c.activation_p95_s)
            if c.warm_now is None or c.warm_needed is None:
                continue
            self.warm_standby.labels(c.unit).set(c.warm_now)
            self.warm_needed.labels(c.unit).set(c.warm_needed)
            for name, measured in c.measured.items():
                self.warm_needed_inputs.labels(c.unit, name).set(1 if measured else 0)

    def _set_state(self, region: str, state: RegionState, epoch: int, cause: str) -> None:
        self._epochs[region] = epoch
        for s in RegionState:
            self.region_state.labels(region, s.value).set(1 if s is state else 0)
        self.region_state.labels(region, UNKNOWN_STATE).set(0)
        for c in Cause:  # a cause a newer leader added shows as none of these
            self.region_cause.labels(region, c.value).set(1 if c == cause else 0)

    def _set_health(self, region: str, verdict: Health) -> None:
        for v in Health:
            self.region_health.labels(region, v.value).set(1 if v is verdict else 0)

    def _set_prewarm(self, region: str, result: PrewarmFigures) -> None:
        fraction = prewarm_fraction(result)
        if fraction is not None:
            self.prewarm_attained.labels(region).set(fraction)

    # ---- from the orchestrator -------------------------------------------------------
    def transitioned(self, d: Decision) -> None:
        self.transitions.labels(d.region, d.from_state.value, d.to_state.value, d.trigger).inc()
        self._set_state(d.region, d.to_state, d.epoch, d.cause)

    def failover_step_done(
        self, region: str, step: FailoverStep, progress: FailoverProgress, at: float
    ) -> None:
        if step is FailoverStep.SWITCH:
            self.failover_duration.observe(max(0.0, at - progress.started_at))
        elif step is FailoverStep.PREWARM:
            self._set_prewarm(region, progress.prewarm_result)
