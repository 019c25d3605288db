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

The pieces: chaos/kube/pods.py (the pods, listed and deleted), chaos/kube/workloads.py
(scale and Service endpoints), chaos/kube/blackout.py (the NetworkPolicy blackout),
chaos/kube/chaos_mesh.py (injected faults). Every API call is recorded
(:meth:`take_calls`, :meth:`take_detail`); :class:`KubernetesDrillRunner` adds them
to the journal entry of each fault and rollback, with what was deleted or created. The
DrillTarget methods return what the Protocol says: pods have no PIDs, so
``stop_servers`` and ``kill_controlplane`` return positions (one number per pod
deleted); the names are in the journal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from kubernetes_asyncio.client import ApiClient

from chaos.drills.runner import DrillRunner, DrillTarget
from chaos.drills.scenario import Fault
from chaos.kube import blackout as netpol
from chaos.kube import chaos_mesh
from chaos.kube.pods import (
    KubeDrillError,
    PodGroup,
    RegionPods,
    delete_pod,
    leader_pod,
    list_pods,
    ordinal,
    ready,
    running,
)
from chaos.kube.workloads import read_replicas, routable, set_replicas, wait_routable
from controlplane.kernel.keys import Keys
from regions.kube.client import ApiCall, new_api_client
from regions.kube.workload import Workload

log = logging.getLogger("chaos.kube.target")
T = TypeVar("T")
Blackout = Literal["delete-pods", "scale-to-zero", "network-policy"]


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
            log.warning("region blackout by NetworkPolicy: %s", netpol.NOT_ENFORCED)

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
        return self._run(lambda api: routable(api, r, self.request_timeout_s))

    # -- DrillTarget: the region's servers -------------------------------------------------
    def stop_servers(self, region: str, count: int | None = None) -> list[int]:
        r = self._region(region)
        if count is None and self.blackout == "network-policy":
            self._run(
                lambda api: netpol.isolate(
                    api,
                    region,
                    r,
                    timeout_s=self.request_timeout_s,
                    check_after_s=self.check_blackout_s,
                    note=self._note,
                )
            )
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
        return self._run(
            lambda api: chaos_mesh.inject(
                api,
                region,
                r,
                fault,
                timeout_s=self.request_timeout_s,
                duration_s=self.fault_duration_s,
                note=self._note,
            )
        )

    def clear_faults(self, region: str) -> list[str]:
        r = self._region(region)
        return self._run(
            lambda api: chaos_mesh.clear(
                api, region, r, timeout_s=self.request_timeout_s, note=self._note
            )
        )

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
        return [ordinal(n, i) for i, n in enumerate(names)]

    @staticmethod
    def _group(group: PodGroup | None, what: str) -> PodGroup:
        if group is None:
            raise KubeDrillError(f"no {what} pods configured for this drill target")
        return group

    # -- pods ------------------------------------------------------------------------------
    async def _delete_pods(self, api: ApiClient, r: RegionPods, count: int | None) -> list[str]:
        t = self.request_timeout_s
        live = [p for p in await list_pods(api, r.namespace, r.selector, t) if running(p)]
        chosen = live if count is None else live[:count]
        if not chosen:
            raise KubeDrillError(f"no running pod matches {r.selector} in namespace {r.namespace}")
        deleted = [
            p.metadata.name
            for p in chosen
            if await delete_pod(api, r.namespace, p.metadata.name, t)
        ]
        self._note("deleted_pods", deleted)
        return deleted

    # -- the region's blackout and its undoing ---------------------------------------------
    async def _scale_to_zero(self, api: ApiClient, region: str, r: RegionPods) -> None:
        w = Workload.parse(r.workload, r.namespace)
        replicas, _ = await read_replicas(api, w, self.request_timeout_s)
        self._scaled_from.setdefault(region, replicas)  # a second stop keeps the first count
        await set_replicas(api, w, 0, self.request_timeout_s)
        self._note("scaled", f"{w}: {replicas} -> 0")

    async def _restore(self, api: ApiClient, region: str, r: RegionPods) -> list[str]:
        if self.blackout == "network-policy":
            await netpol.unisolate(
                api, region, r, timeout_s=self.request_timeout_s, note=self._note
            )
        w = Workload.parse(r.workload, r.namespace)
        if region in self._scaled_from:
            replicas = self._scaled_from.pop(region)
            await set_replicas(api, w, replicas, self.request_timeout_s)
            self._note("scaled", f"{w}: 0 -> {replicas}")
        urls = await wait_routable(
            api, r, w, timeout_s=self.request_timeout_s, ready_timeout_s=self.ready_timeout_s
        )
        self._note("ready", urls)
        return urls

    # -- control plane and etcd ------------------------------------------------------------
    async def _kill_leader(self, api: ApiClient, group: PodGroup, rid: str) -> int:
        t = self.request_timeout_s
        pods = await list_pods(api, group.namespace, group.selector, t)
        names = [str(p.metadata.name) for p in pods]
        pod = leader_pod(rid, names)
        if pod is None:
            raise KubeDrillError(
                f"the leader {rid!r} is none of the control-plane pods "
                f"({', '.join(names) or 'none'} match {group.selector} in {group.namespace}): "
                "run the control plane with --id=$(POD_NAME)"
            )
        self._ready_before.setdefault("controlplane", sum(ready(p) for p in pods))
        await delete_pod(api, group.namespace, pod, t)
        self._note("deleted_pods", [pod])
        return names.index(pod)

    async def _kill_etcd(self, api: ApiClient, group: PodGroup) -> int:
        t = self.request_timeout_s
        pods = await list_pods(api, group.namespace, group.selector, t)
        up = [p for p in pods if ready(p)]
        if len(up) < 3:
            raise KubeDrillError(
                f"killing an etcd member needs 3 ready etcd pods ({len(up)} match "
                f"{group.selector} in {group.namespace}): one of fewer is the whole quorum"
            )
        self._ready_before.setdefault("etcd", len(up))
        victim = str(up[0].metadata.name)
        await delete_pod(api, group.namespace, victim, t)
        self._note("deleted_pods", [victim])
        return ordinal(victim, 0)

    async def _wait_group(self, api: ApiClient, group: PodGroup, key: str) -> list[str]:
        """Until the group has as many ready pods as before the kill (nothing killed:
        at once). Returns the ready pods' names."""
        wanted = self._ready_before.pop(key, 0)
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            pods = await list_pods(api, group.namespace, group.selector, self.request_timeout_s)
            up = [str(p.metadata.name) for p in pods if ready(p)]
            if len(up) >= wanted:
                self._note("ready", up)
                return up
            if time.monotonic() > deadline:
                raise KubeDrillError(
                    f"{len(up)} of {wanted} {key} pod(s) ready after {self.ready_timeout_s:g}s"
                )
            await asyncio.sleep(0.25)


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
