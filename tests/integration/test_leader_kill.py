"""Two control-plane replica processes on a real etcd; the leader is SIGKILLed in the
middle of a failover and the other replica finishes it without repeating a step.

Everything is real: simulator processes serve vLLM's API, region agents probe them
and report over gRPC, the control-plane replicas elect a leader through etcd.
The replicas are the lab's (chaos/lab/controlplane.py), whose pre-warm only waits
HOLD_S: the failover stays in its pre-warm step long enough to kill the leader there.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_agent, start_controlplane, start_simulator, until
from regions.pool.processes import free_port

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

HOLD_S = 4.0


@dataclass
class Deployment:
    cps: dict[str, Proc]
    sims: dict[str, Proc]
    agents: dict[str, Proc]

    def stub(self, replica: str) -> tuple[grpc.aio.Channel, pb_grpc.ControlPlaneStub]:
        ch = grpc.aio.insecure_channel(self.cps[replica].url)
        return ch, pb_grpc.ControlPlaneStub(ch)


@pytest.fixture
def deployment(etcd: EtcdServer, tmp_path: Path) -> Iterator[Deployment]:
    regions = ("east", "west")
    agent_ports = {r: free_port() for r in regions}
    cp_ports = {"cp-1": free_port(), "cp-2": free_port()}
    topo = {
        "cluster": f"k{uuid.uuid4().hex[:8]}",
        "etcd": {"endpoints": list(etcd.endpoints)},
        "regions": [
            {"name": r, "zone": "us", "agent": f"127.0.0.1:{agent_ports[r]}", "capacity_rps": 100}
            for r in regions
        ],
        "timing": {
            "probe_interval_s": 0.3,
            "failure_threshold": 3,
            "success_threshold": 2,
            "report_stale_s": 1.2,
            "quorum": 2,
            "loop_period_s": 0.3,
            "retry_timeout_s": 0.5,
            "lease_ttl_s": 2,
            "recovery_dwell_s": 600,
            "failover_cooldown_s": 600,
        },
    }
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    procs: list[Proc] = []
    try:
        sims = {r: start_simulator(name=f"sim-{r}") for r in regions}
        procs += sims.values()
        cp_targets = [f"127.0.0.1:{p}" for p in cp_ports.values()]
        agents = {
            r: start_agent(
                region=r,
                control_planes=cp_targets,
                replicas=[sims[r].url],
                interval=0.3,
                timeout=0.25,
                listen=f"127.0.0.1:{agent_ports[r]}",
            )
            for r in regions
        }
        procs += agents.values()
        cps = {
            rid: start_controlplane(path, rid, listen=f"127.0.0.1:{port}", prewarm_hold_s=HOLD_S)
            for rid, port in cp_ports.items()
        }
        procs += cps.values()
        yield Deployment(cps, sims, agents)
    finally:
        for p in procs:
            p.kill()


async def status(stub: pb_grpc.ControlPlaneStub) -> pb.StatusResponse:
    return await stub.GetStatus(pb.GetStatusRequest(), timeout=2)


def region(st: pb.StatusResponse, name: str) -> pb.RegionStatus:
    return next(r for r in st.regions if r.name == name)


async def wait_all_healthy(stub: pb_grpc.ControlPlaneStub) -> str:
    async def ok() -> bool:
        st = await status(stub)
        return bool(st.leader) and all(r.health == pb.HEALTHY for r in st.regions)

    await until(ok, within=30, every=0.1, what="every region HEALTHY under a leader")
    return (await status(stub)).leader


async def wait_east_steps(
    stub: pb_grpc.ControlPlaneStub, steps: str, *, within: float, every: float, what: str
) -> None:
    """Until east's failover has done ``steps`` (comma-separated, in the order done)."""

    async def done() -> bool:
        return region(await status(stub), "east").failover_steps_done == steps

    await until(done, within=within, every=every, what=what)


async def history(stub: pb_grpc.ControlPlaneStub, reg: str) -> list[pb.Event]:
    return list((await stub.GetHistory(pb.HistoryRequest(region=reg, limit=200))).events)


async def test_leader_killed_before_the_switch_of_a_manual_failover(
    deployment: Deployment,
) -> None:
    d = deployment
    ch, stub = d.stub("cp-1")
    async with ch:
        leader = await wait_all_healthy(stub)
        survivor = "cp-2" if leader == "cp-1" else "cp-1"
        resp = await stub.RequestFailover(
            pb.FailoverRequest(
                region="east", to=["west"], reason="drain for kernel patch", actor="alice"
            )
        )
        assert resp.accepted and resp.plan.warm_first

        async def mid_failover() -> bool:
            e = region(await status(stub), "east")
            return e.state == pb.FAILING_OVER and e.failover_steps_done == ""

        await until(mid_failover, within=15, every=0.05, what="east in pre-warm")
        d.cps[leader].kill()  # SIGKILL: no resign, the lease must expire

    ch, stub = d.stub(survivor)
    async with ch:
        await wait_east_steps(
            stub, "prewarm,switch", within=30, every=0.1, what="survivor finishes the failover"
        )
        st = await status(stub)
        assert st.leader == survivor
        assert dict(region(st, "east").routing) == {"west": 1.0}
        events = await history(stub, "east")
        actions = [(e.action, e.actor) for e in events]
        assert actions.count(("transition", "alice")) == 1  # not repeated by the new leader
        assert [a for a, _ in actions].count("routing_switch") == 1
        assert ("routing_switch", survivor) in actions and ("prewarm", survivor) in actions
        assert ("prewarm", leader) not in actions  # it died holding the pre-warm


async def test_leader_killed_after_the_switch_of_an_automatic_failover(
    deployment: Deployment,
) -> None:
    d = deployment
    ch, stub = d.stub("cp-2")
    async with ch:
        leader = await wait_all_healthy(stub)
        survivor = "cp-2" if leader == "cp-1" else "cp-1"
        d.sims["east"].kill()  # the region's only vLLM replica dies: hard down
        await wait_east_steps(  # hard down: switch first, warm after
            stub, "switch", within=20, every=0.05, what="east switched, pre-warm pending"
        )
        d.cps[leader].kill()

    ch, stub = d.stub(survivor)
    async with ch:
        await wait_east_steps(
            stub, "switch,prewarm", within=30, every=0.1, what="survivor finishes the pre-warm"
        )
        events = await history(stub, "east")
        switches = [e for e in events if e.action == "routing_switch"]
        assert len(switches) == 1 and switches[0].actor == leader  # not repeated
        transitions = [e for e in events if e.action == "transition"]
        assert len(transitions) == 1 and transitions[0].decision.trigger == "fail_over"
        assert transitions[0].decision.signals["votes_down"] >= 2
        assert [e.actor for e in events if e.action == "prewarm"] == [survivor]
