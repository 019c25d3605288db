"""The cluster spec (controlplane/kernel/cluster_spec.py): built from a topology and its
ladder, compared setting by setting, published by the leader's cycle with an audit
entry; and
the recovery pace set in one place only (ladder_file.check_recovery_pace)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from chaos.lab.spec import DeploymentSpec, compressed_ladder, local_topology
from controlplane.cluster import Cluster
from controlplane.core.actions import TickResult
from controlplane.core.decide import decide
from controlplane.election import NotLeader
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.cluster_spec import (
    SECTIONS,
    ClusterSpec,
    SpecDisagreement,
    cluster_spec,
    disagreements,
    read_spec,
    settings,
)
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import ConfigError, Topology, load_topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.file import check_recovery_pace, load_ladder, topology_ladder
from controlplane.kernel.model import AuditAction, AuditEntry
from controlplane.kernel.snapshot_reader import read_snapshot
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import Compare
from controlplane.orchestrator import Fence, Orchestrator
from controlplane.prewarm import NoPrefixData
from controlplane.server import ControlPlaneReplica
from regions.gateway.server import SPEC_SECTIONS as GATEWAY_SECTIONS

ROOT = Path(__file__).resolve().parents[2]
LEADER = Keys("t").leader()


def topology(**extra: Any) -> Topology:
    return Topology.model_validate(
        {
            "cluster": "t",
            "regions": [
                {"name": "east", "zone": "us", "agent": "127.0.0.1:1", "capacity_rps": 1},
                {"name": "west", "zone": "eu", "agent": "127.0.0.1:2", "capacity_rps": 1},
            ],
            **extra,
        }
    )


def test_the_spec_holds_regions_shared_prefix_settings_and_the_pace_in_effect() -> None:
    t = topology(
        prefixes={"block_size": 32, "level_tokens": 64, "min_sessions": 2, "export_interval_s": 3},
        recovery={"step_percent": 25, "step_interval_s": 2},
    )
    spec = cluster_spec(t)
    assert [(r.name, r.zone) for r in spec.regions] == [("east", "us"), ("west", "eu")]
    assert spec.prefixes.block_size == 32 and spec.prefixes.min_sessions == 2
    assert spec.prefixes.routing_chars == 256
    assert "export_interval_s" not in spec.prefixes.model_dump()  # a local resource
    assert (spec.recovery.step_percent, spec.recovery.step_interval_s) == (25, 2)
    # With a ladder its recovery section sets the pace (recovery_config).
    ladder = load_ladder()
    with_ladder = cluster_spec(topology(), ladder)
    assert with_ladder.recovery.step_percent == ladder.recovery.step_percent
    # Local-only settings do not change it.
    assert cluster_spec(topology(prefixes={"export_interval_s": 9})) == cluster_spec(topology())


def test_disagreements_name_each_setting_with_both_values() -> None:
    published = cluster_spec(topology(prefixes={"min_sessions": 2}))
    local = cluster_spec(topology(prefixes={"routing_chars": 64}))
    assert disagreements(local, published) == [
        "prefixes.min_sessions: this process's topology says 3, the cluster spec in etcd says 2",
        "prefixes.routing_chars: this process's topology says 64, the cluster spec in etcd "
        "says 256",
    ]
    assert disagreements(published, published) == []


def test_disagreements_cover_regions_and_pace_and_can_be_limited_to_sections() -> None:
    one = topology(recovery={"step_percent": 50})
    other = Topology.model_validate(
        {
            "cluster": "t",
            "regions": [{"name": "east", "zone": "eu", "agent": "127.0.0.1:1", "capacity_rps": 1}],
        }
    )
    found = disagreements(cluster_spec(one), cluster_spec(other))
    assert found == [
        "regions: this process's topology says east (zone us), west (zone eu), the cluster "
        "spec in etcd says east (zone eu)",
        "recovery.step_percent: this process's topology says 50, the cluster spec in etcd says 10",
    ]
    assert disagreements(cluster_spec(one), cluster_spec(topology()), ("prefixes",)) == []


def with_thresholds(**east: float) -> Topology:
    data = topology().model_dump(mode="json")
    data["regions"][0]["degraded_when"] = east
    return Topology.model_validate(data)


def test_the_regions_thresholds_are_in_the_spec_as_their_own_section() -> None:
    spec = cluster_spec(with_thresholds(ttft_p99_over_s=5, error_rate_over=0.05))
    assert spec.regions[0].degraded_when.ttft_p99_over_s == 5
    assert spec.regions[1].degraded_when.describe() == "none"
    got = settings(spec, ("thresholds",))
    assert got == {
        "regions.east.degraded_when.ttft_p99_over_s": "5",
        "regions.east.degraded_when.error_rate_over": "0.05",
    }
    assert "thresholds" in SECTIONS and set(settings(spec)) >= set(got)
    assert "regions.east.degraded_when.ttft_p99_over_s" not in settings(spec, ("regions",))


def test_a_threshold_that_differs_is_a_disagreement_but_not_a_gateways() -> None:
    published = cluster_spec(with_thresholds(queue_over=10))
    local = cluster_spec(with_thresholds(queue_over=20, ttft_p99_over_s=2))
    assert disagreements(local, published) == [
        "regions.east.degraded_when.queue_over: this process's topology says 20, the "
        "cluster spec in etcd says 10",
        "regions.east.degraded_when.ttft_p99_over_s: this process's topology says 2, the "
        "cluster spec in etcd says (none)",
    ]
    assert disagreements(local, published, GATEWAY_SECTIONS) == []


def test_a_spec_published_before_thresholds_reads_as_none() -> None:
    spec = cluster_spec(topology())
    data = spec.model_dump(mode="json")
    for r in data["regions"]:
        del r["degraded_when"]
    assert ClusterSpec.model_validate(data) == spec


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("error_rate_over", 1.0),
        ("error_rate_over", -0.1),
        ("ttft_p99_over_s", 0),
        ("ttft_p99_over_s", 2560),
        ("queue_over", -1),
    ],
)
def test_the_topology_refuses_thresholds_that_cannot_fire(field: str, value: float) -> None:
    data = topology().model_dump(mode="json")
    data["regions"][1]["degraded_when"] = {field: value}
    with pytest.raises(ConfigError, match=rf"regions\[1\]\.degraded_when\.{field}"):
        parse_topology(data)


def leader_fence() -> list[Compare]:
    return [Compare.value_is(LEADER, b"cp-1")]


async def audit(store: MemoryStore, keys: Keys) -> list[AuditEntry]:
    page = await store.get_prefix(keys.audit_prefix())
    return [decode(AuditEntry, kv.value) for kv in page.kvs]


async def leader_tick(
    store: MemoryStore, spec: ClusterSpec, now: float, fence: Fence = leader_fence
) -> TickResult:
    """One tick of the leader's cycle (decide, then the orchestrator's writes) with the
    spec its topology makes."""
    t, keys = topology(), Keys("t")
    snap = await read_snapshot(store, keys, t, now)
    result = decide(snap, t, "cp-1", spec=spec)
    orch = Orchestrator(Cluster(store, keys, t, FakeClock(now)), fence, NoPrefixData(), "cp-1")
    await orch.apply(result)
    return result


async def test_the_leader_publishes_once_fenced_and_audits_what_changed() -> None:
    store, keys = MemoryStore(), Keys("t")
    await store.put(LEADER, b"cp-1")
    first = cluster_spec(topology())
    assert (await leader_tick(store, first, 10.0)).spec is not None
    assert (await read_spec(store, keys))[0] == first
    [entry] = await audit(store, keys)
    assert entry.action is AuditAction.SPEC_PUBLISHED and entry.actor == "cp-1"
    assert entry.details["prefixes.min_sessions"] == "(none) -> 3"
    # The same spec again: nothing written, no entry.
    assert (await leader_tick(store, first, 11.0)).spec is None
    assert len(await audit(store, keys)) == 1
    # Another topology: the spec is replaced and the entry names the change only.
    second = cluster_spec(topology(prefixes={"min_sessions": 2}))
    changed = (await leader_tick(store, second, 12.0)).spec
    assert changed is not None and changed.audit.details == {"prefixes.min_sessions": "3 -> 2"}
    assert (await audit(store, keys))[-1].details == {"prefixes.min_sessions": "3 -> 2"}
    assert (await read_spec(store, keys))[0] == second


async def test_a_deposed_leader_writes_nothing() -> None:
    store, keys = MemoryStore(), Keys("t")
    await store.put(LEADER, b"cp-2")  # someone else leads: the fence fails
    spec = cluster_spec(topology())
    await leader_tick(store, spec, 1.0)
    assert await store.get(keys.spec()) is None and await audit(store, keys) == []

    def not_leading() -> list[Compare]:
        raise NotLeader("cp-1")

    with pytest.raises(NotLeader):
        await leader_tick(store, spec, 2.0, not_leading)


async def test_a_replica_publishes_its_spec_when_it_becomes_leader() -> None:
    store = MemoryStore()
    t = topology(prefixes={"min_sessions": 4})
    replica = ControlPlaneReplica(topology=t, store=store, replica_id="cp-1", probe_agents=False)
    keys = replica.keys
    election = asyncio.create_task(replica.election.run())
    cycle = asyncio.create_task(replica.loop.run())  # publishes in its first leader tick
    try:
        for _ in range(200):
            if await store.get(keys.spec()) is not None:
                break
            await asyncio.sleep(0.01)
        spec, _ = await read_spec(store, keys)
        assert spec == cluster_spec(t)
        published = [e for e in await audit(store, keys) if e.action is AuditAction.SPEC_PUBLISHED]
        assert len(published) == 1
    finally:
        for task in (cycle, election):
            task.cancel()
        await asyncio.gather(cycle, election, return_exceptions=True)


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def ladder_file(tmp: Path, **recovery: float) -> Path:
    data = yaml.safe_load((ROOT / "runbooks" / "degradation.yaml").read_text())
    if recovery:
        data["recovery"].update(recovery)
    else:
        del data["recovery"]
    return write(tmp / "ladder.yaml", data)


def topo_file(tmp: Path, **extra: object) -> Path:
    return write(tmp / "topology.yaml", {**topology().model_dump(mode="json"), **extra})


def test_a_pace_in_both_the_topology_and_the_ladder_is_refused(tmp_path: Path) -> None:
    ladder_file(tmp_path, step_percent=20, step_interval_s=5)
    path = topo_file(
        tmp_path,
        degradation_ladder="ladder.yaml",
        recovery={"step_percent": 50, "step_interval_s": 5},
    )
    with pytest.raises(ConfigError) as e:
        topology_ladder(load_topology(path), path)
    text = str(e.value)
    assert "topology's recovery section says 50 % every 5s" in text
    assert "ladder.yaml says 20 % every 5s" in text


def test_one_pace_loads(tmp_path: Path) -> None:
    # The ladder's pace with the topology's defaults; the same pace in both; a ladder
    # without a recovery section and the topology's pace.
    ladder_file(tmp_path, step_percent=20, step_interval_s=5)
    path = topo_file(tmp_path, degradation_ladder="ladder.yaml")
    assert topology_ladder(load_topology(path), path) is not None
    path = topo_file(
        tmp_path,
        degradation_ladder="ladder.yaml",
        recovery={"step_percent": 20, "step_interval_s": 5},
    )
    assert topology_ladder(load_topology(path), path) is not None
    ladder_file(tmp_path)
    path = topo_file(tmp_path, degradation_ladder="ladder.yaml", recovery={"step_percent": 50})
    ladder = topology_ladder(load_topology(path), path)
    assert ladder is not None and "recovery" not in ladder.model_fields_set
    check_recovery_pace(load_topology(path), ladder)  # no raise


def test_the_shipped_example_and_the_labs_topology_still_load(tmp_path: Path) -> None:
    example = ROOT / "examples" / "topology.yaml"
    assert topology_ladder(load_topology(example), example) is not None
    spec = DeploymentSpec()
    ladder = compressed_ladder(spec, tmp_path / "ladder.yaml")
    ports = {r: 1 for r in spec.regions}
    data = local_topology(spec, ("127.0.0.1:2379",), ports, {r: [] for r in spec.regions}, ladder)
    path = write(tmp_path / "topology.yaml", data)
    assert topology_ladder(load_topology(path), path) is not None


def test_the_spec_round_trips_through_its_json() -> None:
    spec = cluster_spec(topology())
    assert ClusterSpec.model_validate_json(spec.model_dump_json()) == spec


async def test_a_gateway_refuses_a_topology_the_spec_disagrees_with(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from regions.gateway.app import AppConfig
    from regions.gateway.server import GatewayOptions, GatewayServer

    store, keys = MemoryStore(), Keys("t")

    def gateway(t: Topology) -> GatewayServer:
        options = GatewayOptions(topology=t, app=AppConfig(home="east"), grace_s=0.1)
        return GatewayServer(options, store=store)

    # No spec yet (no leader has run): a warning, and it serves.
    first = gateway(topology())
    try:
        await first.start()
        assert first.port
        assert "no cluster spec at /tectonic/t/spec yet" in caplog.text
    finally:
        await first.stop()
    await store.put(LEADER, b"cp-1")
    await store.put(keys.spec(), encode(cluster_spec(topology())))  # as a leader published it
    # Another K, and another recovery pace (which is not the gateway's to check).
    other = gateway(topology(prefixes={"min_sessions": 2}, recovery={"step_percent": 50}))
    try:
        with pytest.raises(SpecDisagreement) as e:
            await other.start()
        assert e.value.problems == (
            "prefixes.min_sessions: this process's topology says 2, the cluster spec in etcd "
            "says 3",
        )
        assert "prefixes.min_sessions" in str(e.value)
        assert other.port == 0  # never listened
    finally:
        await other.stop()
