"""A running gateway: etcd store, routing cache, session resolver, HTTP server, and the
background tasks behind them, started and stopped as one.

Start-up waits for the first full read of ``routing/`` and ``pools/`` (a gateway that
does not know where traffic goes must not guess); after that, etcd being down only
means serving from the caches. A region whose agent runs a warm pool routes to the
ACTIVE replicas in ``pools/<r>`` (its WARM ones sleep); any other region to the
topology's ``regions[].replicas``. ``degradation/`` is followed too (the actuators read
the serving region's flags), but start-up does not wait for it: no record means nothing
is degraded. Shutdown is graceful: ``/health`` turns 503, the listener closes, requests
in flight get ``grace_s`` to finish, then the background tasks stop.

Sessions this gateway spills off a region are announced in ``session-moves/``, and
the other gateways' announcements make this one re-read its cached pins of that
region (``session_moves.py``).

The cluster spec is checked at start (a disagreement refuses to serve) and followed
after (``spec_watch.py``): a spec published later that disagrees makes ``wait()``
raise SpecDisagreement, for the caller to stop the gateway.

Warm first (``warmth.py``, on unless ``AppConfig.warm_first`` is off) places a new
session on a target warm for its prompt while routing splits its home.

Unless turned off, a ``PrefixTracker`` counts every request's prompt and a
``PrefixExporter`` ships its export to etcd for the leader (``prefix_export``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass, field, replace

from aiohttp import web

from controlplane.kernel.clock import SystemClock
from controlplane.kernel.cluster_spec import cluster_spec
from controlplane.kernel.config import EtcdConfig, Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool_members import PoolMembers
from controlplane.kernel.prefix_tracker import PrefixTracker, TrackerConfig
from controlplane.kernel.session_store import SessionStore
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import Store, StoreError
from regions.gateway.app import AppConfig, GatewayApp
from regions.gateway.degradation_cache import DegradationCache
from regions.gateway.metrics import GatewayMetrics
from regions.gateway.observe import PrefixObserver, TrackerObserver
from regions.gateway.pool_cache import PoolCache
from regions.gateway.prefix_export import ExportOptions, PrefixExporter, tracker_config
from regions.gateway.proxy import Forwarder, ProxyConfig, new_pool
from regions.gateway.replicas import DEFAULT_LOAD_FACTOR, ReplicaBalancer
from regions.gateway.report import HealthReporter
from regions.gateway.routing_cache import RoutingCache
from regions.gateway.session_moves import SessionMovesBoard
from regions.gateway.sessions import SessionResolver
from regions.gateway.spec_watch import SpecWatch
from regions.gateway.warmth import RegionWarmth, WarmUps

log = logging.getLogger("tectonic.gateway")

# What a gateway checks against the cluster spec: what it routes and counts by (the
# recovery pace is the control plane's, and may come from its ladder file).
SPEC_SECTIONS = ("regions", "prefixes")


@dataclass(frozen=True)
class GatewayOptions:
    topology: Topology
    app: AppConfig
    listen: str = "127.0.0.1:0"
    etcd_endpoints: tuple[str, ...] = ()  # () = the topology's
    etcd_timeout_s: float = 0.5  # per etcd request; the store retries within 2x this
    store_timeout_s: float = 1.0  # how long a request waits for etcd before fail-static
    revalidate_s: float = 300.0  # re-read a cached pin this often (also extends its TTL)
    max_pins: int = 100_000
    load_factor: float = DEFAULT_LOAD_FACTOR
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    session_ttl_s: int = 3600
    grace_s: float = 5.0
    control_planes: tuple[str, ...] = ()  # report region health as a GATEWAY observer
    observer_id: str = ""  # default: gateway:<home>:<port>; also names the prefix export
    report_interval_s: float = 1.0
    prefix_tracking: bool = True  # count prompt prefixes and export them for pre-warm
    tracker: TrackerConfig | None = None  # None: from the topology's ``prefixes``
    prefix_export: ExportOptions | None = None  # None: from the topology's ``prefixes``

    def etcd(self) -> EtcdConfig:
        endpoints = self.etcd_endpoints or self.topology.etcd.endpoints
        # The topology's etcd TLS / auth settings carry over; only these two are flags.
        return self.topology.etcd.model_copy(
            update={"endpoints": tuple(endpoints), "request_timeout_s": self.etcd_timeout_s}
        )

    def tracker_config(self) -> TrackerConfig:
        return self.tracker or tracker_config(self.topology.prefixes)

    def export_options(self) -> ExportOptions:
        return self.prefix_export or ExportOptions.from_topology(self.topology.prefixes)


def _app_config(options: GatewayOptions) -> AppConfig:
    """The app's settings, completed from the topology: its prefix length (which must
    agree), its zones and the context cap's characters per token."""
    topo = options.topology
    app_config = options.app
    chars = topo.prefixes.routing_chars
    if app_config.prefix_chars not in (None, chars):
        # The agents' pre-warm replays each prefix where this value sends it.
        raise ValueError(
            f"prefix_chars {app_config.prefix_chars} disagrees with the topology's "
            f"prefixes.routing_chars ({chars}), which every gateway and the agents' "
            "pre-warm use"
        )
    app_config = replace(app_config, prefix_chars=chars)
    if not app_config.zones:  # the topology's zones bound where requests may spill
        app_config = replace(app_config, zones={r.name: r.zone for r in topo.regions})
    if app_config.actuators.chars_per_token is None:
        # The context cap estimates tokens with the prefix proxy's calibrated ratio.
        ratio = topo.prefixes.chars_per_token
        actuators = replace(app_config.actuators, chars_per_token=ratio)
        app_config = replace(app_config, actuators=actuators)
    return app_config


class GatewayServer:
    def __init__(
        self,
        options: GatewayOptions,
        *,
        store: Store | None = None,
        observer: PrefixObserver | None = None,
    ) -> None:
        topo = options.topology
        if options.app.home not in topo.names:
            raise ValueError(
                f"home region {options.app.home!r} is not in the topology "
                f"(regions: {', '.join(topo.names)})"
            )
        self.options = options
        self.keys = Keys(topo.cluster)
        self.store: Store = store or EtcdStore(options.etcd())
        self._own_store = store is None
        self.metrics = GatewayMetrics({r.name: r.zone for r in topo.regions})
        self.routing = RoutingCache(self.store, self.keys)
        self.sessions = SessionStore(
            self.store,
            self.keys,
            regions=topo.names,
            clock=SystemClock(),
            ttl_s=options.session_ttl_s,
            writer="gateway",
        )
        # spills: tell the other gateways, and hear theirs (session_moves.py)
        self.moves = SessionMovesBoard(self.store, self.keys, self._sessions_moved_off)
        self.resolver = SessionResolver(
            self.sessions,
            self.routing,
            options.app.home,
            self.metrics,
            max_pins=options.max_pins,
            revalidate_s=options.revalidate_s,
            store_timeout_s=options.store_timeout_s,
            on_moved=self.moves.moved,
        )
        self.balancers = {
            r.name: ReplicaBalancer(r.replicas, load_factor=options.load_factor)
            for r in topo.regions
        }
        self.pool_cache = PoolCache(self.store, self.keys, self._pool_changed)
        self.degradation = DegradationCache(self.store, self.keys)
        self.spec_watch = SpecWatch(
            self.store, self.keys, cluster_spec(options.topology), SPEC_SECTIONS
        )
        self.pool = new_pool(options.proxy)
        self.reporter: HealthReporter | None = None
        if options.control_planes:
            self.reporter = HealthReporter(
                options.control_planes,
                options.observer_id,
                interval_s=options.report_interval_s,
                security=options.topology.security,
            )
        vote = self.reporter.record if self.reporter else None
        self.forwarder = Forwarder(
            self.pool, self.balancers, self.metrics, options.proxy, on_attempt=vote
        )
        # /tokenize, /detokenize: the same replicas, counts and votes, but no first token
        tokenizer_forwarder = Forwarder(
            self.pool,
            self.balancers,
            self.metrics,
            options.proxy,
            on_attempt=vote,
            time_first_byte=False,
        )
        self.tracker: PrefixTracker | None = None
        self.exporter: PrefixExporter | None = None
        if observer is None and options.prefix_tracking:
            observer = self._track_prefixes()
        app_config = _app_config(options)
        self.warm_ups: WarmUps | None = None
        if app_config.warm_first:
            warmth = RegionWarmth()
            self.warm_ups = WarmUps(warmth, self.pool, self.balancers, self.metrics)
            self.routing.listeners.append(self.warm_ups.routing_changed)
        self.app = GatewayApp(
            app_config,
            self.routing,
            self.resolver,
            self.forwarder,
            self.metrics,
            observer,
            flags=self.degradation.flags,
            warm_ups=self.warm_ups,
            tokenizer_forwarder=tokenizer_forwarder,
        )
        self.runner: web.ServerRunner | None = None  # built in start: needs the loop
        self.port = 0
        self._task: asyncio.Task[None] | None = None
        self._spec_task: asyncio.Task[None] | None = None  # ends only on a disagreement
        self._stopped = False

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
                "leader will skip this gateway's exports",
                self.tracker.params,
                self.tracker.config.min_sessions,
                shared.params,
                shared.min_sessions,
            )
        self.exporter = PrefixExporter(
            self.store, self.keys, self.tracker, options.export_options()
        )
        return TrackerObserver(self.tracker)

    @property
    def url(self) -> str:
        return f"http://{self.options.listen.rsplit(':', 1)[0]}:{self.port}"

    async def start(self) -> None:
        """Start the background tasks, wait for the first routing and pools reads, check
        the topology against the cluster spec (SpecDisagreement), then listen."""
        self._task = asyncio.create_task(self._supervise(), name="gateway")
        waiter = asyncio.create_task(self._loaded())
        while not waiter.done():
            done, _ = await asyncio.wait(
                {waiter, self._task}, timeout=5.0, return_when=asyncio.FIRST_COMPLETED
            )
            if self._task in done:
                waiter.cancel()
                await self._task  # raises what stopped it
                raise RuntimeError("gateway tasks ended before routing was read")
            if not done:
                log.warning(
                    "waiting for etcd (%s) to read routing/ and pools/ before serving",
                    ", ".join(self.options.etcd().endpoints),
                )
        await self._check_spec()
        self.runner = web.ServerRunner(
            self.app.server(),
            access_log=None,
            shutdown_timeout=self.options.grace_s,
            handle_signals=False,
        )
        await self.runner.setup()
        host, _, port = self.options.listen.rpartition(":")
        site = web.TCPSite(self.runner, host, int(port), reuse_address=True, backlog=1024)
        await site.start()
        self.port = int(self.runner.addresses[0][1])
        if self.reporter is not None and not self.options.observer_id:
            self.reporter.observer = f"gateway:{self.options.app.home}:{self.port}"
        # unique across hosts: an export per gateway, and who moved sessions
        gateway_id = self.options.observer_id or (
            f"gateway:{self.options.app.home}:{socket.gethostname()}:{self.port}"
        )
        self.moves.gateway_id = gateway_id
        if self.exporter is not None:
            self.exporter.gateway_id = gateway_id
        # Beside the task group, not in it: a disagreement must not cancel the caches
        # that the requests in flight use while the gateway drains.
        self._spec_task = asyncio.create_task(self.spec_watch.run(), name="spec-watch")
        log.info(
            "gateway for home region %s serving on %s (routing revision %d)",
            self.options.app.home,
            self.url,
            self.routing.revision,
        )

    async def _check_spec(self) -> None:
        """Refuse to serve (SpecDisagreement, naming each setting) with a topology whose
        regions or prefixes settings differ from the cluster spec the leader published:
        its exports would be skipped, or warmed prefixes routed to cold replicas.
        Without a spec (no leader has run yet), or when it cannot be read, warn and go on
        (the spec watch checks again once it can)."""
        with contextlib.suppress(StoreError):  # warned; serving from the caches is fine
            await self.spec_watch.check()

    async def _loaded(self) -> None:
        await self.routing.loaded.wait()
        await self.pool_cache.loaded.wait()

    def _sessions_moved_off(self, region: str) -> None:
        self.resolver.sessions_moved_off(region)

    def _pool_changed(self, region: str, members: PoolMembers | None) -> None:
        """A pooled region routes to its ACTIVE replicas; without a pool entry, to the
        topology's. The balancer is replaced (the Forwarder reads the same dict):
        in-flight counts restart at 0, also for replicas that stay, and requests in
        flight release on the balancer they started on; both are harmless."""
        current = self.balancers.get(region)
        if current is None:  # not a region of this topology: nothing routes there
            return
        static = self.options.topology.region(region).replicas
        replicas = tuple(dict.fromkeys(members.active)) if members is not None else static
        if set(replicas) == set(current.replicas):  # the ring ignores order
            return  # e.g. only the WARM count or the timestamp changed
        self.balancers[region] = ReplicaBalancer(replicas, load_factor=self.options.load_factor)
        source = f"pools/{region} from {members.agent}" if members else "the topology"
        log.info(
            "region %s replicas (%s): %s",
            region,
            source,
            ", ".join(replicas) or "none (requests get 503 until one is ACTIVE)",
        )

    async def _supervise(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.routing.run(), name="routing-watch")
            tg.create_task(self.pool_cache.run(), name="pools-watch")
            tg.create_task(self.degradation.run(), name="degradation-watch")
            tg.create_task(self.resolver.run(), name="pin-reconcile")
            tg.create_task(self.moves.run(), name="session-moves")
            if self.reporter is not None:
                tg.create_task(self.reporter.run(), name="health-report")
            if self.exporter is not None:
                tg.create_task(self.exporter.run(), name="prefix-export")

    async def wait(self) -> None:
        """Until the background tasks end (they only end by failing or on stop), or the
        cluster spec in etcd turns to one this topology disagrees with: then raises
        SpecDisagreement, and the caller stops the gateway (``__main__`` exits 2)."""
        assert self._task is not None
        tasks = [t for t in (self._spec_task, self._task) if t is not None]
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:  # the spec's first: the reason to name
            if task in done and not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self._stop_following_spec()
        self.app.stopping = True
        if self.runner is not None:
            with contextlib.suppress(Exception):
                await self.runner.cleanup()  # stop listening, let requests in flight finish
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
        if self.warm_ups is not None:
            await self.warm_ups.close()
        self.pool.close()
        if self.reporter is not None:
            await self.reporter.close()
        if self._own_store:
            await self.store.close()
        log.info("gateway stopped")

    async def _stop_following_spec(self) -> None:
        """A stopping gateway has nothing left to check."""
        task = self._spec_task
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: the watch logged its disagreement already
