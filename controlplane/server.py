"""One control-plane replica: election, reconcile loop, agent prober and gRPC API.

Every replica serves the API; only the leader probes agents and acts. Health
(``grpc.health.v1``) is SERVING while the loop makes progress and NOT_SERVING when
it stalls or the replica shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tectonic_api.v1 import controlplane_pb2, controlplane_pb2_grpc

from controlplane.api.grpc_service import ControlPlaneService
from controlplane.clock import Clock, SystemClock
from controlplane.config import Topology
from controlplane.election import LeaderElection
from controlplane.keys import Keys
from controlplane.loop import ReconcileLoop
from controlplane.orchestrator import Orchestrator
from controlplane.prewarm import HoldPrewarmer, NoPrefixData, Prewarmer
from controlplane.probe import AgentProber
from controlplane.session_store import SessionStore
from controlplane.store.port import Store

log = logging.getLogger("tectonic.server")

SERVICE_NAME = controlplane_pb2.DESCRIPTOR.services_by_name["ControlPlane"].full_name
MAX_MESSAGE_BYTES = 64 * 1024  # requests are small; anything bigger is refused


@dataclass
class ControlPlaneReplica:
    topology: Topology
    store: Store
    replica_id: str
    listen: str = "127.0.0.1:0"
    clock: Clock = field(default_factory=SystemClock)
    probe_agents: bool = True
    prewarmer: Prewarmer | None = None

    port: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.keys = Keys(self.topology.cluster)
        t = self.topology
        self.election = LeaderElection(
            self.store, self.keys.leader(), self.replica_id, t.timing.lease_ttl_s
        )
        pre = self.prewarmer or (
            HoldPrewarmer(t.prewarm.hold_s) if t.prewarm.hold_s > 0 else NoPrefixData()
        )
        self.sessions = SessionStore(
            self.store,
            self.keys,
            regions=t.names,
            clock=self.clock,
            writer=f"sessions-{self.replica_id}",
        )
        self.orchestrator = Orchestrator(
            self.store,
            self.keys,
            t,
            self.clock,
            self.election.fence,
            pre,
            self.replica_id,
            sessions=self.sessions,
        )
        self.prober = (
            AgentProber(self.store, self.keys, t, self.clock) if self.probe_agents else None
        )
        self.loop = ReconcileLoop(
            self.store,
            self.keys,
            t,
            self.clock,
            self.election,
            self.orchestrator,
            self.prober,
            self.replica_id,
        )
        self.health = health.aio.HealthServicer()

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
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ]
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
            ),
            server,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        self.port = server.add_insecure_port(self.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        await self._set_health(False)
        await server.start()
        log.info(
            "replica %s serving gRPC on port %d (cluster %s, %d regions)",
            self.replica_id,
            self.port,
            self.topology.cluster,
            len(self.topology.regions),
        )
        self.started.set()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.election.run(), name="election")
                tg.create_task(self.loop.run(), name="reconcile-loop")
                tg.create_task(self._health_supervisor(), name="health")
        finally:
            log.info("replica %s shutting down", self.replica_id)
            await self._set_health(False)
            await self.orchestrator.stop_failovers()
            with contextlib.suppress(Exception):
                await asyncio.shield(self.election.resign())
            await server.stop(grace=1.0)
            if self.prober is not None:
                await self.prober.close()
