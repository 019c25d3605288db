"""What a data plane of Tectonic keeps of the cluster, one implementation for the
gateway (``server.py``) and the endpoint picker (``regions/picker/``): the etcd store,
the routing cache, session pins and their resolver, one replica balancer per region,
the pools, degradation and cluster-spec watches, admission control's gates with the
``capacity/`` watch that bounds them, the health reporter and the prefix tracker with
its exporter, and the background tasks behind them.

A region whose agent runs a warm pool routes to the ACTIVE replicas in ``pools/<r>``
(its WARM ones sleep); any other region to the topology's ``regions[].replicas``.
Sessions this process spills off a region are announced in ``session-moves/``, and
the others' announcements make it re-read its cached pins of that region.
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
from regions.gateway.admission_gate import AdmissionGates
from regions.gateway.capacity_bounds import CapacityBounds
from regions.gateway.degradation_cache import DegradationCache
from regions.gateway.metrics import GatewayMetrics
from regions.gateway.observe import PrefixObserver, TrackerObserver
from regions.gateway.options import GatewayOptions
from regions.gateway.pool_cache import PoolCache
from regions.gateway.prefix_export import PrefixExporter
from regions.gateway.replica_load import ReplicaLoadPoller
from regions.gateway.replicas import ReplicaBalancer
from regions.gateway.report import HealthReporter
from regions.gateway.routing_cache import RoutingCache
from regions.gateway.session_moves import SessionMovesBoard
from regions.gateway.sessions import SessionResolver
from regions.gateway.spec_watch import SpecWatch

log = logging.getLogger("tectonic.gateway")

# What a data plane checks against the cluster spec: what it routes and counts by (the
# recovery pace is the control plane's, and may come from its ladder file).
SPEC_SECTIONS = ("regions", "prefixes")


class DataPlaneCore:
    """Built from the options; ``supervise`` runs its background tasks until cancelled.
    ``observer``: counts prompts (default: a PrefixTracker exported to etcd, unless
    ``prefix_tracking`` is off; then ``self.observer`` is None)."""

    def __init__(
        self,
        options: GatewayOptions,
        *,
        store: Store | None = None,
        observer: PrefixObserver | None = None,
        kind: str = "gateway",
    ) -> None:
        topo = options.topology
        home = options.app.home
        if home not in topo.names:
            raise ValueError(
                f"home region {home!r} is not in the topology (regions: {', '.join(topo.names)})"
            )
        self.options = options
        self.kind = kind  # "gateway" or "picker": names this process in etcd, logs, metrics
        self.keys = Keys(topo.cluster)
        self.store: Store = store or EtcdStore(options.etcd())
        self._own_store = store is None
        self.metrics = GatewayMetrics({r.name: r.zone for r in topo.regions}, component=kind)
        self.routing = RoutingCache(self.store, self.keys)
        self.sessions = SessionStore(
            self.store,
            self.keys,
            regions=topo.names,
            clock=SystemClock(),
            ttl_s=options.session_ttl_s,
            writer=kind,
        )
        # spills: tell the others, and hear theirs (session_moves.py)
        self.moves = SessionMovesBoard(self.store, self.keys, self._sessions_moved_off)
        self.resolver = SessionResolver(
            self.sessions,
            self.routing,
            home,
            self.metrics,
            max_pins=options.max_pins,
            revalidate_s=options.revalidate_s,
            store_timeout_s=options.store_timeout_s,
            on_moved=self.moves.moved,
        )
        self.balancers = {
            r.name: ReplicaBalancer(
                r.replicas, load_factor=options.load_factor, slots=options.replica_slots
            )
            for r in topo.regions
        }
        # what each replica bears (its running/waiting), for the balancers' bounds
        self.replica_load: ReplicaLoadPoller | None = None
        if options.replica_poll_s > 0:
            self.replica_load = ReplicaLoadPoller(self.balancers, interval_s=options.replica_poll_s)
        self.pool_cache = PoolCache(self.store, self.keys, self._pool_changed)
        self.degradation = DegradationCache(self.store, self.keys)
        self.spec_watch = SpecWatch(
            self.store, self.keys, cluster_spec(options.topology), SPEC_SECTIONS
        )
        # admission control (off unless enabled): per-replica in-flight limits, bounded
        # by the flag or else by the measured capacity in capacity/<r>
        self.admission: AdmissionGates | None = None
        self.capacity: CapacityBounds | None = None
        if options.admission.enabled:
            self.admission = AdmissionGates(options.admission, topo, self.metrics)
            if options.admission.max_inflight is None:
                self.capacity = CapacityBounds(
                    self.store, self.keys, topo, self.admission, at=options.admission.bound_at
                )
            else:
                log.info(
                    "admission bound: %d in flight per replica (--admission-max-inflight; "
                    "capacity/ is not read)",
                    options.admission.max_inflight,
                )
        self.reporter: HealthReporter | None = None
        if options.control_planes:
            self.reporter = HealthReporter(
                options.control_planes,
                options.observer_id,
                interval_s=options.report_interval_s,
                security=topo.security,
            )
        self.tracker: PrefixTracker | None = None
        self.exporter: PrefixExporter | None = None
        if observer is None and options.prefix_tracking:
            observer = self._track_prefixes()
        self.observer = observer

    def _track_prefixes(self) -> PrefixObserver:
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
        self.exporter = PrefixExporter(
            self.store,
            self.keys,
            self.tracker,
            options.export_options(),
            payloads_dropped=self.metrics.prefix_payloads_dropped,
        )
        return TrackerObserver(self.tracker)

    def name(self, observer: str, process_id: str) -> None:
        """Name this process once its address is known: ``observer`` its health reports,
        ``process_id`` (unique across hosts) its prefix export and session-move notices;
        the options' ``observer_id`` names all three when set."""
        if self.reporter is not None and not self.options.observer_id:
            self.reporter.observer = observer
        self.moves.gateway_id = self.options.observer_id or process_id
        if self.exporter is not None:
            self.exporter.gateway_id = self.options.observer_id or process_id

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
        self.resolver.sessions_moved_off(region)

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
        source = f"pools/{region} from {members.agent}" if members else "the topology"
        log.info(
            "region %s replicas (%s): %s",
            region,
            source,
            ", ".join(replicas) or "none (requests get 503 until one is ACTIVE)",
        )

    async def supervise(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.routing.run(), name="routing-watch")
            tg.create_task(self.pool_cache.run(), name="pools-watch")
            tg.create_task(self.degradation.run(), name="degradation-watch")
            tg.create_task(self.resolver.run(), name="pin-reconcile")
            tg.create_task(self.moves.run(), name="session-moves")
            if self.replica_load is not None:
                tg.create_task(self.replica_load.run(), name="replica-load")
            if self.capacity is not None:
                tg.create_task(self.capacity.run(), name="capacity-watch")
                tg.create_task(self.capacity.rechecks(), name="capacity-recheck")
            if self.reporter is not None:
                tg.create_task(self.reporter.run(), name="health-report")
            if self.exporter is not None:
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
        if self.reporter is not None:
            await self.reporter.close()
        if self._own_store:
            await self.store.close()
