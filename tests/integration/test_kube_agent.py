"""The region agent on Kubernetes (``--discovery kubernetes``, ``--pool-launcher
kubernetes``) against a STAND-IN API server (tests/kube_standin/) that speaks the
Kubernetes API's wire protocol; it is not a real kube-apiserver, which cannot run here.
The pods are real simulators on 127.0.0.x that the agent probes over real HTTP.

What is shown: the agent's replicas are the Service's routable endpoints and follow its
watch; it keeps its own /health probes of each and asks /is_sleeping, since a sleeping
vLLM is Ready to the kubelet (the EndpointSlice still lists it): a sleeping replica is
neither probed nor counted until it wakes. With a kubernetes pool the agent takes the
workload's running pods as its replicas, labels them with their pool state, publishes
the ACTIVE ones, and leaves the pods running when it stops."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import until
from controlplane.kernel.codec import decode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Health
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from regions.agent.kube_wiring import KubeDiscoveryConfig
from regions.agent.pool_config import load_pool_config
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from regions.kube.pod_labels import POOL_STATE_LABEL
from tests.kube_standin.server import StandIn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
NS, APP = "models", {"app": "vllm", "tectonic.io/region": "eu"}


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    s = StandIn(tmp_path, namespace=NS, termination_s=0.2).start()
    try:
        yield s
    finally:
        s.stop()


def kube(standin: StandIn) -> KubeDiscoveryConfig:
    return KubeDiscoveryConfig(
        namespace=NS, service="vllm", port_name="http", kubeconfig=str(standin.kubeconfig)
    )


def probed(handle: AgentHandle) -> list[str]:
    return sorted(p.url for p in handle.view.probes)


def urls(standin: StandIn) -> list[str]:
    return sorted(p.url for p in standin.pods_of("deployment", "vllm") if p.ready)


async def test_the_agent_probes_the_discovered_replicas_and_not_the_sleeping_ones(
    standin: StandIn,
) -> None:
    await standin.add_workload("deployment", "vllm", 2, APP, service="vllm")
    config = AgentConfig(region="eu", kube=kube(standin), interval=0.2, timeout=0.2)
    handle = await serve_agent(config)
    try:
        assert probed(handle) == urls(standin)  # listed before the first probe
        assert handle.view.health is Health.HEALTHY
        assert handle.view.signals["replicas_up"] == 2

        await standin.scale("deployment", "vllm", 3)

        async def three() -> bool:
            return len(probed(handle)) == 3 and all(p.up for p in handle.view.probes)

        await until(three, within=30, what="the third pod probed")
        assert probed(handle) == urls(standin)

        asleep = urls(standin)[0]
        async with aiohttp.ClientSession() as http:
            async with http.post(asleep + "/sleep", params={"level": "1"}) as r:
                assert r.status == 200

            async def skipped() -> bool:
                return asleep not in probed(handle)

            await until(skipped, within=10, what="the sleeping replica left out")
            assert handle.kube is not None and handle.kube.replicas.sleeping() == [asleep]
            assert asleep not in handle.replica_set.active()
            assert asleep in handle.kube.discovery.urls()  # Ready to Kubernetes all along
            async with http.post(asleep + "/wake_up") as r:
                assert r.status == 200

            async def back() -> bool:
                return asleep in probed(handle)

            await until(back, within=10, what="the woken replica probed again")
    finally:
        await handle.stop()


@pytest.mark.etcd
async def test_an_agent_with_a_kubernetes_pool_labels_publishes_and_leaves_the_pods(
    standin: StandIn, etcd: EtcdServer, cluster_name: str
) -> None:
    await standin.add_workload("deployment", "vllm", 2, APP, service="vllm")
    pool = load_pool_config(None, {"kind": "kubernetes", "workload": "deployment/vllm"})
    config = AgentConfig(
        region="eu",
        kube=kube(standin),
        pool=pool,
        etcd=tuple(etcd.endpoints),
        cluster=cluster_name,
        interval=0.2,
        timeout=0.2,
    )
    handle = await serve_agent(config)
    store = EtcdStore(EtcdConfig(endpoints=tuple(etcd.endpoints)))
    await store.connect()
    try:
        assert handle.pool is not None and handle.kube is not None
        (active,) = handle.pool.active()
        assert standin.replicas("deployment", "vllm") == 2  # its pods taken, none added
        labeler = handle.kube.labeler
        assert labeler is not None
        await labeler.flushed()
        labels = {
            p.url: p.labels.get(POOL_STATE_LABEL) for p in standin.pods_of("deployment", "vllm")
        }
        assert labels == {u: "active" if u == active else "warm" for u in urls(standin)}

        async def published() -> bool:
            kv = await store.get(Keys(cluster_name).pool("eu"))
            return kv is not None and decode(PoolMembers, kv.value, kv.key).active == (active,)

        await until(published, within=10, what="the ACTIVE pod published")
        assert probed(handle) == [active]
    finally:
        await handle.stop()
        await store.close()
    await asyncio.sleep(0.5)  # anything the stop would do to the pods, it did by now
    assert standin.replicas("deployment", "vllm") == 2
    assert len([p for p in standin.pods_of("deployment", "vllm") if p.ready]) == 2
