"""Shared harness: an in-process control-plane replica on a real etcd, driven over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.ladder.model import Ladder
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import Store
from controlplane.server import ControlPlaneReplica
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer

REGIONS = ("east", "west", "central", "eu")


# Ticks of 0.2 s: a failover in about a second.
FAST_TIMING = {
    "probe_interval_s": 0.2,
    "failure_threshold": 3,
    "success_threshold": 2,
    "report_stale_s": 1.0,
    "quorum": 2,
    "degraded_dwell_s": 1,
    "recovery_dwell_s": 1.0,
    "failover_cooldown_s": 60,
    "loop_period_s": 0.2,
    "retry_timeout_s": 0.5,
    "lease_ttl_s": 3,
}


def fast_topology(endpoints: tuple[str, ...], cluster: str, **prewarm: float) -> Topology:
    return parse_topology(
        {
            "cluster": cluster,
            "etcd": {"endpoints": list(endpoints)},
            "regions": [
                {"name": "east", "zone": "us", "agent": "127.0.0.1:9", "capacity_rps": 100},
                {"name": "west", "zone": "us", "agent": "127.0.0.1:9", "capacity_rps": 100},
                {"name": "central", "zone": "us", "agent": "127.0.0.1:9", "capacity_rps": 50},
                {"name": "eu", "zone": "eu", "agent": "127.0.0.1:9", "capacity_rps": 100},
            ],
            "timing": FAST_TIMING,
            "recovery": {"step_percent": 50, "step_interval_s": 0.3},
            "prewarm": dict(prewarm),
        }
    )


@dataclass
class Running:
    replica: ControlPlaneReplica
    stub: pb_grpc.ControlPlaneStub
    channel: grpc.aio.Channel
    target: str


@contextlib.asynccontextmanager
async def running_replica(
    topology: Topology,
    replica_id: str = "cp-a",
    http_listen: str | None = None,
    ladder: Ladder | None = None,
    store: Store | None = None,
    listen: str = "127.0.0.1:0",
) -> AsyncIterator[Running]:
    """``http_listen`` (e.g. ``127.0.0.1:0``) also serves the HTTP API, on
    ``replica.http_port``. ``store``: use this one (closed by the caller) instead of a
    new EtcdStore on the topology's etcd. ``listen``: the gRPC address (a port chosen
    beforehand: agents started first report to it once it is up). ``stub`` is plaintext
    and tokenless: with the topology's ``security`` on, make your own channel
    (``controlplane.kernel.rpc.tls``)."""
    own_store = store is None
    if store is None:
        store = EtcdStore(topology.etcd)
        await store.connect()
    replica = ControlPlaneReplica(
        topology=topology,
        store=store,
        replica_id=replica_id,
        probe_agents=False,
        http_listen=http_listen,
        ladder=ladder,
        listen=listen,
    )
    task = asyncio.create_task(replica.run())
    await asyncio.wait_for(replica.started.wait(), 10)
    target = f"127.0.0.1:{replica.port}"
    channel = grpc.aio.insecure_channel(target)
    try:
        yield Running(replica, pb_grpc.ControlPlaneStub(channel), channel, target)
    finally:
        await channel.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if own_store:
            await store.close()


async def report(stub: pb_grpc.ControlPlaneStub, health: dict[str, int]) -> None:
    for r in REGIONS:
        h = health.get(r, pb.HEALTHY)
        for obs, kind in ((f"agent:{r}", pb.AGENT), ("gateway:g1", pb.GATEWAY)):
            await stub.ReportHealth(
                pb.HealthReport(
                    region=r, observer=obs, kind=kind, health=h, signals={"load_rps": 10}
                )
            )


async def until(
    pred: Callable[[pb.StatusResponse], bool],
    stub: pb_grpc.ControlPlaneStub,
    health: dict[str, int],
    within: float = 20.0,
) -> pb.StatusResponse:
    """Keep reporting ``health`` until ``pred(status)`` holds; return that status."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        await report(stub, health)
        st = await stub.GetStatus(pb.GetStatusRequest())
        if pred(st):
            return st
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached; last status: {st}")
        await asyncio.sleep(0.1)


def region(st: pb.StatusResponse, name: str) -> pb.RegionStatus:
    return next(r for r in st.regions if r.name == name)


@contextlib.asynccontextmanager
async def reporting(
    stub: pb_grpc.ControlPlaneStub, health: dict[str, int], every: float = 0.2
) -> AsyncIterator[dict[str, int]]:
    """Keep every region's observers reporting in the background (fresh votes);
    mutate the yielded dict to change what they report."""

    async def loop() -> None:
        while True:
            await report(stub, health)
            await asyncio.sleep(every)

    task = asyncio.create_task(loop())
    try:
        yield health
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def running_gateway(
    topology: Topology, home: str, *, prefix_tracking: bool = True
) -> AsyncIterator[GatewayServer]:
    """An in-process gateway homed in ``home``, serving once it has read etcd."""
    gw = GatewayServer(
        GatewayOptions(topology=topology, app=AppConfig(home=home), prefix_tracking=prefix_tracking)
    )
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()
