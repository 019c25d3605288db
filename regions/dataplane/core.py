"""What a data plane of Tectonic keeps of the cluster, one implementation for the
gateway (``regions/gateway/server.py``) and the endpoint picker (``regions/picker/``):
the etcd store, the routing cache, session pins and their resolver, one replica
balancer per region, the pools, degradation and cluster-spec watches, admission
control's gates with the ``capacity/`` watch that bounds them, the health reporter and
the prefix tracker with its exporter, and the background tasks behind them.

A region whose agent runs a warm pool routes to the ACTIVE replicas in ``pools/<r>``
(its WARM ones sleep); any other region to the topology's ``regions[].replicas``.
Sessions this process spills off a region are announced in ``session-moves/``, and
the others' announcements make it re-read its cached pins of that region.

A part its settings turn off (replica load polling, admission control and its
``capacity/`` watch, health reports, prefix tracking) is an explicit stand-in
(``off.py``, ``admission_gate.AdmissionOff``), never None, and one log line at start
names each part that is off and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from controlplane.kernel.clock import SystemClock
from controlplane.kernel.cluster_spec import cluster_spec
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.prefix.tracker import PrefixTracker
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import Store, StoreError
from regions.dataplane.admission_gate import AdmissionGates, AdmissionOff, Gates
from regions.dataplane.capacity_bounds import CapacityBounds
from regions.dataplane.degradation_cache import DegradationCache
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.models import ModelRoutes, home_units
from regions.dataplane.observe import NoopObserver, PrefixObserver, TrackerObserver
from regions.dataplane.off import CapacityOff, ExportOff, Off, ReportsOff
from regions.dataplane.options import DataPlaneOptions
from regions.dataplane.pool_cache import PoolCache
from regions.dataplane.prefix_export import PrefixExporter
from regions.dataplane.replica_load import ReplicaLoadPoller
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.report import HealthReporter
from regions.dataplane.routing_cache import RoutingCache
from regions.dataplane.session_moves import SessionMovesBoard
from regions.dataplane.sessions import SessionResolver
from regions.dataplane.spec_watch import SpecWatch
from regions.dataplane.wake import Waker

log = logging.getLogger("tectonic.gateway")

# What a data plane checks against the cluster spec: what it routes and counts by (the
# recovery pace is the control plane's, and may come from its ladder file).
SPEC_SECTIONS = ("regions", "prefixes")


class DataPlaneCore:
    """Built from the options; ``supervise`` runs its background tasks until cancelled.
    ``observer``: counts prompts (default: a PrefixTracker exported to etcd, unless
    ``prefix_tracking`` is off; then a NoopObserver). ``metrics``: default a
    DataPlaneMetrics of the topology's regions (the gateway passes its own, which
    extend them)."""

    def __init__(
        self,
        options: DataPlaneOptions,
        *,
        store: Store | None = None,
        observer: PrefixObserver | None = None,
        kind: str = "gateway",
        metrics: DataPlaneMetrics | None = None,
    ) -> None:
        topo = options.topology
        home = options.app.home
        if home not in topo.sites:
            raise ValueError(
                f"home region {home!r} is not in the topology (regions: {', '.join(topo.sites)})"
            )
        self.options = options
        self.kind = kind  # "gateway" or "picker": names this process in etcd, logs, metrics
        self.keys = Keys(topo.cluster)
        self.store: Store = store or EtcdStore(options.etcd())
        self._own_store = store is None
        self.metrics = metrics or DataPlaneMetrics(topo.spill_groups(), component=kind)
        self.metrics.pool_models = topo.pool_models()  # each pool's series: its model
        self.routing = RoutingCache(self.store, self.keys)
        # spills: tell the others, and hear theirs (session_moves.py)
        self.moves = SessionMovesBoard(self.store, self.keys, self._sessions_moved_off)
        # one resolver per model family, each with its own pins and home (models.py)
        homes = home_units(topo, home)
        self._stores: dict[str, SessionStore] = {}
        self.resolvers = ModelRoutes(
            topo,
            home,
            {f: self._resolver(f, units, homes[f]) for f, units in topo.families().items()},
        )
        self.resolver = self.resolvers.default  # the home region's first family's
        self.sessions = self._stores[topo.family(topo.units_of(home)[0])]
        self.balancers = {
            r.name: ReplicaBalancer(
                r.replicas, load_factor=options.load_factor, slots=options.replica_slots
            )
            for r in topo.regions
        }
        self.pool_cache = PoolCache(self.store, self.keys, self._pool_changed)
        # scale to zero: a request for a pool at zero wakes it and waits (wake.py)
        self.waker = Waker(
            self.store,
            self.keys,
            self.balancers,
            lambda: self.pool_cache.members,
            self.metrics,
            default_s=options.wake_hold_s,
            most_s=options.wake_hold_max_s,
            writer=lambda: self.moves.gateway_id or self.kind,
        )
        self.degradation = DegradationCache(self.store, self.keys)
        self.spec_watch = SpecWatch(self.store, self.keys, cluster_spec(topo), SPEC_SECTIONS)
        # the optional parts: each is the real one, or a stand-in that says it is off
        self.replica_load = self._replica_load()
        self.admission, self.capacity = self._admission_control()
        self.reporter = self._reporter()
        self.tracker: PrefixTracker | None = None  # set when this core tracks prefixes
        self.observer, self.exporter = self._prefix_tracking(observer)
        self._say_what_is_off()

    def _resolver(self, family: str, units: tuple[str, ...], home: str) -> SessionResolver:
        options = self.options
        sessions = SessionStore(
            self.store,
            self.keys,
            regions=units,
            clock=SystemClock(),
            ttl_s=options.session_ttl_s,
            writer=self.kind,
            family=family,
        )
        self._stores[family] = sessions
        return SessionResolver(
            sessions,
            self.routing,
            home,
            self.metrics,
            max_pins=options.max_pins,
            revalidate_s=options.revalidate_s,
            store_timeout_s=options.store_timeout_s,
            on_moved=self.moves.moved,
        )

    def _replica_load(self) -> ReplicaLoadPoller | Off:
        """What each replica bears (its running/waiting), for the balancers' bounds."""
        interval = self.options.replica_poll_s
        if interval <= 0:
            why = "replica_poll_s is 0: replicas' running/waiting are not read"
            return Off("replica load polling", why)
        return ReplicaLoadPoller(self.balancers, interval_s=interval)

    def _admission_control(self) -> tuple[Gates, CapacityBounds | CapacityOff]:
        """Per-replica in-flight limits (off unless enabled), bounded by the flag or
        else by the measured capacity in ``capacity/<r>``."""
        options, topo = self.options.admission, self.options.topology
        if not options.enabled:
            return AdmissionOff("--admission not given"), CapacityOff("admission control is off")
        gates = AdmissionGates(options, topo, self.metrics)
        if options.max_inflight is not None:
            why = f"--admission-max-inflight bounds each replica at {options.max_inflight}"
            return gates, CapacityOff(why)
        return gates, CapacityBounds(self.store, self.keys, topo, gates, at=options.bound_at)

    def _reporter(self) -> HealthReporter | ReportsOff:
        """What this process's requests saw, reported to the control plane."""
        options = self.options
        if not options.control_planes:
            return ReportsOff("no --control-plane given")
        return HealthReporter(
            options.control_planes,
            options.observer_id,
            interval_s=options.report_interval_s,
            security=options.topology.security,
        )

    def _prefix_tracking(
        self, observer: PrefixObserver | None
    ) -> tuple[PrefixObserver, PrefixExporter | ExportOff]:
        """The prompts' observer and the export of what it counts."""
        if observer is not None:
            why = "the caller's observer counts the prompts"
            return observer, ExportOff("the prefix export", why)
        if not self.options.prefix_tracking:
            why = "--no-prefix-tracking: a failover warms nothing from this traffic"
            return NoopObserver(), ExportOff("prefix tracking", why)
        return self._track_prefixes()

    def _say_what_is_off(self) -> None:
        parts = (self.replica_load, self.admission, self.capacity, self.reporter, self.exporter)
        off = [str(part) for part in parts if isinstance(part, Off)]
        if off:
            log.info("%s: off: %s", self.kind, "; ".join(off))

    def _track_prefixes(self) -> tuple[PrefixObserver, PrefixExporter]:
        """Count prompt prefixes for pre-warm and export them to etcd on a lease."""
        options, topo = self.options, self.options.topology
        self.tracker = PrefixTracker(options.tracker_config())
        shared = topo.prefixes
        if (self.tracker.params, self.tracker.config.min_sessions) != (
            shared.params,
            shared.min_sessions,
        ):
            log.warning(
                "prefix tracking with %s, K=%d, but the topology says %s, K=%d: the "
                "leader will skip this %s's exports",
                self.tracker.params,
                self.tracker.config.min_sessions,
                shared.params,
                shared.min_sessions,
                self.kind,
            )
        exporter = PrefixExporter(
            self.store,
            self.keys,
            self.tracker,
            options.export_options(),
            payloads_dropped=self.metrics.prefix_payloads_dropped,
        )
        return TrackerObserver(self.tracker), exporter

    def name(self, observer: str, process_id: str) -> None:
        """Name this process once its address is known: ``observer`` its health reports,
        ``process_id`` (unique across hosts) its prefix export and session-move notices;
        the options' ``observer_id`` names all three when set."""
        if not self.options.observer_id:
            self.reporter.observer = observer
        self.moves.gateway_id = self.exporter.gateway_id = self.options.observer_id or process_id

    async def loaded(self) -> None:
        """The first full reads of ``routing/`` and ``pools/``: before them, a data
        plane does not know where traffic goes and must not guess."""
        await self.routing.loaded.wait()
        await self.pool_cache.loaded.wait()

    async def wait_loaded(self, supervisor: asyncio.Task[None]) -> None:
        """``loaded``, warning every 5 s while etcd is not read; raises what ended
        ``supervisor`` if it ends first."""
        waiter = asyncio.create_task(self.loaded())
        while not waiter.done():
            done, _ = await asyncio.wait(
                {waiter, supervisor}, timeout=5.0, return_when=asyncio.FIRST_COMPLETED
            )
            if supervisor in done:
                waiter.cancel()
                await supervisor  # raises what stopped it
                raise RuntimeError(f"{self.kind} tasks ended before routing was read")
            if not done:
                log.warning(
                    "waiting for etcd (%s) to read routing/ and pools/ before serving",
                    ", ".join(self.options.etcd().endpoints),
                )

    async def check_spec(self) -> None:
        """Refuse to serve (SpecDisagreement, naming each setting) with a topology whose
        regions or prefixes settings differ from the cluster spec the leader published:
        its exports would be skipped, or warmed prefixes routed to cold replicas.
        Without a spec (no leader has run yet), or when it cannot be read, warn and go on
        (the spec watch checks again once it can)."""
        with contextlib.suppress(StoreError):  # warned; serving from the caches is fine
            await self.spec_watch.check()

    def _sessions_moved_off(self, region: str) -> None:
        resolver = self.resolvers.by_family.get(self.options.topology.family(region))
        if resolver is not None:  # None: not a region of this topology
            resolver.sessions_moved_off(region)

    def _pool_changed(self, region: str, members: PoolMembers | None) -> None:
        """A pooled region routes to its ACTIVE replicas; without a pool entry, to the
        topology's. The balancer is replaced (readers look it up in the same dict):
        in-flight counts restart at 0, also for replicas that stay, and requests in
        flight release on the balancer they started on; both are harmless. The slots
        learned of the replicas that stay carry over."""
        current = self.balancers.get(region)
        if current is None:  # not a region of this topology: nothing routes there
            return
        static = self.options.topology.region(region).replicas
        replicas = tuple(dict.fromkeys(members.active)) if members is not None else static
        if set(replicas) == set(current.replicas):  # the ring ignores order
            return  # e.g. only the WARM count or the timestamp changed
        self.balancers[region] = current.rebuilt(replicas)
        self.waker.changed()  # requests held for a pool at zero look again
        source = f"pools/{region} from {members.agent}" if members else "the topology"
        log.info(
            "region %s replicas (%s): %s",
            region,
            source,
            ", ".join(replicas) or "none (requests get 503 until one is ACTIVE)",
        )

    async def supervise(self) -> None:
        """The background tasks; those of a part that is off end at once."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.routing.run(), name="routing-watch")
            tg.create_task(self.pool_cache.run(), name="pools-watch")
            tg.create_task(self.degradation.run(), name="degradation-watch")
            for family, resolver in self.resolvers.by_family.items():
                tg.create_task(resolver.run(), name=f"pin-reconcile{family and '-' + family}")
            tg.create_task(self.moves.run(), name="session-moves")
            tg.create_task(self.replica_load.run(), name="replica-load")
            tg.create_task(self.capacity.run(), name="capacity-watch")
            tg.create_task(self.capacity.rechecks(), name="capacity-recheck")
            tg.create_task(self.reporter.run(), name="health-report")
            tg.create_task(self.exporter.run(), name="prefix-export")

    @staticmethod
    async def first_ended(spec: asyncio.Task[None] | None, tasks: asyncio.Task[None]) -> None:
        """Until the background ``tasks`` end (only by failing, or on stop) or the spec
        watch does (a disagreeing spec): raises what ended the first, the spec's first
        (the reason to name: SpecDisagreement, for the caller to stop and exit 2)."""
        running = [t for t in (spec, tasks) if t is not None]
        done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for task in running:
            if task in done and not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    async def close(self) -> None:
        """After ``supervise`` is cancelled: the reporter's channels and our store."""
        await self.reporter.close()
        if self._own_store:
            await self.store.close()
