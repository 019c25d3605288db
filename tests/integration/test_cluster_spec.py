"""The cluster spec on a real etcd: a control-plane replica that becomes leader
publishes its topology's spec, and a gateway whose topology says another
``prefixes.min_sessions`` refuses to start, as a process, naming the setting."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import spawn
from controlplane.kernel.cluster_spec import SpecDisagreement, cluster_spec, read_spec
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditAction, AuditEntry
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.server import ControlPlaneReplica
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer

pytestmark = [pytest.mark.etcd]


def topology_data(cluster: str, endpoints: tuple[str, ...], min_sessions: int) -> dict[str, object]:
    return {
        "cluster": cluster,
        "etcd": {"endpoints": list(endpoints)},
        "regions": [
            {"name": "east", "zone": "us", "agent": "127.0.0.1:9", "capacity_rps": 10},
            {"name": "west", "zone": "us", "agent": "127.0.0.1:9", "capacity_rps": 10},
        ],
        "prefixes": {"min_sessions": min_sessions},
    }


async def publish_as_leader(store: EtcdStore, topology: Topology) -> None:
    """A control-plane replica's election and reconcile loop, until the spec is in etcd
    (its first tick as leader publishes it)."""
    replica = ControlPlaneReplica(
        topology=topology, store=store, replica_id="cp-1", probe_agents=False
    )
    tasks = [
        asyncio.create_task(replica.election.run()),
        asyncio.create_task(replica.loop.run()),
    ]
    try:
        for _ in range(500):
            if (await read_spec(store, replica.keys))[0] is not None:
                break
            await asyncio.sleep(0.02)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await replica.election.resign()


async def test_a_gateway_with_another_min_sessions_refuses_to_start(
    etcd: EtcdServer, etcd_store: EtcdStore, cluster_name: str, tmp_path: Path
) -> None:
    keys = Keys(cluster_name)
    leader = Topology.model_validate(topology_data(cluster_name, etcd.endpoints, 3))
    await publish_as_leader(etcd_store, leader)
    spec, _ = await read_spec(etcd_store, keys)
    assert spec == cluster_spec(leader)
    page = await etcd_store.get_prefix(keys.audit_prefix())
    actions = [AuditEntry.model_validate_json(kv.value).action for kv in page.kvs]
    assert actions == [AuditAction.SPEC_PUBLISHED]

    # The gateway as an operator runs it: a clean error naming the setting, exit 2.
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topology_data(cluster_name, etcd.endpoints, 2)))
    proc = spawn(
        [
            "-m",
            "regions.gateway",
            "--topology",
            str(path),
            "--region",
            "east",
            "--listen",
            "127.0.0.1:0",
        ],
        "gw-spec",
        stdout_pipe=True,
    )
    try:
        await asyncio.to_thread(proc.popen.wait, 30)
        log = proc.log()
        assert proc.popen.returncode == 2, log
        assert (
            "prefixes.min_sessions: this process's topology says 2, the cluster spec in etcd says 3"
        ) in log
        assert "Traceback" not in log
        assert proc.popen.stdout is not None and b"READY" not in proc.popen.stdout.read()
    finally:
        proc.kill()

    # In process, the same refusal is a SpecDisagreement from start().
    gateway = GatewayServer(
        GatewayOptions(
            topology=Topology.model_validate(topology_data(cluster_name, etcd.endpoints, 2)),
            app=AppConfig(home="east"),
        ),
        store=etcd_store,
    )
    try:
        with pytest.raises(SpecDisagreement) as e:
            await gateway.start()
        assert e.value.problems == (
            "prefixes.min_sessions: this process's topology says 2, the cluster spec in etcd "
            "says 3",
        )
    finally:
        await gateway.stop()

    # A gateway whose topology agrees starts.
    agreeing = GatewayServer(
        GatewayOptions(topology=leader, app=AppConfig(home="east")), store=etcd_store
    )
    try:
        await agreeing.start()
        assert agreeing.port
    finally:
        await agreeing.stop()
