"""Faults on pods through Chaos Mesh: its objects (chaos/kube/manifests.py) created
only when its API answers, and deleted by the drill's label, so also after the drill
process restarted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from chaos.kube.manifests import (
    CHAOS_GROUP,
    CHAOS_VERSION,
    FaultRefused,
    chaos_objects,
    drill_selector,
)
from chaos.kube.pods import KubeDrillError, Note, RegionPods, refused
from chaos.kube.workloads import endpoints

CHAOS_PLURALS = ("httpchaos", "networkchaos")


async def installed(api: ApiClient, timeout_s: float) -> bool:
    """Whether ``GET /apis/chaos-mesh.org/v1alpha1`` answers."""
    try:
        await CustomObjectsApi(api).get_api_resources(
            CHAOS_GROUP, CHAOS_VERSION, _request_timeout=timeout_s
        )
    except ApiException as e:
        if e.status == 404:
            return False
        raise KubeDrillError(refused(f"discover {CHAOS_GROUP}/{CHAOS_VERSION}", e)) from e
    return True


async def inject(
    api: ApiClient,
    region: str,
    r: RegionPods,
    fault: Mapping[str, object],
    *,
    timeout_s: float,
    duration_s: int,
    note: Note,
) -> list[str]:
    """Create the fault's Chaos Mesh objects on the region's pods; their names."""
    if not await installed(api, timeout_s):
        raise KubeDrillError(
            f"Chaos Mesh is not installed in this cluster (GET /apis/{CHAOS_GROUP}/"
            f"{CHAOS_VERSION} answered 404): latency and 5xx faults on pods need its "
            "HTTPChaos and NetworkChaos CRDs; install Chaos Mesh, or drill on the "
            "lab's simulators"
        )
    found = await endpoints(api, r, timeout_s)
    if not found:
        raise KubeDrillError(f"Service {r.namespace}/{r.service} has no endpoints to fault")
    try:
        objects = chaos_objects(
            region,
            r.namespace,
            r.labels,
            fault,
            pods=sum(e.routable for e in found),
            port=found[0].port,
            duration_s=duration_s,
        )
    except FaultRefused as e:
        raise KubeDrillError(str(e)) from e
    custom, made = CustomObjectsApi(api), []
    for obj in objects:
        try:
            await custom.create_namespaced_custom_object(
                CHAOS_GROUP, CHAOS_VERSION, r.namespace, obj.plural, obj.body,
                _request_timeout=timeout_s,
            )  # fmt: skip
        except ApiException as e:
            raise KubeDrillError(refused(f"create {obj.plural} {obj.name}", e)) from e
        made.append(f"{obj.plural}/{obj.name}")
    note("chaos_objects", made)
    if notes := [o.note for o in objects if o.note]:
        note("notes", notes)
    return made


async def clear(
    api: ApiClient, region: str, r: RegionPods, *, timeout_s: float, note: Note
) -> list[str]:
    """Delete every Chaos Mesh object the drill made for the region; their names."""
    if not await installed(api, timeout_s):
        return []  # nothing can have been injected
    custom, cleared = CustomObjectsApi(api), []
    for plural in CHAOS_PLURALS:
        page = await custom.list_namespaced_custom_object(
            CHAOS_GROUP, CHAOS_VERSION, r.namespace, plural,
            label_selector=drill_selector(region), _request_timeout=timeout_s,
        )  # fmt: skip
        for item in _items(page):
            name = str(item["metadata"]["name"])
            try:
                await custom.delete_namespaced_custom_object(
                    CHAOS_GROUP, CHAOS_VERSION, r.namespace, plural, name,
                    _request_timeout=timeout_s,
                )  # fmt: skip
            except ApiException as e:
                if e.status != 404:
                    raise KubeDrillError(refused(f"delete {plural} {name}", e)) from e
                continue
            cleared.append(f"{plural}/{name}")
    note("chaos_objects_deleted", cleared)
    return cleared


def _items(page: Any) -> list[dict[str, Any]]:
    items = page.get("items") if isinstance(page, dict) else None
    return [i for i in items or () if isinstance(i, dict)]
