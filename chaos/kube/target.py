"""``KubernetesDrillTarget``: the drill runner's DrillTarget over a cluster's pods.

    target = KubernetesDrillTarget(
        Keys("prod"),
        {"us-east": RegionPods("models", "deployment/vllm-us-east", "vllm-us-east",
                               {"app": "vllm", "tectonic.io/region": "us-east"})},
        controlplane=PodGroup("tectonic", {"app.kubernetes.io/component": "controlplane"}),
        etcd=PodGroup("tectonic", {"app.kubernetes.io/name": "etcd"}),
        gateways={"us-east": "http://gateway.us-east:8080"},
    )
    result = await KubernetesDrillRunner(target, store, topology, reports).run(scenario)

What each fault does (the runner calls these in a thread; each call opens its own
client, in a loop of its own, and closes it):

- ``stop_servers(region)`` (stop_region; kill_replicas with ``count``): DELETE the
  region's model pods with ``gracePeriodSeconds=0`` (``count`` of them, by name). The
  workload's controller starts new pods at once: the blackout lasts as long as they
  take to become ready. ``blackout="scale-to-zero"``: the workload is scaled to 0
  instead (``count`` still deletes pods), and back by ``start_servers``.
  ``blackout="network-policy"`` (opt-in: it isolates only where the network plugin
  enforces NetworkPolicies, which the API cannot tell; see chaos/kube/manifests.py):
  a deny-all NetworkPolicy on the region's model pods, then a check, from where the
  drill runs, of whether the pods still answer ``/health`` (said in the journal).
- ``start_servers(region)`` (start_region): undo what ``stop_servers`` did (delete the
  policy; scale back), then wait until the workload's ``replicas`` endpoints are
  routable in its Service. Returns their URLs.
- ``kill_controlplane(holder)`` (kill_leader): the leader's identity in etcd is the
  replica id its process campaigned with: the pod's name when the chart passes
  ``--id=$(POD_NAME)``, else the default ``<hostname>-<pid>``, and a pod's hostname is
  its name. The pod whose name is the id, or the id less a ``-<digits>`` tail, is
  deleted with zero grace. ``start_controlplanes`` waits until the group is back to
  the ready pods it had. ``kill_etcd_member`` / ``start_etcd_members``: the same for one
  etcd pod (the first ready one by name: the API does not say which member leads).
- ``inject(region, fault)``: Chaos Mesh objects (chaos/kube/manifests.py), only when
  ``GET /apis/chaos-mesh.org/v1alpha1`` answers; refused with a clear message when it
  does not. ``clear_faults`` deletes every object the drill made for the region (found
  by label, so also after the drill process restarted).

Every API call is recorded (:meth:`take_calls`, :meth:`take_detail`);
:class:`KubernetesDrillRunner` adds them to the journal entry of each fault and
rollback, with what was deleted or created. The DrillTarget methods return what the
Protocol says: pods have no PIDs, so ``stop_servers`` and ``kill_controlplane`` return
positions (one number per pod deleted); the names are in the journal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import aiohttp
from kubernetes_asyncio.client import (
    ApiClient,
    AppsV1Api,
    CoreV1Api,
    CustomObjectsApi,
    DiscoveryV1Api,
    NetworkingV1Api,
    V1Pod,
)
from kubernetes_asyncio.client.exceptions import ApiException

from chaos.drills.runner import DrillRunner, DrillTarget
from chaos.drills.scenario import Fault
from chaos.kube.manifests import (
    CHAOS_GROUP,
    CHAOS_VERSION,
    FaultRefused,
    blackout_policy,
    chaos_objects,
    drill_selector,
    object_name,
)
from controlplane.kernel.keys import Keys
from regions.kube.client import ApiCall, new_api_client
from regions.kube.endpoints import fold_slices, service_selector
from regions.kube.workload import Workload

log = logging.getLogger("chaos.kube.target")
T = TypeVar("T")
Blackout = Literal["delete-pods", "scale-to-zero", "network-policy"]
CHAOS_PLURALS = ("httpchaos", "networkchaos")
NOT_ENFORCED = (
    "a NetworkPolicy isolates pods only where the cluster's network plugin enforces "
    "NetworkPolicies (Calico, Cilium, Antrea...; not flannel alone); the Kubernetes API "
    "cannot tell which plugin runs, so Tectonic cannot detect it: the drill checks "
    "whether the pods still answer from where it runs, and its own observations say "
    "whether the region went dark"
)


class KubeDrillError(RuntimeError):
    """A drill action the cluster refused or that did not complete (said why)."""


@dataclass(frozen=True)
class RegionPods:
    """A region's model pods: their workload, the Service in front of them, and the
    labels that select exactly them."""

    namespace: str
    workload: str  # deployment/NAME or statefulset/NAME
    service: str
    labels: Mapping[str, str]
    port_name: str | None = "http"

    @property
    def selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels.items())


@dataclass(frozen=True)
class PodGroup:
    """Pods selected by labels (the control plane's, etcd's)."""

    namespace: str
    labels: Mapping[str, str]

    @property
    def selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels.items())


@dataclass
class _Record:
    calls: list[ApiCall] = field(default_factory=list)
    detail: dict[str, object] = field(default_factory=dict)


class KubernetesDrillTarget:
    """A DrillTarget over a cluster; see the module docstring."""

    def __init__(
        self,
        keys: Keys,
        regions: Mapping[str, RegionPods],
        *,
        gateways: Mapping[str, str] | None = None,
        data_plane_metrics: Mapping[str, str] | None = None,
        controlplane: PodGroup | None = None,
        etcd: PodGroup | None = None,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        blackout: Blackout = "delete-pods",
        ready_timeout_s: float = 600.0,
        request_timeout_s: float = 15.0,
        fault_duration_s: int = 600,
        check_blackout_s: float = 2.0,
    ) -> None:
        self.keys = keys
        self.regions = dict(regions)
        self._gateways = dict(gateways or {})
        # the processes whose /metrics carry the gateway's names: the gateways themselves
        # unless told otherwise (the endpoint pickers behind Envoy)
        self._data_plane = dict(
            self._gateways if data_plane_metrics is None else data_plane_metrics
        )
        self.controlplane, self.etcd = controlplane, etcd
        self.kubeconfig, self.context = kubeconfig, context
        self.blackout = blackout
        self.ready_timeout_s, self.request_timeout_s = ready_timeout_s, request_timeout_s
        self.fault_duration_s, self.check_blackout_s = fault_duration_s, check_blackout_s
        self._lock = threading.Lock()
        self._record = _Record()
        self._scaled_from: dict[str, int] = {}  # region -> replicas before scale-to-zero
        self._ready_before: dict[str, int] = {}  # pod group -> ready pods before a kill
        if blackout == "network-policy":
            log.warning("region blackout by NetworkPolicy: %s", NOT_ENFORCED)

    # -- the record (for the runner's journal) -----------------------------------------
    def take_calls(self) -> list[ApiCall]:
        with self._lock:
            calls, self._record.calls = self._record.calls, []
        return calls

    def take_detail(self) -> dict[str, object]:
        """What the actions since the last take did: the API calls, and the objects
        deleted or created."""
        with self._lock:
            record, self._record = self._record, _Record()
        return {**record.detail, "api_calls": [c.describe() for c in record.calls]}

    def _called(self, call: ApiCall) -> None:
        with self._lock:
            self._record.calls.append(call)

    def _note(self, key: str, value: object) -> None:
        with self._lock:
            self._record.detail[key] = value

    # -- running a coroutine from the runner's thread --------------------------------------
    def _run(self, work: Callable[[ApiClient], Awaitable[T]]) -> T:
        """``work`` with a client of its own, in a loop of its own. From a thread with a
        running loop (the runner asks ``replica_urls`` in its loop) it runs in another
        thread, and blocks this one until done."""

        async def go() -> T:
            api = await new_api_client(self.kubeconfig, context=self.context, on_call=self._called)
            try:
                return await work(api)
            finally:
                await api.close()

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(go())
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, go()).result()

    def _region(self, region: str) -> RegionPods:
        pods = self.regions.get(region)
        if pods is None:
            raise KubeDrillError(
                f"region {region!r} has no pods configured here (have {', '.join(self.regions)})"
            )
        return pods

    # -- DrillTarget: what the observer reads ----------------------------------------------
    @property
    def gateway_urls(self) -> dict[str, str]:
        """Region -> where its traffic goes in (its gateway's Service, or its Envoy)."""
        return dict(self._gateways)

    @property
    def data_plane_metrics_urls(self) -> dict[str, str]:
        """Process -> a base URL whose /metrics has the gateway's metric names."""
        return dict(self._data_plane)

    def replica_urls(self, region: str) -> list[str]:
        """The region's routable endpoints now (the observer scrapes their /metrics; pods
        started during the drill have other addresses and are not scraped)."""
        if region not in self.regions:
            return []
        r = self.regions[region]
        return self._run(lambda api: self._routable(api, r))

    # -- DrillTarget: the region's servers -------------------------------------------------
    def stop_servers(self, region: str, count: int | None = None) -> list[int]:
        r = self._region(region)
        if count is None and self.blackout == "network-policy":
            self._run(lambda api: self._isolate(api, region, r))
            return []
        if count is None and self.blackout == "scale-to-zero":
            self._run(lambda api: self._scale_to_zero(api, region, r))
            return []
        deleted = self._run(lambda api: self._delete_pods(api, r, count))
        return list(range(len(deleted)))

    def start_servers(self, region: str) -> list[str]:
        r = self._region(region)
        return self._run(lambda api: self._restore(api, region, r))

    # -- DrillTarget: faults ---------------------------------------------------------------
    def inject(self, region: str, fault: dict[str, object]) -> list[str]:
        r = self._region(region)
        return self._run(lambda api: self._inject(api, region, r, fault))

    def clear_faults(self, region: str) -> list[str]:
        r = self._region(region)
        return self._run(lambda api: self._clear(api, region, r))

    # -- DrillTarget: control plane and etcd -----------------------------------------------
    def kill_controlplane(self, rid: str) -> int:
        group = self._group(self.controlplane, "control-plane")
        return self._run(lambda api: self._kill_leader(api, group, rid))

    def start_controlplanes(self) -> list[str]:
        group = self._group(self.controlplane, "control-plane")
        return self._run(lambda api: self._wait_group(api, group, "controlplane"))

    def kill_etcd_member(self) -> int:
        group = self._group(self.etcd, "etcd")
        return self._run(lambda api: self._kill_etcd(api, group))

    def start_etcd_members(self) -> list[int]:
        group = self._group(self.etcd, "etcd")
        names = self._run(lambda api: self._wait_group(api, group, "etcd"))
        return [_ordinal(n, i) for i, n in enumerate(names)]

    @staticmethod
    def _group(group: PodGroup | None, what: str) -> PodGroup:
        if group is None:
            raise KubeDrillError(f"no {what} pods configured for this drill target")
        return group

    # -- pods ------------------------------------------------------------------------------
    async def _pods(self, api: ApiClient, namespace: str, selector: str) -> list[V1Pod]:
        page = await CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=selector, _request_timeout=self.request_timeout_s
        )
        return sorted(page.items or (), key=lambda p: str(p.metadata.name))

    async def _delete_pod(self, api: ApiClient, namespace: str, name: str) -> bool:
        """DELETE with zero grace; False when it was gone already."""
        try:
            await CoreV1Api(api).delete_namespaced_pod(
                name, namespace, grace_period_seconds=0, _request_timeout=self.request_timeout_s
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise KubeDrillError(_refused(f"delete pod {namespace}/{name}", e)) from e
        return True

    async def _delete_pods(self, api: ApiClient, r: RegionPods, count: int | None) -> list[str]:
        live = [p for p in await self._pods(api, r.namespace, r.selector) if _running(p)]
        chosen = live if count is None else live[:count]
        if not chosen:
            raise KubeDrillError(f"no running pod matches {r.selector} in namespace {r.namespace}")
        deleted = [
            p.metadata.name
            for p in chosen
            if await self._delete_pod(api, r.namespace, p.metadata.name)
        ]
        self._note("deleted_pods", deleted)
        return deleted

    # -- scale -----------------------------------------------------------------------------
    async def _replicas(self, api: ApiClient, w: Workload) -> tuple[int, str]:
        apps = AppsV1Api(api)
        try:
            if w.kind == "deployment":
                s = await apps.read_namespaced_deployment_scale(
                    w.name, w.namespace, _request_timeout=self.request_timeout_s
                )
            else:
                s = await apps.read_namespaced_stateful_set_scale(
                    w.name, w.namespace, _request_timeout=self.request_timeout_s
                )
        except ApiException as e:
            raise KubeDrillError(_refused(f"read the scale of {w}", e)) from e
        return int(s.spec.replicas or 0), str(s.metadata.resource_version)

    async def _set_replicas(self, api: ApiClient, w: Workload, replicas: int) -> None:
        apps, body = AppsV1Api(api), {"spec": {"replicas": replicas}}
        try:
            if w.kind == "deployment":
                await apps.patch_namespaced_deployment_scale(
                    w.name, w.namespace, body, _request_timeout=self.request_timeout_s
                )
            else:
                await apps.patch_namespaced_stateful_set_scale(
                    w.name, w.namespace, body, _request_timeout=self.request_timeout_s
                )
        except ApiException as e:
            raise KubeDrillError(_refused(f"scale {w} to {replicas}", e)) from e

    async def _scale_to_zero(self, api: ApiClient, region: str, r: RegionPods) -> None:
        w = Workload.parse(r.workload, r.namespace)
        replicas, _ = await self._replicas(api, w)
        self._scaled_from.setdefault(region, replicas)  # a second stop keeps the first count
        await self._set_replicas(api, w, 0)
        self._note("scaled", f"{w}: {replicas} -> 0")

    # -- blackout by NetworkPolicy ---------------------------------------------------------
    async def _isolate(self, api: ApiClient, region: str, r: RegionPods) -> None:
        urls = await self._routable(api, r)
        policy = blackout_policy(region, r.namespace, r.labels)
        try:
            await NetworkingV1Api(api).create_namespaced_network_policy(
                r.namespace, policy, _request_timeout=self.request_timeout_s
            )
        except ApiException as e:
            if e.status != 409:  # there already (a blackout not rolled back): keep it
                raise KubeDrillError(
                    _refused(f"create NetworkPolicy {policy.metadata.name}", e)
                ) from e
        self._note("network_policy", f"{r.namespace}/{policy.metadata.name}")
        self._note("enforcement", NOT_ENFORCED)
        answering = await _still_answering(urls, self.check_blackout_s)
        self._note(
            "blackout_check",
            f"{len(answering)} of {len(urls)} pod(s) still answer /health from the drill "
            f"after {self.check_blackout_s:g}s"
            + (": the network plugin may not enforce NetworkPolicy" if answering else ""),
        )

    async def _unisolate(self, api: ApiClient, region: str, r: RegionPods) -> None:
        name = object_name("tectonic-blackout", region)
        try:
            await NetworkingV1Api(api).delete_namespaced_network_policy(
                name, r.namespace, _request_timeout=self.request_timeout_s
            )
        except ApiException as e:
            if e.status != 404:
                raise KubeDrillError(_refused(f"delete NetworkPolicy {name}", e)) from e
            return
        self._note("network_policy_deleted", f"{r.namespace}/{name}")

    # -- back to normal --------------------------------------------------------------------
    async def _restore(self, api: ApiClient, region: str, r: RegionPods) -> list[str]:
        if self.blackout == "network-policy":
            await self._unisolate(api, region, r)
        w = Workload.parse(r.workload, r.namespace)
        if region in self._scaled_from:
            replicas = self._scaled_from.pop(region)
            await self._set_replicas(api, w, replicas)
            self._note("scaled", f"{w}: 0 -> {replicas}")
        urls = await self._wait_routable(api, r, w)
        self._note("ready", urls)
        return urls

    async def _routable(self, api: ApiClient, r: RegionPods) -> list[str]:
        page = await DiscoveryV1Api(api).list_namespaced_endpoint_slice(
            r.namespace,
            label_selector=service_selector(r.service),
            _request_timeout=self.request_timeout_s,
        )
        endpoints = fold_slices(page.items or (), port_name=r.port_name)
        return [e.url for e in endpoints if e.routable]

    async def _wait_routable(self, api: ApiClient, r: RegionPods, w: Workload) -> list[str]:
        """Until the Service lists the workload's ``replicas`` routable endpoints and no
        other (the deleted pods' are gone)."""
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            replicas, _ = await self._replicas(api, w)
            page = await DiscoveryV1Api(api).list_namespaced_endpoint_slice(
                r.namespace,
                label_selector=service_selector(r.service),
                _request_timeout=self.request_timeout_s,
            )
            endpoints = fold_slices(page.items or (), port_name=r.port_name)
            urls = [e.url for e in endpoints if e.routable]
            if len(urls) >= replicas and len(endpoints) == len(urls):
                return urls
            if time.monotonic() > deadline:
                raise KubeDrillError(
                    f"{w}: {len(urls)} of {replicas} endpoint(s) routable in Service "
                    f"{r.namespace}/{r.service} after {self.ready_timeout_s:g}s"
                )
            await asyncio.sleep(0.25)

    # -- Chaos Mesh ------------------------------------------------------------------------
    async def _chaos_mesh(self, api: ApiClient) -> bool:
        try:
            await CustomObjectsApi(api).get_api_resources(
                CHAOS_GROUP, CHAOS_VERSION, _request_timeout=self.request_timeout_s
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise KubeDrillError(_refused(f"discover {CHAOS_GROUP}/{CHAOS_VERSION}", e)) from e
        return True

    async def _inject(
        self, api: ApiClient, region: str, r: RegionPods, fault: Mapping[str, object]
    ) -> list[str]:
        if not await self._chaos_mesh(api):
            raise KubeDrillError(
                f"Chaos Mesh is not installed in this cluster (GET /apis/{CHAOS_GROUP}/"
                f"{CHAOS_VERSION} answered 404): latency and 5xx faults on pods need its "
                "HTTPChaos and NetworkChaos CRDs; install Chaos Mesh, or drill on the "
                "lab's simulators"
            )
        slices = await DiscoveryV1Api(api).list_namespaced_endpoint_slice(
            r.namespace,
            label_selector=service_selector(r.service),
            _request_timeout=self.request_timeout_s,
        )
        endpoints = fold_slices(slices.items or (), port_name=r.port_name)
        if not endpoints:
            raise KubeDrillError(f"Service {r.namespace}/{r.service} has no endpoints to fault")
        try:
            objects = chaos_objects(
                region,
                r.namespace,
                r.labels,
                fault,
                pods=sum(e.routable for e in endpoints),
                port=endpoints[0].port,
                duration_s=self.fault_duration_s,
            )
        except FaultRefused as e:
            raise KubeDrillError(str(e)) from e
        custom, made = CustomObjectsApi(api), []
        for obj in objects:
            try:
                await custom.create_namespaced_custom_object(
                    CHAOS_GROUP, CHAOS_VERSION, r.namespace, obj.plural, obj.body,
                    _request_timeout=self.request_timeout_s,
                )  # fmt: skip
            except ApiException as e:
                raise KubeDrillError(_refused(f"create {obj.plural} {obj.name}", e)) from e
            made.append(f"{obj.plural}/{obj.name}")
        self._note("chaos_objects", made)
        if notes := [o.note for o in objects if o.note]:
            self._note("notes", notes)
        return made

    async def _clear(self, api: ApiClient, region: str, r: RegionPods) -> list[str]:
        if not await self._chaos_mesh(api):
            return []  # nothing can have been injected
        custom, cleared = CustomObjectsApi(api), []
        for plural in CHAOS_PLURALS:
            page = await custom.list_namespaced_custom_object(
                CHAOS_GROUP, CHAOS_VERSION, r.namespace, plural,
                label_selector=drill_selector(region), _request_timeout=self.request_timeout_s,
            )  # fmt: skip
            for item in _items(page):
                name = str(item["metadata"]["name"])
                try:
                    await custom.delete_namespaced_custom_object(
                        CHAOS_GROUP, CHAOS_VERSION, r.namespace, plural, name,
                        _request_timeout=self.request_timeout_s,
                    )  # fmt: skip
                except ApiException as e:
                    if e.status != 404:
                        raise KubeDrillError(_refused(f"delete {plural} {name}", e)) from e
                    continue
                cleared.append(f"{plural}/{name}")
        self._note("chaos_objects_deleted", cleared)
        return cleared

    # -- control plane and etcd ------------------------------------------------------------
    async def _kill_leader(self, api: ApiClient, group: PodGroup, rid: str) -> int:
        pods = await self._pods(api, group.namespace, group.selector)
        names = [str(p.metadata.name) for p in pods]
        pod = leader_pod(rid, names)
        if pod is None:
            raise KubeDrillError(
                f"the leader {rid!r} is none of the control-plane pods "
                f"({', '.join(names) or 'none'} match {group.selector} in {group.namespace}): "
                "run the control plane with --id=$(POD_NAME)"
            )
        self._ready_before.setdefault("controlplane", sum(_ready(p) for p in pods))
        await self._delete_pod(api, group.namespace, pod)
        self._note("deleted_pods", [pod])
        return names.index(pod)

    async def _kill_etcd(self, api: ApiClient, group: PodGroup) -> int:
        pods = await self._pods(api, group.namespace, group.selector)
        ready = [p for p in pods if _ready(p)]
        if len(ready) < 3:
            raise KubeDrillError(
                f"killing an etcd member needs 3 ready etcd pods ({len(ready)} match "
                f"{group.selector} in {group.namespace}): one of fewer is the whole quorum"
            )
        self._ready_before.setdefault("etcd", len(ready))
        victim = str(ready[0].metadata.name)
        await self._delete_pod(api, group.namespace, victim)
        self._note("deleted_pods", [victim])
        return _ordinal(victim, 0)

    async def _wait_group(self, api: ApiClient, group: PodGroup, key: str) -> list[str]:
        """Until the group has as many ready pods as before the kill (nothing killed:
        at once). Returns the ready pods' names."""
        wanted = self._ready_before.pop(key, 0)
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            pods = await self._pods(api, group.namespace, group.selector)
            ready = [str(p.metadata.name) for p in pods if _ready(p)]
            if len(ready) >= wanted:
                self._note("ready", ready)
                return ready
            if time.monotonic() > deadline:
                raise KubeDrillError(
                    f"{len(ready)} of {wanted} {key} pod(s) ready after {self.ready_timeout_s:g}s"
                )
            await asyncio.sleep(0.25)


def leader_pod(rid: str, pods: Sequence[str]) -> str | None:
    """The pod of the replica id ``rid``: the pod named so, or the one whose name is
    ``rid`` less its ``-<pid>`` tail (the default id is ``<hostname>-<pid>``)."""
    if rid in pods:
        return rid
    head, _, tail = rid.rpartition("-")
    return head if tail.isdigit() and head in pods else None


def _running(p: V1Pod) -> bool:
    return p.metadata.deletion_timestamp is None and (p.status.phase if p.status else "") in (
        "Running",
        "Pending",
    )


def _ready(p: V1Pod) -> bool:
    if p.metadata.deletion_timestamp is not None or p.status is None:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())


def _ordinal(name: str, default: int) -> int:
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else default


def _items(page: Any) -> list[dict[str, Any]]:
    items = page.get("items") if isinstance(page, dict) else None
    return [i for i in items or () if isinstance(i, dict)]


def _refused(what: str, e: ApiException) -> str:
    hint = " (the drill's service account needs the drill Role)" if e.status in (401, 403) else ""
    return f"cannot {what}: HTTP {e.status} {e.reason}{hint}"


async def _still_answering(urls: Sequence[str], after_s: float) -> list[str]:
    """The URLs whose /health still answers ``after_s`` seconds from now."""
    await asyncio.sleep(after_s)
    limit = aiohttp.ClientTimeout(total=1.0)

    async def answers(http: aiohttp.ClientSession, url: str) -> bool:
        try:
            async with http.get(url + "/health") as r:
                return r.status < 500
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async with aiohttp.ClientSession(timeout=limit) as http:
        results = await asyncio.gather(*(answers(http, u) for u in urls))
    return [u for u, ok in zip(urls, results, strict=True) if ok]


class KubernetesDrillRunner(DrillRunner):
    """The drill runner, journaling the API calls of a :class:`KubernetesDrillTarget`
    with each fault and rollback (the runner journals what an action returns; this adds
    the calls made and the objects touched, also to a failed action's error)."""

    async def _act(self, f: Fault, flaps: list[asyncio.Task[None]]) -> dict[str, object]:
        target = self.target
        if not isinstance(target, KubernetesDrillTarget):
            return await super()._act(f, flaps)
        # calls made since the last action (the observer's first read of the replicas, a
        # flapping region's stops and starts) are journaled with this one, as such
        before = [c.describe() for c in target.take_calls()]
        target.take_detail()
        earlier = {"api_calls_before": before} if before else {}
        try:
            detail = await super()._act(f, flaps)
        except Exception as e:
            calls = "; ".join(c.describe() for c in target.take_calls())
            target.take_detail()
            raise KubeDrillError(f"{e} [api calls: {calls or 'none'}]") from e
        # pods have no PIDs: what the runner files as such are positions; the pods'
        # names are in deleted_pods
        for key in ("killed_pids", "pid"):
            detail.pop(key, None)
        return {**detail, **target.take_detail(), **earlier}


if TYPE_CHECKING:  # mypy holds the target to the runner's seam

    def _is_a_drill_target(t: KubernetesDrillTarget) -> DrillTarget:
        return t
