"""The warm pool on Kubernetes: ``KubernetesLauncher`` (regions/kube/launcher.py) and the
pool-state labels (regions/kube/pod_labels.py), against a STAND-IN API server
(tests/kube_standin/) that speaks the API's wire protocol and plays the Deployment,
StatefulSet and EndpointSlice controllers; it is not a real kube-apiserver, which
cannot run here. The pods are real simulators on 127.0.0.x: the pool sleeps and wakes
them over vLLM's HTTP API.

What is shown: a launch takes a pod that runs and nobody owns before it scales; it
raises the scale subresource by one (with the version it read as a precondition) and
returns the new pod's endpoint; two launches at once get two pods; a stop annotates
exactly the chosen pod with the lowest deletion cost, then scales down, and that pod is
the one the controller removes; a StatefulSet only stops its highest ordinal; a pod
that never gets ready times out with a reason and no second scale-up; a launch
cancelled while its pod starts scales back down (not once the agent detached); the
labels follow the pool's states."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from chaos.lab.procs import until
from regions.kube.client import KubeConnection
from regions.kube.discovery import EndpointSliceDiscovery
from regions.kube.launcher import DELETION_COST, KubernetesLauncher, StopRefused
from regions.kube.pod_labels import POOL_STATE_LABEL, PodStateLabeler
from regions.kube.workload import Workload
from regions.pool.launchers import LaunchRefused
from regions.pool.manager import WarmPool
from regions.pool.states import PoolConfig, Replica, ReplicaState, died
from tests.kube_standin.server import StandIn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
NS, APP = "models", {"app": "vllm"}
SCALE = f"/apis/apps/v1/namespaces/{NS}/deployments/vllm/scale"


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    s = StandIn(tmp_path, namespace=NS, termination_s=0.2).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
async def discovery(standin: StandIn) -> AsyncIterator[EndpointSliceDiscovery]:
    conn = KubeConnection(standin.kubeconfig)
    d = EndpointSliceDiscovery(conn, NS, "vllm", port_name="http")
    try:
        yield d
    finally:
        await d.stop()
        await conn.close()


async def started(d: EndpointSliceDiscovery) -> None:
    await d.start()
    d.run_in_background()


def launcher_for(
    d: EndpointSliceDiscovery, workload: str = "deployment/vllm", **kw: float
) -> KubernetesLauncher:
    return KubernetesLauncher(d, Workload.parse(workload, NS), **{"ready_timeout_s": 60.0, **kw})


async def test_a_launch_takes_a_running_pod_first_then_scales_up_and_returns_the_new_one(
    standin: StandIn, discovery: EndpointSliceDiscovery
) -> None:
    await standin.add_workload("deployment", "vllm", 1, APP, service="vllm")
    await started(discovery)
    launcher = launcher_for(discovery)
    mark = standin.mark()
    first = await launcher.launch()
    (running,) = standin.pods_of("deployment", "vllm")
    assert first == running.url
    assert not [c for c in standin.calls_since(mark) if c.method == "PATCH"]  # taken, not scaled

    second = await launcher.launch()
    assert standin.replicas("deployment", "vllm") == 2
    new = standin.pod_at(second)
    assert new is not None and new.name != running.name and new.ready
    async with aiohttp.ClientSession() as http, http.get(second + "/health") as r:
        assert r.status == 200
    (patch,) = [c for c in standin.calls_since(mark) if c.method == "PATCH"]
    assert patch.path == SCALE
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert patch.body["spec"] == {"replicas": 2}
    assert patch.body["metadata"]["resourceVersion"]  # the version read: a precondition
    assert launcher.owned() == {first: running.name, second: new.name}


async def test_two_launches_at_once_scale_by_two_and_get_a_pod_each(
    standin: StandIn, discovery: EndpointSliceDiscovery
) -> None:
    await standin.add_workload("deployment", "vllm", 0, APP, service="vllm")
    await started(discovery)
    launcher = launcher_for(discovery)
    urls = await asyncio.gather(launcher.launch(), launcher.launch())
    assert len(set(urls)) == 2
    assert standin.replicas("deployment", "vllm") == 2
    assert sorted(urls) == sorted(p.url for p in standin.pods_of("deployment", "vllm"))


async def test_a_stop_marks_exactly_that_pod_then_scales_down_and_that_pod_goes(
    standin: StandIn, discovery: EndpointSliceDiscovery
) -> None:
    await standin.add_workload("deployment", "vllm", 3, APP, service="vllm")
    await started(discovery)
    launcher = launcher_for(discovery)
    for _ in range(3):
        await launcher.launch()
    # the oldest pod: the one the controller would keep if nothing said otherwise (it
    # removes the most recently ready first)
    oldest, *others = standin.pods_of("deployment", "vllm")
    mark = standin.mark()
    await launcher.stop(oldest.url)

    calls = [c for c in standin.calls_since(mark) if c.method == "PATCH"]
    assert [c.path for c in calls] == [f"/api/v1/namespaces/{NS}/pods/{oldest.name}", SCALE]
    annotate, scale = calls
    assert annotate.body == {"metadata": {"annotations": {DELETION_COST: "-1000"}}}
    assert scale.body["spec"] == {"replicas": 2}
    await discovery.wait_until(lambda eps: len(eps) == 2, 10)
    assert sorted(p.name for p in standin.pods_of("deployment", "vllm")) == sorted(
        p.name for p in others
    )
    assert oldest.url not in launcher.owned() and len(launcher.owned()) == 2
    await launcher.stop(oldest.url)  # again: a no-op
    assert standin.replicas("deployment", "vllm") == 2


async def test_a_statefulset_stops_only_its_highest_ordinal(
    standin: StandIn, discovery: EndpointSliceDiscovery
) -> None:
    await standin.add_workload("statefulset", "vllm", 2, APP, service="vllm")
    await started(discovery)
    launcher = launcher_for(discovery, "statefulset/vllm")
    await launcher.launch()
    await launcher.launch()
    by_name = {p.name: p.url for p in standin.pods_of("statefulset", "vllm")}
    with pytest.raises(StopRefused, match="highest ordinal \\(vllm-1\\), not vllm-0"):
        await launcher.stop(by_name["vllm-0"])
    assert standin.replicas("statefulset", "vllm") == 2 and by_name["vllm-0"] in launcher.owned()
    await launcher.stop(by_name["vllm-1"])
    assert standin.replicas("statefulset", "vllm") == 1
    await discovery.wait_until(lambda eps: len(eps) == 1, 10)
    assert [p.name for p in standin.pods_of("statefulset", "vllm")] == ["vllm-0"]


async def test_a_pod_that_never_gets_ready_times_out_and_is_not_scaled_for_twice(
    standin: StandIn, discovery: EndpointSliceDiscovery
) -> None:
    await standin.add_workload("deployment", "vllm", 0, APP, service="vllm", hang=True)
    await started(discovery)
    launcher = launcher_for(discovery, ready_timeout_s=1.0)
    with pytest.raises(LaunchRefused, match=r"no new ready endpoint .* within 1s"):
        await launcher.launch()
    assert standin.replicas("deployment", "vllm") == 1
    with pytest.raises(LaunchRefused):  # the pod asked for is still coming: wait for it
        await launcher.launch()
    assert standin.replicas("deployment", "vllm") == 1
    with pytest.raises(LaunchRefused, match="one pod template"):
        await launcher.launch("no-spec-decode")


@pytest.mark.parametrize("kind", ["deployment", "statefulset"])
async def test_a_cancelled_launch_scales_back_down_unless_the_agent_detached(
    standin: StandIn, discovery: EndpointSliceDiscovery, kind: str
) -> None:
    """The pool cancels a launch its targets no longer want while the pod starts (it
    never gets ready here): ``replicas`` goes back down by one, so the pod asked for
    goes. A detached launcher (the agent shutting down) leaves it for the next agent."""
    await standin.add_workload(kind, "vllm", 0, APP, service="vllm", hang=True)
    await started(discovery)
    for detached, left in ((False, 0), (True, 1)):
        launcher = launcher_for(discovery, f"{kind}/vllm")
        launching = asyncio.ensure_future(launcher.launch())

        async def scaled_up() -> bool:
            return standin.replicas(kind, "vllm") == 1

        await until(scaled_up, what="the launch's scale-up")
        if detached:
            launcher.detach()
        launching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await launching
        assert standin.replicas(kind, "vllm") == left, (detached, kind)


def labels_of(standin: StandIn) -> dict[str, str | None]:
    return {p.name: p.labels.get(POOL_STATE_LABEL) for p in standin.pods_of("deployment", "vllm")}


async def test_the_pods_carry_the_pools_state_of_their_replica(
    standin: StandIn, discovery: EndpointSliceDiscovery
) -> None:
    await standin.add_workload("deployment", "vllm", 2, APP, service="vllm")
    await started(discovery)
    launcher = launcher_for(discovery)
    labeler = PodStateLabeler(discovery.connection, NS, launcher.pod_of)
    writer = asyncio.create_task(labeler.run())
    pool = WarmPool(launcher, PoolConfig(active=1, warm=1), on_state=labeler.replica_changed)
    try:
        await pool.start()
        await labeler.flushed()
        (active,) = pool.active()
        want = {
            launcher.pod_of(r.url): r.state.value.lower() for r in pool.snapshot().replicas if r.url
        }
        assert sorted(want.values()) == ["active", "warm"]
        assert labels_of(standin) == want
        assert want[launcher.pod_of(active)] == "active"

        await pool.set_active(2)  # the WARM one is woken
        await labeler.flushed()
        assert set(labels_of(standin).values()) == {"active"}
        patches = [c for c in standin.calls if c.method == "PATCH" and "/pods/" in c.path]
        assert {c.content_type for c in patches} == {"application/strategic-merge-patch+json"}

        # a replica gone COLD (a pod still there, e.g. reaped as hung) loses its label
        url = pool.active()[0]
        pod = launcher.pod_of(url)
        before = Replica(name="r0", url=url, state=ReplicaState.ACTIVE)
        labeler.replica_changed(before, died(before, 0.0))
        await labeler.flushed()
        assert labels_of(standin)[pod] is None and POOL_STATE_LABEL not in (
            standin.pods[pod].labels  # removed, not set to an empty value
        )
    finally:
        launcher.detach()  # the pods outlive the pool: nothing is scaled down
        await pool.stop()
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
    assert standin.replicas("deployment", "vllm") == 2
