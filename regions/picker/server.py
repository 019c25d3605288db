"""A running endpoint picker: the data plane's core (``regions/dataplane/core.py``, the
same caches and watches as a gateway), the ext_proc gRPC server with its health
services, and a small HTTP server for ``/metrics`` and ``/health``.

Active-active: pickers share nothing but etcd, so any number can serve one Envoy, and
one that restarts reads its pins from etcd at its first request. Readiness
(``readiness``, ``envoy.service.ext_proc.v3.ExternalProcessor`` and the overall
``""``) is SERVING once this replica's caches have had their first full read of
``routing/`` and ``pools/``, whatever other replicas do; ``liveness`` is SERVING while
the process answers. On stop every service turns NOT_SERVING first, so that Envoy's
health checks move new requests to the other replicas while the ones in flight finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from dataclasses import dataclass, replace

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controlplane.kernel.rpc.reflection import enable_reflection
from controlplane.kernel.store.port import Store
from regions.dataplane.admission import Admission
from regions.dataplane.core import DataPlaneCore
from regions.dataplane.metrics import CONTENT_TYPE
from regions.dataplane.models import pool_sites
from regions.dataplane.observe import PrefixObserver
from regions.dataplane.options import DataPlaneOptions, completed
from regions.dataplane.scrape import OffLoopRender
from regions.picker.extproc import BODY_BUFFERED
from regions.picker.pick import Picker, PickerConfig
from regions.picker.service import MAX_MESSAGE_TIMEOUT_S, ExtProcService

log = logging.getLogger("tectonic.picker")
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS, READINESS = "liveness", "readiness"  # the protocol's health service names


@dataclass(frozen=True)
class PickerOptions:
    routing: DataPlaneOptions  # what it shares with the gateway
    listen: str = "127.0.0.1:9002"  # ext_proc gRPC (h2c)
    http_listen: str = "127.0.0.1:0"  # /metrics, /health
    body_mode: int = BODY_BUFFERED  # when Envoy does not say in protocol_config
    picker: PickerConfig | None = None  # None: from the topology (zones, entry points)
    grace_s: float = 5.0
    # Envoy's ext_proc max_message_timeout: the longest wait the picker asks of Envoy
    # while it holds a request for a pool at zero
    max_message_timeout_s: float = MAX_MESSAGE_TIMEOUT_S


class PickerServer:
    def __init__(
        self,
        options: PickerOptions,
        *,
        store: Store | None = None,
        observer: PrefixObserver | None = None,
    ) -> None:
        self.options = options
        routing = options.routing
        topo = routing.topology
        app = completed(routing.app, topo)
        self.core = core = DataPlaneCore(routing, store=store, observer=observer, kind="picker")
        self._scrape = OffLoopRender(core.metrics.render)
        actuators = replace(app.actuators, priority_header=app.actuators.priority_header.lower())
        self.admission = Admission(
            core.resolvers,
            core.metrics,
            core.degradation.flags,
            chars=topo.prefixes.routing_chars,
            session_header=app.session_header.lower(),
            actuators=actuators,
        )
        sites, local = pool_sites(topo, app.home)  # with model pools (docs/models.md)
        config = options.picker or PickerConfig(
            home=app.home,
            zones=dict(app.zones),
            entries={r.name: r.entry for r in topo.regions if r.entry},
            sites=sites,
            local=local,
        )
        self.picker = Picker(
            config,
            self.admission,
            core.routing,
            core.resolvers,
            core.balancers,
            core.metrics,
            observer=core.observer,
            vote=core.reporter.record,  # a no-op when health reports are off
            gates=core.admission,
            waker=core.waker,
        )
        self.service = ExtProcService(
            self.picker,
            default_body_mode=options.body_mode,
            max_body_bytes=app.max_body_bytes,
            max_message_timeout_s=options.max_message_timeout_s,
        )
        self.health = health.aio.HealthServicer()
        self.grpc: grpc.aio.Server | None = None
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.http_port = 0
        self._task: asyncio.Task[None] | None = None
        self._spec_task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def address(self) -> str:
        return f"{self.options.listen.rsplit(':', 1)[0]}:{self.port}"

    @property
    def url(self) -> str:  # what READY prints: the ext_proc address
        return f"grpc://{self.address}"

    @property
    def http_url(self) -> str:
        return f"http://{self.options.http_listen.rsplit(':', 1)[0]}:{self.http_port}"

    async def start(self) -> None:
        """Listen at once (liveness SERVING, readiness NOT_SERVING), then wait for the
        first routing and pools reads and check the cluster spec; then ready."""
        await self._set_ready(False)
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_ExternalProcessorServicer_to_server(self.service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        enable_reflection((EXT_PROC_SERVICE, health.SERVICE_NAME), server)
        self.port = server.add_insecure_port(self.options.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.options.listen}")
        await server.start()
        self.grpc = server
        await self._start_http()
        home = self.options.routing.app.home
        self.core.name(
            f"picker:{home}:{self.port}", f"picker:{home}:{socket.gethostname()}:{self.port}"
        )
        self._task = asyncio.create_task(self.core.supervise(), name="picker")
        await self.core.wait_loaded(self._task)
        await self.core.check_spec()
        self._spec_task = asyncio.create_task(self.core.spec_watch.run(), name="spec-watch")
        await self._set_ready(True)
        log.info(
            "endpoint picker for region %s serving ext_proc on %s (metrics %s; routing "
            "revision %d)",
            home,
            self.address,
            self.http_url,
            self.core.routing.revision,
        )

    async def _set_ready(self, ready: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in (READINESS, EXT_PROC_SERVICE, ""):
            await self.health.set(name, status)

    async def _start_http(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        host, _, port = self.options.http_listen.rpartition(":")
        site = web.TCPSite(self.runner, host, int(port), reuse_address=True)
        await site.start()
        self.http_port = int(self.runner.addresses[0][1])

    async def _metrics(self, request: web.Request) -> web.Response:
        metrics = self.core.metrics
        metrics.routing_revision.set(self.core.routing.revision)
        # in a thread, one render shared (regions/dataplane/scrape.py): on the loop, a
        # scrape at 512 pools held every ext_proc answer back for its whole render
        resp = web.Response(body=await self._scrape())
        resp.headers["Content-Type"] = CONTENT_TYPE
        return resp

    async def _health(self, request: web.Request) -> web.Response:
        ready = self.core.routing.loaded.is_set() and self.core.pool_cache.loaded.is_set()
        body = {
            "status": "stopping" if self._stopped else ("serving" if ready else "starting"),
            "home": self.options.routing.app.home,
            "routing_revision": self.core.routing.revision,
            "routing_connected": self.core.routing.connected,
            "store_up": all(r.store_up for r in self.core.resolvers),
            "pending_pins": sum(r.pending for r in self.core.resolvers),
        }
        status = 200 if ready and not self._stopped else 503
        return web.Response(status=status, text=json.dumps(body), content_type="application/json")

    async def wait(self) -> None:
        """Until the background tasks end (by failing), or the cluster spec turns to
        one this topology disagrees with (raises SpecDisagreement)."""
        assert self._task is not None
        await self.core.first_ended(self._spec_task, self._task)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(Exception):
            await self._set_ready(False)
        if self.grpc is not None:  # streams in flight finish, on the caches still running
            await self.grpc.stop(self.options.grace_s)
        for task in (self._spec_task, self._task):
            if task is not None:
                task.cancel()
        if self.runner is not None:
            with contextlib.suppress(Exception):
                await self.runner.cleanup()
        for task in (self._spec_task, self._task):
            if task is not None:
                await asyncio.wait({task})
                if not task.cancelled():
                    task.exception()  # retrieved: logged where it failed
        await self.picker.close()
        await self.core.close()
        log.info("endpoint picker stopped")
