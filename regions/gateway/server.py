"""A running gateway: the data plane's core (``regions/dataplane/core.py``: etcd
store, routing cache, session resolver, pools, degradation and spec watches, health
reports, prefix tracking), the HTTP server, and the background tasks behind them,
started and stopped as one.

Start-up waits for the first full read of ``routing/`` and ``pools/``; after that, etcd
being down only means serving from the caches. ``degradation/`` is followed too (the
actuators read the serving region's flags), but start-up does not wait for it: no
record means nothing is degraded. Shutdown is graceful: ``/health`` turns 503, the
listener closes, requests in flight get ``grace_s`` to finish, then the background
tasks stop.

The cluster spec is checked at start (a disagreement refuses to serve) and followed
after (``regions/dataplane/spec_watch.py``): a spec published later that disagrees makes ``wait()``
raise SpecDisagreement, for the caller to stop the gateway.

Warm first (``warmth.py``, on unless ``AppConfig.warm_first`` is off) places a new
session on a target warm for its prompt while routing splits its home.

Admission control (``regions/dataplane/admission_gate.py``, off unless
``GatewayOptions.admission`` is enabled) bounds what each replica holds at once and
answers 429 beyond it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from aiohttp import web

from controlplane.kernel.store.port import Store
from regions.dataplane.admission_gate import Gates
from regions.dataplane.core import SPEC_SECTIONS, DataPlaneCore
from regions.dataplane.observe import PrefixObserver
from regions.gateway.app import GatewayApp
from regions.gateway.metrics import GatewayMetrics
from regions.gateway.options import GatewayOptions, completed_app
from regions.gateway.proxy import Forwarder, new_pool
from regions.gateway.warmth import RegionWarmth, WarmUps

log = logging.getLogger("tectonic.gateway")
__all__ = ["SPEC_SECTIONS", "GatewayOptions", "GatewayServer"]


class GatewayServer:
    def __init__(
        self,
        options: GatewayOptions,
        *,
        store: Store | None = None,
        observer: PrefixObserver | None = None,
    ) -> None:
        self.options = options
        self.metrics = GatewayMetrics(options.topology.spill_groups())
        self.core = core = DataPlaneCore(
            options, store=store, observer=observer, metrics=self.metrics
        )
        # the parts callers and tests reach for, by their old names
        self.keys, self.store = core.keys, core.store
        self.routing, self.sessions, self.moves = core.routing, core.sessions, core.moves
        self.resolver, self.balancers = core.resolver, core.balancers
        self.pool_cache, self.degradation = core.pool_cache, core.degradation
        self.spec_watch, self.reporter = core.spec_watch, core.reporter
        self.tracker, self.exporter = core.tracker, core.exporter
        self.pool = new_pool(options.proxy)
        vote = self.reporter.record  # a no-op when health reports are off
        # per-replica in-flight limits (AdmissionOff: off)
        self.admission: Gates = core.admission
        self.forwarder = Forwarder(
            self.pool,
            self.balancers,
            self.metrics,
            options.proxy,
            on_attempt=vote,
            admission=self.admission,
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
        app_config = completed_app(options)
        self.warm_ups: WarmUps | None = None
        if app_config.warm_first:
            warmth = RegionWarmth()
            self.warm_ups = WarmUps(
                warmth,
                self.pool,
                self.balancers,
                self.metrics,
                strip_headers=options.topology.prefixes.replay_strip_headers,
                api_key=options.replay_api_key,
            )
            self.routing.listeners.append(self.warm_ups.routing_changed)
        self.app = GatewayApp(
            app_config,
            self.routing,
            core.resolvers,
            self.forwarder,
            self.metrics,
            core.observer,
            flags=self.degradation.flags,
            warm_ups=self.warm_ups,
            tokenizer_forwarder=tokenizer_forwarder,
            waker=core.waker,
        )
        self.runner: web.ServerRunner | None = None  # built in start: needs the loop
        self.port = 0
        self._task: asyncio.Task[None] | None = None
        self._spec_task: asyncio.Task[None] | None = None  # ends only on a disagreement
        self._stopped = False

    @property
    def url(self) -> str:
        return f"http://{self.options.listen.rsplit(':', 1)[0]}:{self.port}"

    async def start(self) -> None:
        """Start the background tasks, wait for the first routing and pools reads, check
        the topology against the cluster spec (SpecDisagreement), then listen."""
        self._task = asyncio.create_task(self.core.supervise(), name="gateway")
        await self.core.wait_loaded(self._task)
        await self.core.check_spec()
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
        home = self.options.app.home
        self.core.name(
            f"gateway:{home}:{self.port}", f"gateway:{home}:{socket.gethostname()}:{self.port}"
        )
        # Beside the task group, not in it: a disagreement must not cancel the caches
        # that the requests in flight use while the gateway drains.
        self._spec_task = asyncio.create_task(self.spec_watch.run(), name="spec-watch")
        log.info(
            "gateway for home region %s serving on %s (routing revision %d)",
            self.options.app.home,
            self.url,
            self.routing.revision,
        )

    async def wait(self) -> None:
        """Until the background tasks end (they only end by failing or on stop), or the
        cluster spec in etcd turns to one this topology disagrees with: then raises
        SpecDisagreement, and the caller stops the gateway (``__main__`` exits 2)."""
        assert self._task is not None
        await self.core.first_ended(self._spec_task, self._task)

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
        await self.core.close()
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
