"""grpc.health.v1 follows the loop: NOT_SERVING while the store is unreachable (the loop
makes no progress) and during shutdown; SERVING again when the loop recovers."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chaos.lab.procs import until
from controlplane.kernel.store.memory import MemoryStore
from controlplane.server import ControlPlaneReplica
from tests.integration.cp_harness import fast_topology

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_health_tracks_loop_progress_and_shutdown() -> None:
    store = MemoryStore()
    topo = fast_topology(("127.0.0.1:1",), "health")  # etcd endpoints unused: memory store
    replica = ControlPlaneReplica(topology=topo, store=store, replica_id="cp-h", probe_agents=False)
    task = asyncio.create_task(replica.run())
    await asyncio.wait_for(replica.started.wait(), 10)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{replica.port}")
    stub = health_pb2_grpc.HealthStub(channel)

    async def status_is(want: int) -> bool:
        resp = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        return bool(resp.status == want)

    try:
        await until(lambda: status_is(SERVING), within=10, what="SERVING")
        store.set_available(False)  # every tick now fails: no progress
        await until(lambda: status_is(NOT_SERVING), within=15, what="NOT_SERVING on stall")

        async def not_leader() -> bool:
            return not replica.election.is_leader

        # It cannot keep its lease alive either, and stops acting before the TTL ends.
        await until(not_leader, within=topo.timing.lease_ttl_s, what="leadership dropped")
        store.set_available(True)
        await until(lambda: status_is(SERVING), within=15, what="SERVING after recovery")

        watch = stub.Watch(health_pb2.HealthCheckRequest(service="tectonic.v1.ControlPlane"))
        first = await watch.read()
        assert first.status == SERVING
        task.cancel()  # shutdown: health goes NOT_SERVING before the server stops
        last = await asyncio.wait_for(watch.read(), 5)
        assert last.status == NOT_SERVING
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await channel.close()
        await store.close()
