"""The cluster spec on a real etcd: a control-plane replica that becomes leader
publishes its topology's spec, and a gateway whose topology says another
``prefixes.min_sessions`` refuses to start, as a process, naming the setting. A
running gateway follows the spec: one that turns to disagree stops it (drained, exit
2, the setting named); one that agrees, is deleted or cannot be read does not."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, spawn, start_gateway, start_simulator, until
from controlplane.kernel.cluster_spec import (
    ClusterSpec,
    SpecDisagreement,
    SpecRecovery,
    cluster_spec,
    read_spec,
)
from controlplane.kernel.codec import encode
from controlplane.kernel.config import DegradedWhen, Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditAction, AuditEntry
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.memory import MemoryStore
from controlplane.server import ControlPlaneReplica
from regions.dataplane.spec_watch import SpecWatch
from regions.gateway.app import AppConfig
from regions.gateway.server import SPEC_SECTIONS, GatewayOptions, GatewayServer

pytestmark = [pytest.mark.etcd]

MIN_SESSIONS_DIFFER = (
    "prefixes.min_sessions: this process's topology says 2, the cluster spec in etcd says 3"
)


def topology_data(
    cluster: str, endpoints: tuple[str, ...], min_sessions: int, replicas: tuple[str, ...] = ()
) -> dict[str, object]:
    return {
        "cluster": cluster,
        "etcd": {"endpoints": list(endpoints)},
        "regions": [
            {
                "name": "east",
                "zone": "us",
                "agent": "127.0.0.1:9",
                "capacity_rps": 10,
                "replicas": list(replicas),
            },
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
        assert MIN_SESSIONS_DIFFER in log
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
        assert e.value.problems == (MIN_SESSIONS_DIFFER,)
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


# ---- a running gateway follows the spec --------------------------------------------------


@pytest.fixture
def simulator() -> Iterator[Proc]:
    """East's one replica, decoding 20 tokens per second: a stream to drain."""
    proc = start_simulator(extra_args=("--decode-tokens-per-s", "20"))
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def gateway_topology(
    tmp_path: Path, cluster: str, etcd: EtcdServer, replica: str
) -> tuple[Path, Topology]:
    """East served by ``replica``; min_sessions 2."""
    data = topology_data(cluster, etcd.endpoints, 2, (replica,))
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, Topology.model_validate(data)


async def publish(store: EtcdStore, keys: Keys, spec: ClusterSpec) -> int:
    """Write the spec as a leader would (tests need no election for it)."""
    return await store.put(keys.spec(), encode(spec))


async def complete(http: aiohttp.ClientSession, url: str) -> int:
    payload = {"model": "tiny", "prompt": "hello there", "max_tokens": 2}
    async with http.post(url + "/v1/completions", json=payload) as resp:
        await resp.read()
        return resp.status


@pytest.mark.slow
async def test_a_running_gateway_drains_and_exits_2_when_the_spec_turns_to_disagree(
    etcd: EtcdServer,
    etcd_store: EtcdStore,
    cluster_name: str,
    tmp_path: Path,
    simulator: Proc,
    http: aiohttp.ClientSession,
) -> None:
    keys = Keys(cluster_name)
    path, topology = gateway_topology(tmp_path, cluster_name, etcd, simulator.url)
    await publish(etcd_store, keys, cluster_spec(topology))  # agrees: it starts
    gw = await asyncio.to_thread(start_gateway, path, "east")
    try:
        # A new leader's topology says min_sessions 3 while a stream is in flight.
        other = Topology.model_validate(
            topology_data(cluster_name, etcd.endpoints, 3, (simulator.url,))
        )
        events: list[bytes] = []
        body = {"model": "tiny", "prompt": "a long answer", "max_tokens": 20, "stream": True}
        async with http.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: "):
                    events.append(line)
                    if len(events) == 1:
                        await publish(etcd_store, keys, cluster_spec(other))
        # Drained as on SIGTERM: the stream in flight finished whole.
        assert events[-1].strip() == b"data: [DONE]" and len(events) == 21
        assert await asyncio.to_thread(gw.popen.wait, 15) == 2, gw.log()
        log = gw.log(20_000)
        assert "error: this topology disagrees with the cluster spec in etcd" in log
        assert MIN_SESSIONS_DIFFER in log
        errors = [line for line in log.splitlines() if " ERROR " in line]
        assert len(errors) == 1 and "spec" in errors[0], log
        assert "supervisor restarts it on the new topology" in log
        assert "Traceback" not in log
    finally:
        gw.kill()


@pytest.mark.slow
async def test_a_running_gateway_serves_on_through_an_agreeing_rewrite(
    etcd: EtcdServer,
    etcd_store: EtcdStore,
    cluster_name: str,
    tmp_path: Path,
    simulator: Proc,
    http: aiohttp.ClientSession,
) -> None:
    keys = Keys(cluster_name)
    path, topology = gateway_topology(tmp_path, cluster_name, etcd, simulator.url)
    spec = cluster_spec(topology)
    await publish(etcd_store, keys, spec)
    gw = await asyncio.to_thread(start_gateway, path, "east")
    try:
        # Only what a gateway does not use changed: the recovery pace, a threshold.
        east, west = spec.regions
        rewrite = spec.model_copy(
            update={
                "recovery": SpecRecovery(step_percent=50, step_interval_s=1),
                "regions": (
                    east.model_copy(update={"degraded_when": DegradedWhen(queue_over=9)}),
                    west,
                ),
            }
        )
        revision = await publish(etcd_store, keys, rewrite)

        async def judged() -> bool:
            return f"(revision {revision}) agrees" in gw.log(20_000)

        await until(judged, within=10, what="the gateway judged the rewrite")
        assert await complete(http, gw.url) == 200
        assert gw.alive(), gw.log()
    finally:
        gw.kill()


async def test_the_spec_watch_stops_only_on_a_disagreement(
    caplog: pytest.LogCaptureFixture, cluster_name: str
) -> None:
    """Deleted, unreadable (warned once per revision), etcd unreachable: it watches on."""
    caplog.set_level(logging.INFO, logger="tectonic.gateway.spec")
    keys = Keys(cluster_name)
    store = MemoryStore()
    topology = Topology.model_validate(topology_data(cluster_name, ("127.0.0.1:9",), 2))
    mine = cluster_spec(topology)
    watch = SpecWatch(store, keys, mine, SPEC_SECTIONS, retry_s=0.01, resync_s=0.02)
    await store.put(keys.spec(), encode(mine))
    task = asyncio.create_task(watch.run())

    def logged(text: str) -> int:
        return sum(text in r.getMessage() for r in caplog.records)

    async def seen(text: str, count: int = 1) -> None:
        async def enough() -> bool:
            return logged(text) >= count

        await until(enough, within=5, what=text)

    try:
        await seen("agrees")
        await store.put(keys.spec(), b"{not a spec")
        await seen("it cannot be read")
        await asyncio.sleep(0.2)  # several resyncs read the same revision
        assert logged("it cannot be read") == 1
        await store.delete(keys.spec())
        await seen("deleted")
        store.set_available(False)
        await seen("etcd cannot be read")
        await asyncio.sleep(0.2)  # retries
        assert logged("etcd cannot be read") == 1
        store.set_available(True)
        await store.put(keys.spec(), encode(mine))
        await seen("agrees", 2)
        assert not task.done()

        other = Topology.model_validate(topology_data(cluster_name, ("127.0.0.1:9",), 3))
        await store.put(keys.spec(), encode(cluster_spec(other)))
        with pytest.raises(SpecDisagreement) as e:
            await asyncio.wait_for(task, 5)
        assert e.value.problems == (MIN_SESSIONS_DIFFER,)
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and MIN_SESSIONS_DIFFER in errors[0].getMessage()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await store.close()
