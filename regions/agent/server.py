"""The region agent (v0): probes its vLLM replicas, serves gRPC health, reports upward.

Every ``interval`` the agent probes each replica (``/health`` + ``/metrics``, see
:mod:`regions.agent.probe_vllm`), folds the results into a region view with the pure
:func:`fold_verdict`, publishes it on ``grpc.health.v1`` (services ``""`` and
``tectonic.v1.RegionAgent``: SERVING unless the region is UNHEALTHY) and pushes it
to the control plane as a ``ReportHealth`` (kind AGENT, observer ``agent:<region>``),
trying the listed control-plane endpoints in turn. An unreachable control plane is
logged (at most every ``warn_every`` seconds), never fatal.

The DEGRADED thresholds are not the agent's own: they live in the topology
(``regions[].degraded_when``) and the control plane sends its region's in the answer
to every report. The agent judges by those of the last answer from its next probe
round on; before the first one it judges with none (HEALTHY or UNHEALTHY only, and
DEGRADED for a replica down).

    tectonic-agent --region eu --listen 127.0.0.1:7001 --control-plane 127.0.0.1:7000 \\
        --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002

With ``--pool-config FILE --etcd HOST:PORT --cluster NAME`` instead of ``--replica``
the agent runs a warm pool (:mod:`regions.agent.warm_pool`, its file
:mod:`regions.agent.pool_config`, regions/pool/README.md): it
starts the pool before serving, probes the pool's ACTIVE replicas each tick (adding the
signals ``replicas_warm`` and ``pool_shortfall``), reconciles the pool in the
background, wakes WARM replicas for ``Prewarm`` and publishes the ACTIVE set to
``pools/<region>`` in etcd, which gateways route by. Without a pool nothing is
published.

    tectonic-agent --region eu --control-plane 127.0.0.1:7000 \\
        --pool-config pool.yaml --etcd 127.0.0.1:2379 --cluster prod

With ``--discovery kubernetes --kube-namespace NS --kube-service SVC`` the replicas are
the routable endpoints of that Service's EndpointSlices, listed and watched
(:mod:`regions.kube.discovery`); the agent still probes each one itself (``/health``,
``/metrics``) and asks ``/is_sleeping``, since a sleeping vLLM is Ready to the kubelet.
With ``--pool-launcher kubernetes --kube-workload deployment/NAME`` (or a pool file's
``launcher: {kind: kubernetes, ...}``) the warm pool scales that workload and labels its
pods ``tectonic.io/pool-state`` (:mod:`regions.kube.launcher`,
:mod:`regions.kube.pod_labels`; the agent's wiring :mod:`regions.agent.kube_wiring`).
The Kubernetes client is loaded only then.

    tectonic-agent --region eu --control-plane cp:7000 --discovery kubernetes \\
        --kube-namespace models --kube-service vllm-eu --kube-port-name http

With ``--metrics-listen HOST:PORT`` (off by default) it also serves Prometheus
``/metrics`` over HTTP there (:mod:`regions.agent.metrics`): its verdict, each probed
replica up/down and when last probed, reports, the pool's replicas per state and its
activations, pre-warm runs.

In-process (tests, demo): ``handle = await serve_agent(AgentConfig(...))``, then
``handle.view``, ``handle.port``, ``handle.metrics_port`` (with ``metrics_listen``),
``handle.pool`` (with a pool), ``await handle.stop()``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import aiohttp
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic import Field, model_validator
from tectonic_api.v1 import agent_pb2 as apb
from tectonic_api.v1 import agent_pb2_grpc as apb_grpc
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.kernel.config import DegradedWhen
from controlplane.kernel.model import Frozen, Health
from controlplane.kernel.rpc.auth import AuthInterceptor
from controlplane.kernel.rpc.decode_guard import DecodeGuard
from controlplane.kernel.rpc.health_report import (
    HealthReportClient,
    health_to_pb,
    thresholds_from_pb,
)
from controlplane.kernel.rpc.reflection import enable_reflection
from controlplane.kernel.rpc.tls import server_credentials
from controlplane.kernel.security import SecurityConfig
from controlplane.kernel.store.settings import EtcdConfig
from regions.agent.asleep import asleep_since, asleep_view
from regions.agent.engine_version import EngineVersions, refresh_versions
from regions.agent.kube_wiring import (
    KubeDiscoveryConfig,
    check_autoscalers,
    kube_region,
    kubernetes_pods,
)
from regions.agent.metrics import AgentMetrics, MetricsHttp
from regions.agent.pool_config import AgentPoolConfig, check_replica_source
from regions.agent.prewarm_executor import answered_replays
from regions.agent.probe_vllm import ReplicaProbe, probe_replica
from regions.agent.service import (
    PrewarmServiceConfig,
    RegionAgentService,
    ReplicaSet,
    StaticReplicas,
)
from regions.agent.verdict import RegionVerdict, fold_verdict
from regions.agent.warm_pool import AgentPool, PoolPublishing

if TYPE_CHECKING:  # the Kubernetes client loads only for an agent that uses it
    from regions.kube.replicas import KubeRegion

log = logging.getLogger("tectonic.agent")
SERVICE = "tectonic.v1.RegionAgent"
_RANK = {Health.HEALTHY: 0, Health.UNKNOWN: 1, Health.DEGRADED: 2, Health.UNHEALTHY: 3}
POOL_ETCD_TIMEOUT_S = 2.0  # one call publishing the pool: its retries stop after twice this


class AgentConfig(Frozen):
    region: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")
    listen: str = "127.0.0.1:0"
    metrics_listen: str | None = None  # host:port of Prometheus /metrics (port 0: any)
    control_planes: tuple[str, ...] = ()
    replicas: tuple[str, ...] = ()  # static replicas, or else a pool:
    pool: AgentPoolConfig | None = None
    etcd: tuple[str, ...] = ()  # where a pool is published (pools/<region>)
    cluster: str | None = None
    interval: float = Field(1.0, gt=0)
    timeout: float = Field(0.5, gt=0)
    warn_every: float = Field(5.0, ge=0)
    prewarm: PrewarmServiceConfig = PrewarmServiceConfig()
    # TLS for its server and its reports, accepted tokens, its own token (--security).
    security: SecurityConfig | None = None
    # etcd TLS / users for publishing the pool (the --security file's etcd: section)
    etcd_settings: EtcdConfig | None = None
    kube: KubeDiscoveryConfig | None = None  # replicas from a Service's EndpointSlices

    @model_validator(mode="after")
    def _timing(self) -> AgentConfig:
        if self.timeout > self.interval:
            raise ValueError(
                f"timeout ({self.timeout}s) must not exceed interval "
                f"({self.interval}s): a tick must fit in its interval"
            )
        check_replica_source(
            self.replicas, self.pool, self.etcd, self.cluster, discovery=self.kube is not None
        )
        return self

    def pool_etcd(self) -> EtcdConfig:
        """The etcd a pool is published to: TLS and users from ``etcd_settings``, the
        endpoints the agent's ``--etcd``."""
        return (self.etcd_settings or EtcdConfig()).model_copy(
            update={"endpoints": tuple(self.etcd), "request_timeout_s": POOL_ETCD_TIMEOUT_S}
        )


class AgentHandle:
    """A running agent. Build with :func:`serve_agent`; stop with :meth:`stop`."""

    def __init__(
        self,
        config: AgentConfig,
        replica_set: ReplicaSet | None = None,
        prewarm: PrewarmServiceConfig | None = None,
    ) -> None:
        self.config = config
        self.metrics = AgentMetrics(config.region, config.replicas, pool=config.pool is not None)
        self.metrics_port = 0
        self._metrics_http: MetricsHttp | None = None
        self.kube: KubeRegion | None = (
            kube_region(config.kube, config.pool) if config.kube else None
        )
        self.pool: AgentPool | None = None
        if config.pool is not None:
            if replica_set is not None:
                raise ValueError("an agent with a pool serves the pool as its replica set")
            assert config.cluster is not None  # checked by AgentConfig
            self.pool = AgentPool(
                config.region,
                config.pool,
                PoolPublishing(config.cluster, config.pool_etcd()),
                interval_s=config.interval,
                on_activation=self.metrics.activated,
                pods=kubernetes_pods(self.kube),
            )
        self.replica_set: ReplicaSet = replica_set or self._replica_set()
        self.prewarm_config = prewarm or config.prewarm
        self.service: RegionAgentService | None = None
        self.view = RegionVerdict(
            region=config.region, health=Health.UNKNOWN, signals={}, detail="not probed yet"
        )
        self.port = 0
        self.reports_sent = 0
        self.ticks = 0  # completed probe rounds
        self.versions = EngineVersions()  # the replicas' engine (vLLM's /version)
        self.engine_version = ""  # the region's, as the last round read it
        self.serving_config = ""  # the region's serving config's fingerprint, likewise
        # The DEGRADED thresholds in effect: the last ones a control plane sent (None
        # before the first answer: none judged).
        self.thresholds: DegradedWhen | None = None
        self._health = health.aio.HealthServicer()
        sec = config.security
        # Not the control plane's request limit: a Prewarm carries up to a catalog (1 MiB).
        self._server = grpc.aio.server(
            interceptors=[*([AuthInterceptor(sec)] if sec else []), DecodeGuard()]
        )
        self._session: aiohttp.ClientSession | None = None
        self._reporter = HealthReportClient(
            config.control_planes,
            sec,
            log=log,
            timeout_s=config.timeout,
            warn_every_s=config.warn_every,
        )
        self._wake = asyncio.Event()
        self._asleep_since: float | None = None  # monotonic: the pool last at zero on purpose
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def _replica_set(self) -> ReplicaSet:
        if self.pool is not None:
            return self.pool.pool
        if self.kube is not None:
            return self.kube.replicas
        return StaticReplicas(self.config.replicas)

    async def _start(self) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self._session = aiohttp.ClientSession()
        self.service = RegionAgentService(
            self.config.region,
            self.replica_set,
            self._session,
            self.prewarm_config,
            observer=self.metrics,
        )
        apb_grpc.add_RegionAgentServicer_to_server(  # type: ignore[no-untyped-call]
            self.service, self._server
        )
        names = (
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            apb.DESCRIPTOR.services_by_name["RegionAgent"].full_name,
        )
        enable_reflection(names, self._server)
        tls = self.config.security.tls if self.config.security else None
        self.port = (
            self._server.add_secure_port(self.config.listen, server_credentials(tls))
            if tls
            else self._server.add_insecure_port(self.config.listen)
        )
        if not self.port:
            raise OSError(f"cannot listen on {self.config.listen}")
        if self.config.metrics_listen:  # first: a pool's start (launches) can be watched
            await self._serve_metrics(self.config.metrics_listen)
        if self.kube is not None:  # the endpoints known, and watched, before anyone uses them
            await self.kube.start()
            await check_autoscalers(self.kube, self.config.pool)  # no HPA fights the pool
        if self.pool is not None:  # up and ACTIVE before the first probe
            await self.pool.start(f"agent:{self.config.region}@{socket.gethostname()}:{self.port}")
        await self._tick()  # never serve an UNKNOWN view
        await self._server.start()
        self._task = asyncio.create_task(self._supervise(), name=f"agent:{self.config.region}")
        log.info(
            "agent for region %s serving gRPC on port %d; replicas %s; control plane %s",
            self.config.region,
            self.port,
            ", ".join(self._replicas()) or "(none)",
            ", ".join(self.config.control_planes) or "(none)",
        )

    @property
    def report_target(self) -> str | None:
        """The control plane that took the last report (None before the first)."""
        return self._reporter.target

    async def _serve_metrics(self, listen: str) -> None:
        self._metrics_http = MetricsHttp(self.metrics, self._refresh_metrics)
        self.metrics_port = await self._metrics_http.start(listen)
        log.info(
            "agent for region %s serving Prometheus metrics on http://%s:%d/metrics",
            self.config.region,
            listen.rsplit(":", 1)[0],
            self.metrics_port,
        )

    def _refresh_metrics(self) -> None:
        """Before each scrape: the pool's states as they are now."""
        if self.pool is not None:
            self.metrics.pool_snapshot(self.pool.pool.snapshot())

    async def _supervise(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._probe_loop())
                if self._reporter.endpoints:
                    tg.create_task(self._report_loop())
                if self.pool is not None:
                    tg.create_task(self.pool.run())
        finally:
            await self._health.enter_graceful_shutdown()  # a dead loop must not look healthy

    async def _probe_loop(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()  # of the previous tick (the first one ran in _start)
        while True:
            await asyncio.sleep(max(0.0, started + self.config.interval - loop.time()))
            started = loop.time()
            await self._tick()

    async def _tick(self) -> None:
        assert self._session is not None
        c = self.config
        if self.kube is not None and self.pool is None:  # asleep ones are not serving
            await self.kube.replicas.refresh(self._session, c.timeout)
        probes = await asyncio.gather(
            *(probe_replica(self._session, url, c.timeout) for url in self._replicas())
        )
        self._log_replicas(probes)
        await self._read_engine(probes)
        self.metrics.probed(probes)
        self.ticks += 1
        # The previous round's probes (in the view) start the counter-delta windows.
        when = self.thresholds or DegradedWhen()
        view = fold_verdict(
            c.region,
            probes,
            when.queue_over,
            previous=self.view.probes,
            max_ttft_p99_s=when.ttft_p99_over_s,
            max_error_rate=when.error_rate_over,
            before=self.view,  # the served load is smoothed over its window
            sent=answered_replays(),  # our own pre-warm replays are not load
        )
        if self.pool is not None:
            view = view.model_copy(update={"signals": {**view.signals, **self.pool.signals()}})
            view = self._sleep(view, len(probes))
        old, self.view = self.view, view
        self.metrics.viewed(view.health)
        if view.health is not old.health:
            worse = _RANK[view.health] > _RANK[old.health]
            log.log(
                logging.WARNING if worse else logging.INFO,
                "region view %s -> %s (%s)",
                old.health.value,
                view.health.value,
                view.detail,
            )
            status = (
                health_pb2.HealthCheckResponse.NOT_SERVING
                if view.health is Health.UNHEALTHY
                else health_pb2.HealthCheckResponse.SERVING
            )
            for service in ("", SERVICE):
                await self._health.set(service, status)
            self._wake.set()  # report a change at once

    def _sleep(self, view: RegionVerdict, active: int) -> RegionVerdict:
        """Scale to zero (regions/agent/asleep.py): asleep or waking on purpose is not
        down; a wake from zero is counted and timed when the first replica serves."""
        now = time.monotonic()
        last = self._asleep_since
        self._asleep_since = asleep_since(
            last, active, view.signals.get("scale_desired_active"), now
        )
        if last is not None and self._asleep_since is None:
            self.metrics.woke_from_zero(now - last)
            log.info(
                "woke from zero: %d ACTIVE, %.1f s after it was last asleep", active, now - last
            )
        return asleep_view(view, self._asleep_since, now)

    def _replicas(self) -> list[str]:
        """What to probe: the pool's ACTIVE replicas (WARM ones sleep), else the awake
        discovered ones, else the static."""
        if self.pool is not None:
            return self.pool.active()
        if self.kube is not None:
            return self.kube.replicas.active()
        return list(self.config.replicas)

    def _log_replicas(self, probes: Sequence[ReplicaProbe]) -> None:
        before = {p.url: p for p in self.view.probes}
        for p in probes:
            prev = before.get(p.url)
            if p.up and (prev is None or not prev.up):
                log.info(
                    "replica %s up (waiting %s, running %s)%s",
                    p.url,
                    _n(p.waiting),
                    _n(p.running),
                    f"; {p.reason}" if p.reason else "",
                )
            elif not p.up and (prev is None or prev.up):
                log.warning("replica %s down (%s)", p.url, p.reason)

    async def _read_engine(self, probes: Sequence[ReplicaProbe]) -> None:
        assert self._session is not None
        key = self.config.prewarm.replay_api_key
        await refresh_versions(
            self.versions,
            self._session,
            probes,
            time.monotonic(),
            self.config.timeout,
            key.get_secret_value() if key is not None else None,
        )
        version = self.versions.region_version(probes)
        if version != self.engine_version:
            log.info("engine: %s -> %s", self.engine_version or "unknown", version or "unknown")
            self.engine_version = version
        serving = self.versions.region_serving(probes)
        if serving != self.serving_config:
            log.info("serving config: %s", serving or "unknown")
            self.serving_config = serving

    async def _report_loop(self) -> None:
        while True:
            self._wake.clear()
            await self._report(self.view)
            try:
                async with asyncio.timeout(self.config.interval):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _report(self, view: RegionVerdict) -> None:
        req = pb.HealthReport(
            region=view.region,
            observer=f"agent:{view.region}",
            kind=pb.AGENT,
            health=health_to_pb(view.health),
            signals=view.signals,
            detail=view.detail,
            engine_version=self.engine_version,
            serving_config=self.serving_config,
        )
        resp = await self._reporter.send(req)
        if resp is not None:
            self.reports_sent += 1
            self._adopt(resp.thresholds)
            # a model pool's agent: its series carry the pool's model (docs/models.md)
            self.metrics.pool_models = {view.region: resp.model} if resp.model else {}
        self.metrics.reported(resp is not None)

    def _adopt(self, msg: pb.RegionThresholds) -> None:
        """Judge by the thresholds a control plane sent from the next probe round on;
        say so when they change. Out-of-bounds ones (a control plane's bug: its
        topology was validated) are refused and the ones in effect kept."""
        try:
            when = thresholds_from_pb(msg)
        except ValueError as e:
            log.warning("thresholds from the control plane refused, keeping the last: %s", e)
            return
        if when != self.thresholds:
            log.info("thresholds from the control plane: %s", when.describe())
            self.thresholds = when

    async def wait(self) -> None:
        """Until the agent stops; raises if its loops failed."""
        assert self._task is not None
        await asyncio.wait({self._task})
        if not self._task.cancelled() and (exc := self._task.exception()) is not None:
            raise exc

    async def stop(self, grace: float = 1.0) -> None:
        """Graceful shutdown: NOT_SERVING first, then stop the loops and the server."""
        if self._stopping:
            return
        self._stopping = True
        await self._health.enter_graceful_shutdown()
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
        if self.service is not None:
            await self.service.stop()
        if self.kube is not None:
            self.kube.detach()  # a kubernetes pool's pods outlive the agent
        if self.pool is not None:
            await self.pool.stop()
        if self.kube is not None:
            await self.kube.stop()
        await self._server.stop(grace)
        if self._metrics_http is not None:
            await self._metrics_http.stop()
        await self._reporter.close()
        if self._session is not None:
            await self._session.close()
        log.info("agent for region %s stopped", self.config.region)


def _n(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


async def serve_agent(
    config: AgentConfig,
    replica_set: ReplicaSet | None = None,
    prewarm: PrewarmServiceConfig | None = None,
) -> AgentHandle:
    """Start an agent in the running loop (first probe done, gRPC serving)."""
    handle = AgentHandle(config, replica_set, prewarm)
    try:
        await handle._start()
    except BaseException:
        await handle.stop(grace=0)
        raise
    return handle
