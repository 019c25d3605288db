"""The gateway as a process, with a real failover: control plane + agents + simulators
on a real etcd, the region's only simulator killed.

The failed region's sessions move once and stay, through both gateways, also when the
region comes back and recovers in steps; the gateways' votes reach the control plane.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import (
    Proc,
    launch_simulator,
    start_agent,
    start_controlplane,
    start_simulators,
    until,
    wait_ready,
)
from controlplane.kernel.codec import decode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.store.etcd import EtcdStore
from regions.pool.processes import free_port
from tests.integration.gateway_helpers import (
    REGIONS,
    Deployment,
    complete,
    gateway_at,
    http,
    metric,
    pin_of,
    procs_cleanup,
    write_topology,
)

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

# The harness's fixtures (gateway_helpers.py), imported for pytest to find them by name.
FIXTURES = (http, procs_cleanup)


@dataclass
class Region:
    sim: Proc
    port: int


@pytest.fixture
def failover_deployment(
    etcd: EtcdServer, cluster_name: str, tmp_path: Path, procs_cleanup: list[Deployment]
) -> Iterator[tuple[Deployment, dict[str, Region], str]]:
    """One simulator, one agent per region, one control-plane replica; fast timings and
    fast graduated recovery. Yields the deployment, the regions, the control plane."""
    agent_ports = {r: free_port() for r in REGIONS}
    cp_port = free_port()
    sims = start_simulators(len(REGIONS))
    regions = {r: Region(s, s.port) for r, s in zip(REGIONS, sims, strict=True)}
    path = write_topology(
        tmp_path / "topology.yaml",
        cluster_name,
        etcd.endpoints,
        {r: [regions[r].sim.url] for r in REGIONS},
        agent_ports,
        timing={
            "probe_interval_s": 0.3,
            "failure_threshold": 3,
            "success_threshold": 2,
            "report_stale_s": 1.2,
            "quorum": 2,
            "loop_period_s": 0.3,
            "retry_timeout_s": 0.5,
            "lease_ttl_s": 2,
            "recovery_dwell_s": 1.0,
            "failover_cooldown_s": 600,
        },
        recovery={"step_percent": 50, "step_interval_s": 0.3},
    )
    d = Deployment(
        cluster_name, path, etcd.endpoints, {r: [regions[r].sim] for r in REGIONS}, list(sims)
    )
    procs_cleanup.append(d)
    cp_target = f"127.0.0.1:{cp_port}"
    for r in REGIONS:
        d.procs.append(
            start_agent(
                region=r,
                control_planes=[cp_target],
                replicas=[regions[r].sim.url],
                interval=0.3,
                timeout=0.25,
                listen=f"127.0.0.1:{agent_ports[r]}",
            )
        )
    d.procs.append(start_controlplane(path, "cp-1", listen=cp_target))
    yield d, regions, cp_target


async def _status(target: str) -> pb.StatusResponse:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
        status: pb.StatusResponse = await stub.GetStatus(pb.GetStatusRequest(), timeout=2)
        return status


async def test_failover_moves_the_failed_regions_sessions_once_and_they_stay(
    failover_deployment: tuple[Deployment, dict[str, Region], str],
    etcd_store: EtcdStore,
    keys: Keys,
    http: aiohttp.ClientSession,
) -> None:
    d, regions, cp = failover_deployment

    async def all_healthy() -> bool:
        st = await _status(cp)
        return bool(st.leader) and all(r.health == pb.HEALTHY for r in st.regions)

    await until(all_healthy, within=30, every=0.1, what="every region HEALTHY under a leader")
    report = ("--control-plane", cp, "--report-interval", "0.2")
    gws = await asyncio.gather(
        asyncio.to_thread(d.gateway, "east", *report), asyncio.to_thread(d.gateway, "west", *report)
    )
    east_gw = gws[0]
    sessions = [f"fo-{i}" for i in range(16)]

    async def gateway_voted() -> bool:  # what its requests saw, as a GATEWAY observer
        for s in sessions:
            assert await complete(http, east_gw.url, s) == (200, "east")
        east = next(r for r in (await _status(cp)).regions if r.name == "east")
        return any(o.startswith("gateway:east:") and v == "HEALTHY" for o, v in east.votes.items())

    await until(gateway_voted, within=20, every=0.1, what="the gateway's vote on east")

    await asyncio.to_thread(regions["east"].sim.kill)  # the region's only vLLM server dies

    async def routed_away() -> bool:
        kv = await etcd_store.get(keys.routing("east"))
        return kv is not None and decode(Routing, kv.value).targets.get("east", 0) == 0

    await until(routed_away, within=30, every=0.1, what="routing/east sends traffic away")
    kv = await etcd_store.get(keys.routing("east"))
    assert kv is not None
    for g in gws:
        await gateway_at(http, g.url, kv.mod_revision)
    for round_ in range(3):  # through both gateways, every answer from west
        results = await asyncio.gather(
            *(complete(http, gws[(i + round_) % 2].url, s) for i, s in enumerate(sessions))
        )
        assert results == [(200, "west")] * len(sessions), results
    for s in sessions:
        pin = await pin_of(etcd_store, keys, s)
        assert pin is not None and (pin.home, pin.region, pin.moves) == ("east", "west", 1)

    # East comes back and recovers in steps; the moved sessions never bounce back.
    sim = launch_simulator(port=regions["east"].port, name="sim-east-again")
    d.procs.append(sim)
    await asyncio.to_thread(wait_ready, sim)

    async def recovered() -> bool:
        kv = await etcd_store.get(keys.routing("east"))
        return kv is None or decode(Routing, kv.value).targets.get("east", 0) >= 1.0

    await until(recovered, within=45, every=0.2, what="east fully recovered")
    kv = await etcd_store.get(keys.routing("east"))
    for g in gws:
        await gateway_at(http, g.url, kv.mod_revision if kv else 0)
    results = await asyncio.gather(*(complete(http, g.url, s) for s in sessions for g in gws))
    assert results == [(200, "west")] * len(results)
    for s in sessions:
        pin = await pin_of(etcd_store, keys, s)
        assert pin is not None and (pin.region, pin.moves) == ("west", 1)
    assert await complete(http, east_gw.url, "fo-new-after-recovery") == (200, "east")
    for g in gws:
        assert await metric(http, g.url, "tectonic_gateway_consistency_violations_total") == 0
