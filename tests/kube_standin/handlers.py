"""The stand-in API server's other handlers (tests/kube_standin/): pods (get, a
strategic-merge or JSON merge patch of maps, delete with a grace period), the scale of
Deployments and StatefulSets (a stale ``metadata.resourceVersion``: 409),
NetworkPolicies (stored, never enforced), Chaos Mesh (its API discovery and its
HTTPChaos / NetworkChaos objects: stored, never acted on) and the autoscalers that could
target a workload (HorizontalPodAutoscalers and KEDA ScaledObjects: listed, never acted
on; KEDA's CRD absent answers 404, a resource in ``forbidden`` 403).
"""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web
from kubernetes_asyncio.client import (
    V1APIResource,
    V1APIResourceList,
    V1ListMeta,
    V1NetworkPolicyList,
    V1ObjectMeta,
    V1Scale,
    V1ScaleSpec,
    V1ScaleStatus,
    V2HorizontalPodAutoscalerList,
)

from tests.kube_standin.controllers import Controllers
from tests.kube_standin.records import (
    CHAOS_GROUP,
    CHAOS_KINDS,
    CHAOS_VERSION,
    KEDA_GROUP,
    KEDA_VERSION,
    PodState,
    WorkloadState,
    merge_patch,
    parse_selector,
)


class Handlers(Controllers):
    """Pods, scale, NetworkPolicies and Chaos Mesh, over the controllers."""

    # -- pods: get, patch, delete --------------------------------------------------------
    def _pod(self, request: web.Request) -> PodState | None:
        p = self.pods.get(request.match_info["name"])
        if p is None or p.model.metadata.namespace != request.match_info["ns"]:
            return None
        return p

    async def _get_pod(self, request: web.Request) -> web.Response:
        p = self._pod(request)
        if p is None:
            return self._status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        return self._answer(p.model)

    async def _patch_pod(self, request: web.Request) -> web.Response:
        ctype = request.headers.get("Content-Type", "")
        if ctype not in ("application/strategic-merge-patch+json", "application/merge-patch+json"):
            return self._status(
                415, "UnsupportedMediaType", f"the stand-in merges maps only: {ctype}"
            )
        p = self._pod(request)
        if p is None:
            return self._status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        patch = await self._body(request)
        if _has_list(patch):
            return self._status(422, "Invalid", "the stand-in patches maps only (no lists)")
        status = p.model.status
        merged = merge_patch(self._pod_json(p), patch)
        p.model = self._model(merged, "V1Pod")
        p.model.status = status  # a patch of the pod does not touch its status
        self._touch(p)
        return self._answer(p.model)

    async def _delete_pod(self, request: web.Request) -> web.Response:
        p = self._pod(request)
        if p is None:
            return self._status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        body = await self._body(request) or {}
        grace = request.query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        grace_s = self.termination_s if grace is None else float(grace)
        if grace_s <= 0:
            await self._remove_after(p, 0)
        else:
            self._terminate(p, grace_s)
        return self._answer(p.model)

    # -- scale ---------------------------------------------------------------------------
    def _workload(self, request: web.Request) -> WorkloadState | None:
        kind = "deployment" if "/deployments/" in request.path else "statefulset"
        w = self.workloads.get(f"{kind}/{request.match_info['name']}")
        return w if w is not None and w.namespace == request.match_info["ns"] else None

    def _scale(self, w: WorkloadState) -> V1Scale:
        live = [p for p in self.pods.values() if p.workload == f"{w.kind}/{w.name}"]
        return V1Scale(
            api_version="autoscaling/v1",
            kind="Scale",
            metadata=V1ObjectMeta(
                name=w.name, namespace=w.namespace, resource_version=str(w.version)
            ),
            spec=V1ScaleSpec(replicas=w.replicas),
            status=V1ScaleStatus(
                replicas=len(live), selector=",".join(f"{k}={v}" for k, v in w.labels.items())
            ),
        )

    async def _get_scale(self, request: web.Request) -> web.Response:
        w = self._workload(request)
        if w is None:
            return self._status(404, "NotFound", f"no workload {request.match_info['name']}")
        return self._answer(self._scale(w))

    async def _patch_scale(self, request: web.Request) -> web.Response:
        w = self._workload(request)
        if w is None:
            return self._status(404, "NotFound", f"no workload {request.match_info['name']}")
        patch = await self._body(request) or {}
        wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != str(w.version):
            return self._status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes "
                "to the latest version and try again",
            )
        replicas = (patch.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            return self._status(422, "Invalid", f"spec.replicas: {replicas!r}")
        self._set_replicas(w, replicas)
        return self._answer(self._scale(w))

    # -- network policies ----------------------------------------------------------------
    async def _list_policies(self, request: web.Request) -> web.Response:
        items = list(self.network_policies.values())
        return self._answer(
            V1NetworkPolicyList(
                api_version="networking.k8s.io/v1",
                kind="NetworkPolicyList",
                items=items,
                metadata=V1ListMeta(resource_version=str(self._rv)),
            )
        )

    async def _create_policy(self, request: web.Request) -> web.Response:
        policy = self._model(await self._body(request), "V1NetworkPolicy")
        name = policy.metadata.name
        if name in self.network_policies:
            return self._status(409, "AlreadyExists", f'networkpolicies "{name}" already exists')
        policy.metadata.namespace = request.match_info["ns"]
        policy.metadata.resource_version = str(self._next_rv())
        policy.metadata.uid = secrets.token_hex(8)
        self.network_policies[name] = policy
        return self._answer(policy, 201)

    async def _delete_policy(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if self.network_policies.pop(name, None) is None:
            return self._status(404, "NotFound", f'networkpolicies "{name}" not found')
        return self._status(200, "", f"networkpolicy {name} deleted")

    # -- Chaos Mesh ----------------------------------------------------------------------
    async def _chaos_discovery(self, request: web.Request) -> web.Response:
        if not self.chaos_mesh:
            return self._status(404, "NotFound", "the server could not find the requested resource")
        resources = [
            V1APIResource(
                name=plural,
                singular_name=plural,
                kind=kind,
                namespaced=True,
                verbs=["create", "delete", "get", "list", "patch", "update", "watch"],
            )
            for plural, kind in CHAOS_KINDS.items()
        ]
        return self._answer(
            V1APIResourceList(
                api_version="v1",
                kind="APIResourceList",
                group_version=f"{CHAOS_GROUP}/{CHAOS_VERSION}",
                resources=resources,
            )
        )

    def _chaos_kind(self, request: web.Request) -> str | None:
        plural = request.match_info["plural"]
        return plural if self.chaos_mesh and plural in CHAOS_KINDS else None

    async def _list_chaos(self, request: web.Request) -> web.Response:
        plural = self._chaos_kind(request)
        if plural is None:
            return self._status(404, "NotFound", "the server could not find the requested resource")
        match = parse_selector(request.query.get("labelSelector", ""))
        items = [
            o
            for (p, _), o in self.chaos.items()
            if p == plural and match((o.get("metadata") or {}).get("labels") or {})
        ]
        meta = self._json(V1ListMeta(resource_version=str(self._rv)))
        # a custom resource has no model: the list is the objects the client created
        kind = CHAOS_KINDS[plural] + "List"
        return web.json_response(
            {
                "apiVersion": f"{CHAOS_GROUP}/{CHAOS_VERSION}",
                "kind": kind,
                "items": items,
                "metadata": meta,
            }
        )

    async def _create_chaos(self, request: web.Request) -> web.Response:
        plural = self._chaos_kind(request)
        if plural is None:
            return self._status(404, "NotFound", "the server could not find the requested resource")
        obj = await self._body(request)
        meta = self._model(obj.get("metadata") or {}, "V1ObjectMeta")
        meta.namespace = request.match_info["ns"]
        meta.resource_version = str(self._next_rv())
        meta.uid = secrets.token_hex(8)
        if (plural, meta.name) in self.chaos:
            return self._status(409, "AlreadyExists", f'{plural} "{meta.name}" already exists')
        obj = {**obj, "metadata": self._json(meta)}
        self.chaos[(plural, meta.name)] = obj
        return web.json_response(obj, status=201)

    async def _delete_chaos(self, request: web.Request) -> web.Response:
        plural = self._chaos_kind(request)
        name = request.match_info["name"]
        if plural is None or self.chaos.pop((plural, name), None) is None:
            return self._status(
                404, "NotFound", f'{request.match_info["plural"]} "{name}" not found'
            )
        return self._status(200, "", f"{plural} {name} deleted")

    # -- autoscalers: listed, never acted on ----------------------------------------------
    def _forbidden(self, request: web.Request, plural: str, group: str) -> web.Response | None:
        """403 as RBAC words it, for a resource the test put in ``forbidden``."""
        if plural not in self.forbidden:
            return None
        return self._status(
            403,
            "Forbidden",
            f'{plural}.{group} is forbidden: User "system:serviceaccount:{self.namespace}:'
            f'tectonic" cannot list resource "{plural}" in API group "{group}" in the '
            f'namespace "{request.match_info["ns"]}"',
        )

    async def _list_hpas(self, request: web.Request) -> web.Response:
        refused = self._forbidden(request, "horizontalpodautoscalers", "autoscaling")
        if refused is not None:
            return refused
        ns = request.match_info["ns"]
        return self._answer(
            V2HorizontalPodAutoscalerList(
                api_version="autoscaling/v2",
                kind="HorizontalPodAutoscalerList",
                items=[h for h in self.hpas.values() if h.metadata.namespace == ns],
                metadata=V1ListMeta(resource_version=str(self._rv)),
            )
        )

    async def _list_scaled_objects(self, request: web.Request) -> web.Response:
        if not self.keda:  # no CRD: the API server knows no such resource
            return self._status(404, "NotFound", "the server could not find the requested resource")
        refused = self._forbidden(request, "scaledobjects", KEDA_GROUP)
        if refused is not None:
            return refused
        ns = request.match_info["ns"]
        items = [
            o
            for o in self.scaled_objects.values()
            if (o.get("metadata") or {}).get("namespace") == ns
        ]
        # a custom resource has no model: the list is the objects as stored
        return web.json_response(
            {
                "apiVersion": f"{KEDA_GROUP}/{KEDA_VERSION}",
                "kind": "ScaledObjectList",
                "items": items,
                "metadata": self._json(V1ListMeta(resource_version=str(self._rv))),
            }
        )


def _has_list(value: Any) -> bool:
    if isinstance(value, list):
        return True
    return isinstance(value, dict) and any(_has_list(v) for v in value.values())
