"""A region's workload during a drill: its scale read and set, and its Service's
endpoints read and waited for."""

from __future__ import annotations

import asyncio
import time

from kubernetes_asyncio.client import ApiClient, AppsV1Api, DiscoveryV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from chaos.kube.pods import KubeDrillError, RegionPods, refused
from regions.kube.endpoints import KubeEndpoint, fold_slices, service_selector
from regions.kube.workload import Workload


async def read_replicas(api: ApiClient, w: Workload, timeout_s: float) -> tuple[int, str]:
    """The workload's ``replicas`` and the scale's resource version."""
    apps = AppsV1Api(api)
    try:
        if w.kind == "deployment":
            s = await apps.read_namespaced_deployment_scale(
                w.name, w.namespace, _request_timeout=timeout_s
            )
        else:
            s = await apps.read_namespaced_stateful_set_scale(
                w.name, w.namespace, _request_timeout=timeout_s
            )
    except ApiException as e:
        raise KubeDrillError(refused(f"read the scale of {w}", e)) from e
    return int(s.spec.replicas or 0), str(s.metadata.resource_version)


async def set_replicas(api: ApiClient, w: Workload, replicas: int, timeout_s: float) -> None:
    apps, body = AppsV1Api(api), {"spec": {"replicas": replicas}}
    try:
        if w.kind == "deployment":
            await apps.patch_namespaced_deployment_scale(
                w.name, w.namespace, body, _request_timeout=timeout_s
            )
        else:
            await apps.patch_namespaced_stateful_set_scale(
                w.name, w.namespace, body, _request_timeout=timeout_s
            )
    except ApiException as e:
        raise KubeDrillError(refused(f"scale {w} to {replicas}", e)) from e


async def endpoints(api: ApiClient, r: RegionPods, timeout_s: float) -> tuple[KubeEndpoint, ...]:
    """Every endpoint of the region's Service now, routable or not."""
    page = await DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        r.namespace, label_selector=service_selector(r.service), _request_timeout=timeout_s
    )
    return fold_slices(page.items or (), port_name=r.port_name)


async def routable(api: ApiClient, r: RegionPods, timeout_s: float) -> list[str]:
    """The URLs of the region's routable endpoints now."""
    return [e.url for e in await endpoints(api, r, timeout_s) if e.routable]


async def wait_routable(
    api: ApiClient, r: RegionPods, w: Workload, *, timeout_s: float, ready_timeout_s: float
) -> list[str]:
    """Until the Service lists the workload's ``replicas`` routable endpoints and no
    other (the deleted pods' are gone)."""
    deadline = time.monotonic() + ready_timeout_s
    while True:
        replicas, _ = await read_replicas(api, w, timeout_s)
        found = await endpoints(api, r, timeout_s)
        urls = [e.url for e in found if e.routable]
        if len(urls) >= replicas and len(found) == len(urls):
            return urls
        if time.monotonic() > deadline:
            raise KubeDrillError(
                f"{w}: {len(urls)} of {replicas} endpoint(s) routable in Service "
                f"{r.namespace}/{r.service} after {ready_timeout_s:g}s"
            )
        await asyncio.sleep(0.25)
