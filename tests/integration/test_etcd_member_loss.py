"""A control-plane replica on a 3-member etcd keeps working when a member dies."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.local_etcd import EtcdCluster
from tests.integration.cp_harness import fast_topology, region, running_replica, until

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


@pytest.fixture
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(3) as c:  # started on enter, stopped on exit
        yield c


async def test_failover_completes_after_the_etcd_raft_leader_is_killed(
    cluster: EtcdCluster,
) -> None:
    topology = fast_topology(cluster.endpoints, f"m{uuid.uuid4().hex[:8]}")
    async with running_replica(topology) as run:
        await until(
            lambda s: s.responder_is_leader and all(r.health == pb.HEALTHY for r in s.regions),
            run.stub,
            {},
        )
        leader = cluster.leader_index()
        assert leader is not None
        cluster.kill_member(leader)
        await asyncio.sleep(0.5)
        # Work goes on: a region going down is still failed over, on two members.
        st = await until(
            lambda s: region(s, "east").failover_steps_done == "switch,prewarm",
            run.stub,
            {"east": pb.UNHEALTHY},
            within=40,
        )
        assert set(region(st, "east").routing) == {"west", "central"}
        assert st.leader == "cp-a" and st.responder_is_leader
        assert sum(m.running() for m in cluster.members) == 2
