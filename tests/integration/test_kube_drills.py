"""Drills against pods: ``KubernetesDrillTarget`` (chaos/kube/target.py) against a
STAND-IN API server (tests/kube_standin/) that speaks the Kubernetes API's wire
protocol and plays the Deployment, StatefulSet and EndpointSlice controllers; it is not
a real kube-apiserver, which cannot run here, and it enforces no NetworkPolicy and runs
no Chaos Mesh (it stores their objects). The model pods are real simulators.

What is shown: a region's pods deleted with zero grace (all, or N) and the region waited
back to its replicas; the leader's pod found from its replica id and deleted, an etcd
pod deleted, both waited back; the NetworkPolicy blackout (opt-in) created, checked
from here (the stand-in enforces nothing: the check says so), and deleted; Chaos Mesh
faults refused without its API and created and cleared with it; and the
``region-blackout`` drill run by the drill runner through this target, its journal
showing each API call it made and the rollback."""

from __future__ import annotations

import ast
import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from chaos.drills.result import JournalEntry
from chaos.drills.scenario import find_scenario
from chaos.kube.pods import KubeDrillError, PodGroup, RegionPods
from chaos.kube.service import kube_run_drill
from chaos.kube.target import KubernetesDrillRunner, KubernetesDrillTarget
from chaos.lab.local_etcd import EtcdServer
from controlplane.kernel.codec import encode
from controlplane.kernel.config import ConfigError, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Health, RegionHealth, RegionRecord
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import Store
from tests.kube_standin.server import StandIn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
NS = "tectonic"
MODEL = {"app": "vllm", "tectonic.io/region": "us-east"}
CP = {"app.kubernetes.io/component": "controlplane"}
ETCD = {"app.kubernetes.io/name": "etcd"}
PODS = f"/api/v1/namespaces/{NS}/pods"


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    s = StandIn(tmp_path, namespace=NS, termination_s=0.2).start()
    try:
        yield s
    finally:
        s.stop()


async def cluster(standin: StandIn) -> None:
    await asyncio.gather(
        standin.add_workload("deployment", "vllm-us-east", 2, MODEL, service="vllm-us-east"),
        standin.add_workload("deployment", "tectonic-cp", 2, CP, process=False),
        standin.add_workload("statefulset", "etcd", 3, ETCD, process=False),
    )


def target_for(standin: StandIn, cluster_name: str = "prod", **kw: object) -> KubernetesDrillTarget:
    return KubernetesDrillTarget(
        Keys(cluster_name),
        {"us-east": RegionPods(NS, "deployment/vllm-us-east", "vllm-us-east", MODEL)},
        controlplane=PodGroup(NS, CP),
        etcd=PodGroup(NS, ETCD),
        kubeconfig=standin.kubeconfig,
        ready_timeout_s=60.0,
        **kw,  # type: ignore[arg-type]
    )


def model_pods(standin: StandIn) -> list[str]:
    return [p.name for p in standin.pods_of("deployment", "vllm-us-east")]


async def test_a_regions_pods_are_deleted_with_zero_grace_and_waited_back(
    standin: StandIn,
) -> None:
    await cluster(standin)
    target = target_for(standin)
    before = sorted(model_pods(standin))
    assert await asyncio.to_thread(target.stop_servers, "us-east") == [0, 1]
    done = target.take_detail()
    assert done["deleted_pods"] == before  # by name
    assert [c for c in done["api_calls"] if c.startswith("DELETE")] == [  # type: ignore[union-attr]
        f"DELETE {PODS}/{name}?gracePeriodSeconds=0 -> 200" for name in before
    ]
    deletes = [c for c in standin.calls if c.method == "DELETE"]
    assert {c.query["gracePeriodSeconds"] for c in deletes} == {"0"}

    urls = await asyncio.to_thread(target.start_servers, "us-east")
    after = standin.pods_of("deployment", "vllm-us-east")
    assert sorted(urls) == sorted(p.url for p in after) and len(urls) == 2
    assert not set(before) & {p.name for p in after}  # new pods, as the controller makes
    assert target.take_detail()["ready"] == urls

    assert await asyncio.to_thread(target.stop_servers, "us-east", 1) == [0]  # kill_replicas
    assert len(target.take_detail()["deleted_pods"]) == 1  # type: ignore[arg-type]
    await asyncio.to_thread(target.start_servers, "us-east")


async def test_the_leaders_pod_and_an_etcd_pod_are_deleted_and_waited_back(
    standin: StandIn,
) -> None:
    await cluster(standin)
    target = target_for(standin)
    leader, other = (p.name for p in standin.pods_of("deployment", "tectonic-cp"))
    position = await asyncio.to_thread(target.kill_controlplane, f"{leader}-4242")  # host-pid
    assert target.take_detail()["deleted_pods"] == [leader]
    assert sorted([leader, other])[position] == leader
    back = await asyncio.to_thread(target.start_controlplanes)
    assert len(back) == 2 and other in back and leader not in back
    with pytest.raises(KubeDrillError, match=r"--id=\$\(POD_NAME\)"):
        await asyncio.to_thread(target.kill_controlplane, "somewhere-else-1")

    assert await asyncio.to_thread(target.kill_etcd_member) == 0  # etcd-0
    assert target.take_detail()["deleted_pods"] == ["etcd-0"]
    assert await asyncio.to_thread(target.start_etcd_members) == [0, 1, 2]


async def test_a_network_policy_blackout_is_created_checked_and_deleted(
    standin: StandIn,
) -> None:
    await cluster(standin)
    target = target_for(standin, blackout="network-policy", check_blackout_s=0.1)
    assert await asyncio.to_thread(target.stop_servers, "us-east") == []
    (policy,) = standin.network_policies.values()
    assert policy.metadata.name == "tectonic-blackout-us-east"
    assert policy.spec.pod_selector.match_labels == MODEL
    assert policy.spec.ingress == [] and policy.spec.egress == []
    done = target.take_detail()
    assert "cannot tell which plugin runs" in str(done["enforcement"])
    # the stand-in enforces nothing, as a cluster without an enforcing plugin: said
    assert "2 of 2 pod(s) still answer" in str(done["blackout_check"])
    assert "may not enforce NetworkPolicy" in str(done["blackout_check"])
    assert len(model_pods(standin)) == 2  # nothing deleted

    await asyncio.to_thread(target.start_servers, "us-east")
    assert standin.network_policies == {}
    assert target.take_detail()["network_policy_deleted"] == f"{NS}/tectonic-blackout-us-east"


async def test_chaos_mesh_faults_are_refused_without_its_api_and_cleared_with_it(
    standin: StandIn,
) -> None:
    await cluster(standin)
    target = target_for(standin)
    with pytest.raises(KubeDrillError, match="Chaos Mesh is not installed"):
        await asyncio.to_thread(target.inject, "us-east", {"added_latency_s": 1.5})
    assert await asyncio.to_thread(target.clear_faults, "us-east") == []
    assert standin.chaos == {}

    standin.chaos_mesh = True  # its CRDs installed
    made = await asyncio.to_thread(target.inject, "us-east", {"unavailable_rate": 0.5})
    assert made == ["httpchaos/tectonic-503-us-east"]
    ((plural, name), obj) = next(iter(standin.chaos.items()))
    assert obj["spec"]["replace"] == {"code": 503} and obj["spec"]["port"] == standin.port
    assert "whole pods" in str(target.take_detail()["notes"])
    with pytest.raises(KubeDrillError, match="stream_error_after"):
        await asyncio.to_thread(target.inject, "us-east", {"stream_error_after": 3})
    assert await asyncio.to_thread(target.clear_faults, "us-east") == [f"{plural}/{name}"]
    assert standin.chaos == {}


async def seeded(store: Store, keys: Keys, leader: str, regions: list[str]) -> None:
    """What a control plane would have written: a leader, every region NORMAL and
    HEALTHY. No control plane runs here: nothing reacts to the blackout."""
    now = time.time()
    await store.put(keys.leader(), leader.encode())
    for r in regions:
        await store.put(keys.region_state(r), encode(RegionRecord(region=r, since=now)))
        health = RegionHealth(region=r, verdict=Health.HEALTHY, raw=Health.HEALTHY, since=now)
        await store.put(keys.region_health(r), encode(health))


def topology(cluster_name: str) -> object:
    regions = [
        {"name": n, "zone": "us", "agent": "127.0.0.1:9", "capacity_rps": 100}
        for n in ("us-east", "us-west")
    ]
    return parse_topology(
        {"cluster": cluster_name, "etcd": {"endpoints": ["127.0.0.1:2379"]}, "regions": regions}
    )


async def test_a_region_blackout_drill_runs_through_the_target_and_journals_its_calls(
    standin: StandIn, tmp_path: Path
) -> None:
    await cluster(standin)
    keys = Keys("prod")
    target = target_for(standin)
    store = MemoryStore()
    await seeded(
        store, keys, standin.pods_of("deployment", "tectonic-cp")[0].name, ["us-east", "us-west"]
    )
    base = find_scenario("region-blackout")
    # the scenario as it is, but for waiting on a failover: no control plane runs here
    scenario = base.model_copy(update={"observe_until": None, "observe_s": 0.5})
    runner = KubernetesDrillRunner(
        target=target,
        store=store,
        topology=topology("prod"),  # type: ignore[arg-type]
        reports_root=tmp_path / "drills",
        write_readiness=False,
        say=lambda m: None,
    )
    pods_before = model_pods(standin)
    try:
        result = await runner.run(scenario)
    finally:
        await store.close()
    journal = await asyncio.to_thread(Path(result.journal_path).read_text)
    entries = [JournalEntry.model_validate_json(line) for line in journal.splitlines()]
    fault = next(e for e in entries if e.kind == "fault")
    rollback = next(e for e in entries if e.kind == "rollback")
    assert (fault.action, fault.ok, rollback.action, rollback.ok) == (
        "stop_region",
        True,
        "start_region",
        True,
    )
    assert "killed_pids" not in fault.detail  # pods have no PIDs: their names, below
    for name in pods_before:
        assert f"DELETE {PODS}/{name}?gracePeriodSeconds=0 -> 200" in fault.detail["api_calls"]
        assert name in fault.detail["deleted_pods"]
    slices = f"GET /apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
    scale = f"GET /apis/apps/v1/namespaces/{NS}/deployments/vllm-us-east/scale -> 200"
    assert slices in rollback.detail["api_calls"] and scale in rollback.detail["api_calls"]
    new_urls = sorted(p.url for p in standin.pods_of("deployment", "vllm-us-east"))
    assert all(u in rollback.detail["ready"] for u in new_urls)
    # every call the stand-in answered is in the journal, once (the observer's first
    # read of the replicas, before the fault, with the fault's entry)
    assert "GET /apis/discovery.k8s.io" in fault.detail["api_calls_before"]
    calls = [
        call.split(" ")
        for e in entries
        for key in ("api_calls_before", "api_calls")
        if key in e.detail
        for call in ast.literal_eval(e.detail[key])
    ]  # "METHOD path?query -> status"
    journaled = Counter((method, target.split("?")[0]) for method, target, *_ in calls)
    assert journaled == Counter((c.method, c.path) for c in standin.calls)
    assert ("probe", "steady_state_before") in {(e.kind, e.action) for e in entries}
    after = next(e for e in entries if e.action == "steady_state_after")
    assert after.ok  # the seeded state still holds: nothing here fails a region over
    # the verdict stays Tectonic's, and with no control plane no failover was measured
    assert not result.passed
    assert not next(c for c in result.criteria if c.name == "state_path").passed


async def test_the_drill_service_runs_a_drill_on_the_cluster_from_its_target_file(
    standin: StandIn, tmp_path: Path, etcd_store: EtcdStore, etcd: EtcdServer
) -> None:
    """``python -m chaos --target kubernetes``'s RunDrill, built from a topology and a
    target file, on a real etcd: a dry run (the steady state is checked, nothing is
    injected) with the drill journal and report where the file says."""
    await cluster(standin)
    name = f"kube-{time.monotonic_ns()}"
    keys = Keys(name)
    await seeded(
        etcd_store, keys, standin.pods_of("deployment", "tectonic-cp")[0].name, ["us-east"]
    )
    topo = tmp_path / "topology.yaml"
    region = {"name": "us-east", "zone": "us", "agent": "127.0.0.1:9", "capacity_rps": 100}
    etcd_section = {"endpoints": [etcd.endpoint]}
    topo.write_text(yaml.safe_dump({"cluster": name, "etcd": etcd_section, "regions": [region]}))
    target = tmp_path / "drills-target.yaml"
    target.write_text(
        yaml.safe_dump(
            {
                "namespace": NS,
                "kubeconfig": str(standin.kubeconfig),
                "regions": {
                    "us-east": {
                        "workload": "deployment/vllm-us-east",
                        "service": "vllm-us-east",
                        "labels": MODEL,
                    }
                },
                "controlplane": {"labels": CP},
                "etcd": {"labels": ETCD},
                "reports": str(tmp_path / "reports"),
            }
        )
    )
    run_drill = kube_run_drill(topo, target)
    result = await run_drill("region-blackout", None, dry_run=True)
    assert result.dry_run and Path(result.journal_path).is_relative_to(tmp_path / "reports")
    assert next(c for c in result.criteria if c.name == "steady_state_before").passed
    assert not [c for c in standin.calls if c.method == "DELETE"]  # a dry run injects nothing


def test_a_bad_target_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    region = {"name": "us-east", "zone": "us", "agent": "127.0.0.1:9", "capacity_rps": 100}
    topo.write_text(yaml.safe_dump({"regions": [region]}))
    target = tmp_path / "t.yaml"
    target.write_text(yaml.safe_dump({"regions": {"us-east": {"workload": "x"}}}))
    with pytest.raises(ConfigError, match="service"):
        kube_run_drill(topo, target)
    target.write_text(
        yaml.safe_dump({"regions": {"mars": {"workload": "x", "service": "s", "labels": MODEL}}})
    )
    with pytest.raises(ConfigError, match=r"\['mars'\] are not in the topology"):
        kube_run_drill(topo, target)
    with pytest.raises(ConfigError, match="needs --topology and --target-config"):
        kube_run_drill(topo, None)
