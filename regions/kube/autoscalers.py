"""Who else scales a warm pool's workload: the HorizontalPodAutoscalers (autoscaling/v2)
and KEDA ScaledObjects (keda.sh/v1alpha1) of its namespace whose ``scaleTargetRef`` is
that workload. Either would fight the pool over ``replicas`` (the pool scales up by
one, the autoscaler back to its own count).

    found = await autoscalers_of(api, Workload.parse("deployment/vllm-east", "models"))
    # ["HorizontalPodAutoscaler vllm-east (autoscaling/v2)",
    #  "ScaledObject vllm-east-keda (keda.sh/v1alpha1)"]

A cluster without KEDA's CRD answers 404 for scaledobjects: none there. Any other
failure to list (403: RBAC; the API unreachable) raises :class:`AutoscalersUnknown`,
whose message says which permission to grant: not knowing is not "none". The HPA that
KEDA makes for each ScaledObject (owned by it) is named through its ScaledObject only:
removing that HPA would not help, KEDA makes it again.

:class:`AdvisoryLauncher`: the pool's launcher when the pool file says ``advisory:
true`` (an HPA or KEDA scales the workload; Tectonic publishes what it wants and scales
nothing). It never patches the scale subresource: a launch takes a pod that runs and
the pool does not hold yet (waiting for one the autoscaler has asked for), and is
refused at once when the workload's ``replicas`` leaves none; a stop lets go of the pod
and leaves it running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, AutoscalingV2Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from regions.kube.discovery import EndpointSliceDiscovery
from regions.kube.launcher import KubernetesLauncher
from regions.kube.workload import Workload
from regions.pool.launchers import LaunchRefused

log = logging.getLogger("tectonic.kube.autoscalers")
HPA_API = "autoscaling/v2"
KEDA_GROUP, KEDA_VERSION = "keda.sh", "v1alpha1"
KEDA_API = f"{KEDA_GROUP}/{KEDA_VERSION}"
_DEFAULT_KIND, _DEFAULT_API = "Deployment", "apps/v1"  # KEDA's defaults for a target


class AutoscalersUnknown(RuntimeError):
    """The workload's autoscalers cannot be listed; the message says what to grant."""


async def autoscalers_of(
    api: ApiClient, workload: Workload, *, request_timeout_s: float = 15.0
) -> list[str]:
    """The HPAs and ScaledObjects whose target is ``workload``, by kind, name and API,
    e.g. ``HorizontalPodAutoscaler vllm-east (autoscaling/v2)``; see the module
    docstring. Raises :class:`AutoscalersUnknown` when they cannot be listed."""
    scaled = await _scaled_objects(api, workload, request_timeout_s)
    hpas = await _hpas(api, workload, request_timeout_s)
    made_by_keda = {f"ScaledObject {name}" for name in scaled}
    return [
        f"HorizontalPodAutoscaler {name} ({HPA_API})"
        for name, owners in hpas
        if not made_by_keda & owners
    ] + [f"ScaledObject {name} ({KEDA_API})" for name in scaled]


def targets(ref: Mapping[str, Any], workload: Workload) -> bool:
    """Whether a ``scaleTargetRef`` (kind, name, apiVersion; KEDA's defaults when left
    out) names ``workload``: same name, same kind, API group apps (any version)."""
    kind = ref.get("kind") or _DEFAULT_KIND
    group = (ref.get("apiVersion") or _DEFAULT_API).rpartition("/")[0]
    return ref.get("name") == workload.name and kind.lower() == workload.kind and group == "apps"


async def _hpas(api: ApiClient, workload: Workload, timeout_s: float) -> list[tuple[str, set[str]]]:
    """(name, its owners as ``Kind name``) of each HPA targeting ``workload``."""
    try:
        answer = await AutoscalingV2Api(api).list_namespaced_horizontal_pod_autoscaler(
            workload.namespace, _request_timeout=timeout_s
        )
    except (ApiException, aiohttp.ClientError, OSError, TimeoutError) as e:
        raise _unknown("horizontalpodautoscalers", "autoscaling", workload, e) from e
    found = []
    for hpa in answer.items or ():
        ref = hpa.spec.scale_target_ref if hpa.spec else None
        if ref is None:
            continue
        as_map = {"kind": ref.kind, "name": ref.name, "apiVersion": ref.api_version}
        if targets(as_map, workload):
            owners = {f"{o.kind} {o.name}" for o in hpa.metadata.owner_references or ()}
            found.append((str(hpa.metadata.name), owners))
    return found


async def _scaled_objects(api: ApiClient, workload: Workload, timeout_s: float) -> list[str]:
    """The names of the ScaledObjects targeting ``workload`` (none without KEDA)."""
    try:
        answer = await CustomObjectsApi(api).list_namespaced_custom_object(
            KEDA_GROUP,
            KEDA_VERSION,
            workload.namespace,
            "scaledobjects",
            _request_timeout=timeout_s,
        )
    except ApiException as e:
        if e.status == 404:
            return []  # KEDA's CRD is not installed: nothing of KEDA's can scale it
        raise _unknown("scaledobjects", KEDA_GROUP, workload, e) from e
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise _unknown("scaledobjects", KEDA_GROUP, workload, e) from e
    found = []
    for obj in (answer or {}).get("items") or ():
        ref = (obj.get("spec") or {}).get("scaleTargetRef") or {}
        if targets(ref, workload):
            found.append(str((obj.get("metadata") or {}).get("name")))
    return found


def _unknown(plural: str, group: str, workload: Workload, e: Exception) -> AutoscalersUnknown:
    ns = workload.namespace
    what = f"cannot list {plural} (API group {group}) in namespace {ns}"
    if not isinstance(e, ApiException):
        return AutoscalersUnknown(f"{what}: the Kubernetes API did not answer: {e!r}")
    answer = f"{what}: HTTP {e.status} {e.reason}"
    if e.status in (401, 403):
        return AutoscalersUnknown(
            f"{answer}: grant the agent's service account 'list' on {plural} in API group "
            f"{group} in namespace {ns} (the Helm chart's agent Role does)"
        )
    return AutoscalersUnknown(answer)


class AdvisoryLauncher(KubernetesLauncher):
    """``advisory: true``: the workload's pods as its autoscaler runs them, never
    scaled by the pool; see the module docstring."""

    def __init__(
        self, discovery: EndpointSliceDiscovery, workload: Workload, **timeouts: float
    ) -> None:
        super().__init__(discovery, workload, **timeouts)
        self._told: set[str] = set()  # what was logged once already

    async def _scale(self, change: Callable[[int], int], why: str) -> int:
        # The one place the base class writes the scale subresource: never, here. A
        # launch gets here only when the workload runs no pod the pool does not hold.
        self._once(
            "launch",
            "advisory: the pool never scales %s (its autoscaler does): a launch takes a "
            "pod that runs and the pool does not hold yet, or waits for the next",
            self.workload,
        )
        raise LaunchRefused(
            f"advisory: {self.workload} runs no pod the pool does not hold yet; "
            "its autoscaler adds pods, Tectonic does not"
        )

    async def stop(self, url: str) -> None:
        """Let go of the pod, left running: no deletion cost, no scale-down."""
        pod = self._owned.pop(url, None)
        if pod is not None:
            self._once(
                "stop",
                "advisory: the pool lets go of pod %s of %s and leaves it running (its "
                "autoscaler removes pods, Tectonic does not)",
                pod,
                self.workload,
            )

    def _once(self, what: str, message: str, *args: object) -> None:
        if what not in self._told:
            self._told.add(what)
            log.info(message, *args)
        else:
            log.debug(message, *args)
