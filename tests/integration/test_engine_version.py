"""The engine a region runs, end to end: a real region agent reads vLLM's ``/version`` of
its replica (a simulator process, which answers as vLLM does) and sends it with its
health reports; the leader folds it into the region's health, and a capacity probe of
another engine is judged stale (the typed ``capacity_rps`` used, the reason naming both
engines) until a probe of this engine is written."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulator, until
from controlplane.kernel.codec import encode
from controlplane.kernel.config import parse_topology
from controlplane.kernel.keys import Keys
from regions.agent.server import AgentConfig, serve_agent
from regions.simulator.server import VERSION
from tests.integration.cp_harness import fast_topology, running_replica
from tests.integration.test_capacity_status import record

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


@pytest.fixture
def sim() -> Iterator[Proc]:
    proc = start_simulator()
    yield proc
    proc.kill()


async def test_a_probe_of_another_engine_is_stale_until_this_engine_is_probed(
    etcd: EtcdServer, cluster_name: str, sim: Proc
) -> None:
    data = fast_topology(etcd.endpoints, cluster_name).model_dump(mode="json")
    data["regions"][0]["replicas"] = [sim.url]  # east, typed 100 rps
    data["timing"]["quorum"] = 1
    topo = parse_topology(data)
    keys = Keys(topo.cluster)
    older = record("east", time.time() - 3600)  # fresh, but of engine 0.11.0
    assert older.engine_version != VERSION
    async with running_replica(topo) as cp:
        await cp.replica.store.put(keys.capacity("east"), encode(older))
        agent = await serve_agent(
            AgentConfig(
                region="east",
                replicas=(sim.url,),
                control_planes=(cp.target,),
                interval=0.25,
                timeout=0.25,
            )
        )
        try:
            assert agent.engine_version == VERSION  # read at its first round

            async def east() -> pb.RegionCapacity:
                st = await cp.stub.GetStatus(pb.GetStatusRequest())
                return next(r for r in st.regions if r.name == "east").capacity

            async def stale() -> bool:
                return (await east()).source == "stale"

            await until(stale, within=20, every=0.2, what="east's probe judged stale")
            cap = await east()
            assert "'0.11.0'" in cap.reason and repr(VERSION) in cap.reason
            assert cap.allowed_rps == 100  # the typed capacity, the fallback
            assert cap.engine_version == "0.11.0"  # the stale probe is shown, not used

            # A probe of the engine the region runs now is used again.
            same = older.model_copy(update={"engine_version": VERSION})
            await cp.replica.store.put(keys.capacity("east"), encode(same))

            async def measured() -> bool:
                return (await east()).source == "measured"

            await until(measured, within=20, every=0.2, what="east's new probe used")
            assert (await east()).allowed_rps == pytest.approx(6.0)  # R_base 12 / FOS 2
        finally:
            await agent.stop(grace=0)
