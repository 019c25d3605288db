"""One control-plane replica: election, reconcile loop, agent prober, gRPC and HTTP APIs.

Every replica serves the APIs; only the leader probes agents, acts, and merges the
gateways' prefix exports into ``prefixes/<region>`` (``prefix_aggregator``). Health
(``grpc.health.v1``, and HTTP ``/readyz``) is SERVING while the loop makes progress
and NOT_SERVING when it stalls or the replica shuts down. The HTTP API (optional,
``http_listen``) runs on uvicorn in the same event loop, supervised like the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Generator
from dataclasses import dataclass, field

import grpc
import uvicorn
from fastapi import FastAPI
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tectonic_api.v1 import controlplane_pb2, controlplane_pb2_grpc

from controlplane.agent_prewarm import AgentPrewarmer
from controlplane.api.grpc_service import ControlPlaneService
from controlplane.api.http import create_http_app
from controlplane.api.http_auth import check_bind, http_auth_on
from controlplane.api.keda_scaler import KedaScaler, add_keda_scaler
from controlplane.api.reads import Reads
from controlplane.cluster import Cluster
from controlplane.compactor import Compactor
from controlplane.election import LeaderElection
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.cluster_spec import cluster_spec
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.file import recovery_config
from controlplane.kernel.ladder.model import Ladder
from controlplane.kernel.rpc.auth import AuthInterceptor
from controlplane.kernel.rpc.decode_guard import DecodeGuard
from controlplane.kernel.rpc.reflection import enable_reflection
from controlplane.kernel.rpc.tls import server_credentials
from controlplane.kernel.security import SecurityConfig
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.store.port import Store
from controlplane.loop import ReconcileLoop
from controlplane.metrics import ControlPlaneMetrics
from controlplane.orchestrator import Orchestrator
from controlplane.prefix_aggregator import PrefixAggregator
from controlplane.prewarm import Prewarmer
from controlplane.probe import AgentProber

log = logging.getLogger("tectonic.server")

SERVICE_NAME = controlplane_pb2.DESCRIPTOR.services_by_name["ControlPlane"].full_name
MAX_MESSAGE_BYTES = 64 * 1024  # requests are small; anything bigger is refused
HTTP_DRAIN_S = 0.5  # on shutdown, /readyz answers 503 this long before the listener closes
HTTP_MAX_CONNECTIONS = 128  # beyond this uvicorn answers 503
HTTP_MAX_HEADER_BYTES = 16 * 1024


@dataclass
class ControlPlaneReplica:
    topology: Topology
    store: Store
    replica_id: str
    listen: str = "127.0.0.1:0"
    clock: Clock = field(default_factory=SystemClock)
    probe_agents: bool = True
    prewarmer: Prewarmer | None = None
    http_listen: str | None = None  # host:port (port 0: any free one); None: no HTTP API
    ladder: Ladder | None = None  # the degradation ladder; None: no degradation steps
    # With security.tokens: /metrics needs a token too (else only /healthz, /readyz, /metrics
    # are open). Without a security: section, a non-loopback http_listen is refused unless
    # insecure_listen_any (controlplane/api/http_auth.py).
    http_metrics_auth: bool = False
    insecure_listen_any: bool = False

    port: int = 0
    http_port: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if self.ladder is not None:
            # The ladder file is the source of truth for recovery's pace too
            # (docs/architecture.md §5).
            pace = recovery_config(self.ladder, self.topology.recovery)
            if pace != self.topology.recovery and "recovery" in self.topology.model_fields_set:
                log.warning(
                    "recovery pace from the degradation ladder (%g %% every %gs) overrides "
                    "the topology's recovery section",
                    pace.step_percent,
                    pace.step_interval_s,
                )
            self.topology = self.topology.model_copy(update={"recovery": pace})
        self.keys = Keys(self.topology.cluster)
        self.metrics = ControlPlaneMetrics(self.topology.names, self.topology)
        self.stopping = asyncio.Event()
        t = self.topology
        self.election = LeaderElection(
            self.store, self.keys.leader(), self.replica_id, t.timing.lease_ttl_s
        )
        pre = self.prewarmer or AgentPrewarmer(
            t,
            self.store,
            self.keys,
            self.clock,
            min_sessions=t.prefixes.min_sessions,
            fraction=t.prewarm.top_fraction,
            verify=t.prewarm.verify,
        )
        self.sessions = SessionStore(
            self.store,
            self.keys,
            regions=t.names,
            clock=self.clock,
            writer=f"sessions-{self.replica_id}",
        )
        self.prefixes = PrefixAggregator(
            self.store,
            self.keys,
            t.prefixes,
            self.clock,
            self.election.fence,
            regions=t.names,
            on_written=self.metrics.catalog_written,
        )
        self.orchestrator = Orchestrator(
            Cluster(self.store, self.keys, t, self.clock),
            self.election.fence,
            pre,
            self.replica_id,
            observer=self.metrics,
            catalogs=self.prefixes,
        )
        self.prober = AgentProber(t, self.clock) if self.probe_agents else None
        self.loop = ReconcileLoop(
            self.orchestrator,
            self.election,
            prober=self.prober,
            observer=self.metrics,
            ladder=self.ladder,
            spec=cluster_spec(t, self.ladder),
        )
        self.compactor = Compactor(
            self.store,
            self.keys,
            t.etcd,
            lambda: self.election.is_leader,
            on_compacted=self.metrics.compacted,
        )
        self.health = health.aio.HealthServicer()
        self.reads = Reads(
            self.store,
            self.keys,
            t,
            self.clock,
            self.replica_id,
            lambda: self.election.is_leader,
            store_writes=lambda: self.loop.writes.view(),
        )

    def not_ready(self) -> str | None:
        """Why this replica should take no traffic now (None: ready)."""
        if self.stopping.is_set():
            return "shutting down"
        if self.loop.stalled():
            ago = time.monotonic() - self.loop.last_progress
            return (
                f"the reconcile loop has made no progress for {ago:.1f}s "
                "(is etcd reachable? see this replica's log)"
            )
        return None

    async def _set_health(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _health_supervisor(self) -> None:
        serving: bool | None = None
        while True:
            now_serving = not self.loop.stalled()
            if now_serving != serving:
                if serving is not None:
                    log.warning(
                        "loop %s: health %s",
                        "recovered" if now_serving else "stalled",
                        "SERVING" if now_serving else "NOT_SERVING",
                    )
                await self._set_health(now_serving)
                serving = now_serving
            await asyncio.sleep(min(1.0, self.topology.timing.loop_period_s))

    async def run(self) -> None:
        server = self._grpc_server()
        http = self._http_server(self.http_listen) if self.http_listen else None  # may refuse
        try:
            await self._set_health(False)
            await server.start()
        except BaseException:
            if http is not None:
                http.close()
            raise
        log.info(
            "replica %s serving gRPC on port %d (cluster %s, %d regions)",
            self.replica_id,
            self.port,
            self.topology.cluster,
            len(self.topology.regions),
        )
        if http is not None:
            http.start()
            log.info(
                "replica %s serving HTTP on http://%s:%d (dashboard /, /metrics, /v1/status, "
                "/docs); %s",
                self.replica_id,
                http.host,
                self.http_port,
                _http_auth_summary(self.topology.security, self.http_metrics_auth),
            )
        self.started.set()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.election.run(), name="election")
                tg.create_task(self.loop.run(), name="reconcile-loop")
                tg.create_task(self.compactor.run(), name="compactor")
                tg.create_task(self._health_supervisor(), name="health")
                if http is not None:
                    tg.create_task(http.supervise(self.stopping), name="http")
        finally:
            await self._shut_down(server, http)

    def _grpc_server(self) -> grpc.aio.Server:
        """The gRPC server with its services, bound to ``listen`` (``port`` set), not
        started: a bad address fails before anything runs."""
        sec = self.topology.security
        server = grpc.aio.server(
            options=[
                (
                    "grpc.max_receive_message_length",
                    sec.limits.max_request_bytes if sec else MAX_MESSAGE_BYTES,
                ),
                ("grpc.so_reuseport", 0),
            ],
            # auth first: an unauthenticated caller learns nothing, not even a parse error
            interceptors=[*([AuthInterceptor(sec)] if sec else []), DecodeGuard()],
        )
        controlplane_pb2_grpc.add_ControlPlaneServicer_to_server(  # type: ignore[no-untyped-call]
            ControlPlaneService(
                self.store,
                self.keys,
                self.topology,
                self.clock,
                self.replica_id,
                lambda: self.election.is_leader,
                sessions=self.sessions,
                reads=self.reads,
                ladder=self.ladder,
            ),
            server,
        )
        # KEDA's external scaler over the scaler's records (docs/keda.md)
        keda = add_keda_scaler(server, KedaScaler(self.store, self.keys, self.topology))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        enable_reflection((SERVICE_NAME, keda, health.SERVICE_NAME), server)
        if sec is not None:
            _log_security(self.replica_id, sec)
        if sec is not None and sec.tls is not None:
            self.port = server.add_secure_port(self.listen, server_credentials(sec.tls))
        else:
            self.port = server.add_insecure_port(self.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        return server

    async def _shut_down(self, server: grpc.aio.Server, http: _EmbeddedHttp | None) -> None:
        """Not ready first (/readyz 503, health NOT_SERVING, event streams end), then stop
        acting and hand leadership over, then close the listeners: HTTP after its drain,
        so that load balancers notice."""
        log.info("replica %s shutting down", self.replica_id)
        self.stopping.set()  # /readyz answers 503 and event streams end, first
        draining_until = time.monotonic() + HTTP_DRAIN_S
        await self._set_health(False)
        await self.loop.stop_probe()
        await self.orchestrator.stop_failovers()
        with contextlib.suppress(Exception):
            await asyncio.shield(self.election.resign())
        if http is not None:
            await http.stop(after=draining_until - time.monotonic())
        await server.stop(grace=1.0)
        if self.prober is not None:
            await self.prober.close()

    # ---- HTTP ------------------------------------------------------------------------
    def _http_server(self, listen: str) -> _EmbeddedHttp:
        """Bound now, so that errors surface before the replica reports started and
        port 0 is resolved; served from ``run``. Refuses (InsecureListen) a non-loopback
        address without a ``security:`` section unless ``insecure_listen_any``."""
        sec = self.topology.security
        check_bind(listen, sec, self.insecure_listen_any)
        if self.http_metrics_auth and not http_auth_on(sec):
            log.warning("--http-metrics-auth has no effect: the topology has no security.tokens")
        http = _EmbeddedHttp(
            create_http_app(
                self.reads,
                not_ready=self.not_ready,
                metrics=lambda: self.metrics.scrape(
                    leader=self.election.is_leader, writable=self.loop.writes.writable
                ),
                stopping=self.stopping,
                security=sec,
                metrics_auth=self.http_metrics_auth,
            ),
            listen,
        )
        self.http_port = http.port
        return http


def _http_auth_summary(sec: SecurityConfig | None, metrics_auth: bool) -> str:
    if not http_auth_on(sec):
        return "no tokens checked"
    open_paths = "/healthz, /readyz" + ("" if metrics_auth else ", /metrics")
    return f"bearer tokens required (open: {open_paths})"


def _log_security(replica_id: str, sec: SecurityConfig) -> None:
    roles = ", ".join(f"{t.name} ({t.role.value})" for t in sec.tokens)
    log.info(
        "replica %s: gRPC %s; tokens: %s; commands limited to %d at once, %g a minute",
        replica_id,
        "mutual TLS"
        if sec.tls and sec.tls.require_client_cert
        else ("TLS" if sec.tls else "plaintext"),
        roles or "off (no role checks)",
        sec.limits.mutating_burst,
        sec.limits.mutating_per_minute,
    )
    if sec.tokens and sec.tls is None:
        log.warning("security.tokens without security.tls: bearer tokens travel in clear text")


class _QuietUvicorn(uvicorn.Server):
    """The process owner handles signals (``python -m controlplane`` cancels the
    replica), so the embedded uvicorn must not take them over."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class _EmbeddedHttp:
    """uvicorn in the replica's event loop, on a socket bound up front."""

    def __init__(self, app: FastAPI, listen: str) -> None:
        self.sock = _bind(listen)
        self.host, self.port = listen.rsplit(":", 1)[0], int(self.sock.getsockname()[1])
        self.server = _QuietUvicorn(
            uvicorn.Config(
                app,
                lifespan="off",
                http="h11",
                ws="none",
                log_config=None,
                access_log=False,
                server_header=False,
                h11_max_incomplete_event_size=HTTP_MAX_HEADER_BYTES,
                limit_concurrency=HTTP_MAX_CONNECTIONS,
                timeout_graceful_shutdown=2,
            )
        )
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]), name="http-server")

    async def supervise(self, stopping: asyncio.Event) -> None:
        """Fails (and so stops the replica) if the server fails. Cancelled, it only
        flags ``stopping``: the server is stopped last, by ``stop``."""
        assert self.task is not None
        try:
            await asyncio.shield(self.task)
        except asyncio.CancelledError:
            stopping.set()
            raise
        raise RuntimeError("the HTTP server stopped on its own")

    async def stop(self, after: float) -> None:
        """Keep answering (readyz: 503) for ``after`` seconds, so that load balancers
        notice, then close the listener and wait for open responses to finish."""
        if self.task is None or self.task.done():
            self.close()
            return
        await asyncio.sleep(max(0.0, after))
        self.server.should_exit = True
        await asyncio.wait((self.task,))

    def close(self) -> None:
        self.sock.close()


def _bind(listen: str) -> socket.socket:
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise OSError(f"cannot listen for HTTP on {listen!r}: expected host:port")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, int(port)), family=family)
    except OSError as e:
        raise OSError(f"cannot listen for HTTP on {listen}: {e}") from e
