"""The controllers the stand-in API server plays (tests/kube_standin/): the pods' lives
(each a real simulator on its own 127.0.0.x address, Ready once it answers), a
Deployment's ReplicaSet and a StatefulSet (scale up and down, a deleted pod replaced)
and the EndpointSlice controller.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import secrets
import time
from typing import Any, cast

from kubernetes_asyncio.client import (
    DiscoveryV1EndpointPort,
    V1Container,
    V1Endpoint,
    V1EndpointConditions,
    V1EndpointSlice,
    V1ObjectMeta,
    V1ObjectReference,
    V1Pod,
    V1PodCondition,
    V1PodSpec,
    V1PodStatus,
)

from chaos.lab.procs import start_simulator
from tests.kube_standin.core import StandInCore
from tests.kube_standin.records import (
    DELETION_COST,
    PodState,
    ServiceState,
    WorkloadState,
    parse_selector,
)


class Controllers(StandInCore):
    """Pods started, made Ready, terminated and removed; workloads reconciled to their
    replicas; each Service's EndpointSlices kept up to date."""

    # -- pods ----------------------------------------------------------------------------
    def _touch(self, p: PodState, kind: str = "MODIFIED") -> None:
        p.model.metadata.resource_version = str(self._next_rv())
        self._emit("pods", kind, self._pod_json(p))
        self._refresh_slices()

    def _new_pod(self, w: WorkloadState) -> PodState:
        if w.kind == "statefulset":
            taken = {p.name for p in self.pods.values() if p.workload == f"statefulset/{w.name}"}
            name = next(f"{w.name}-{i}" for i in itertools.count() if f"{w.name}-{i}" not in taken)
        else:
            name = f"{w.name}-{secrets.token_hex(3)[:5]}"
        model = V1Pod(
            api_version="v1",
            kind="Pod",
            metadata=V1ObjectMeta(
                name=name,
                namespace=w.namespace,
                labels=dict(w.labels),
                annotations={},
                uid=secrets.token_hex(8),
                creation_timestamp=dt.datetime.now(dt.UTC),
            ),
            spec=V1PodSpec(
                containers=[V1Container(name="vllm", image="vllm/vllm-openai")],
                node_name="standin-node",
            ),
            status=V1PodStatus(
                phase="Pending",
                pod_ip=next(self._ips),
                conditions=[V1PodCondition(type="Ready", status="False")],
            ),
        )
        p = PodState(model, f"{w.kind}/{w.name}", model.status.pod_ip, self.port)
        p.created = next(self._seq)
        self.pods[name] = p
        self._touch(p, "ADDED")
        self._spawn(self._run_pod(p, w))
        return p

    async def _run_pod(self, p: PodState, w: WorkloadState) -> None:
        """Start the pod's simulator; Ready once it answers /health."""
        if w.hang:
            return  # Pending for ever
        if w.process:
            args = ("--host", p.ip, *self.sim_args)
            proc = await asyncio.to_thread(
                start_simulator, port=p.port, extra_args=args, name=p.name
            )
            if p.name not in self.pods or p.terminating:  # deleted while starting
                await asyncio.to_thread(proc.kill)
                return
            p.proc = proc
        p.model.status.phase = "Running"
        p.model.status.conditions = [V1PodCondition(type="Ready", status="True")]
        p.ready_at = time.monotonic()
        self._touch(p)

    def _terminate(self, p: PodState, grace_s: float) -> None:
        """Terminating now (the endpoint says so), gone after ``grace_s``."""
        if p.terminating:
            return
        # Ready stays as it is: the kubelet keeps probing a terminating pod, so its
        # endpoint is serving (while it passes) and terminating, and not ready.
        p.model.metadata.deletion_timestamp = dt.datetime.now(dt.UTC)
        self._touch(p)
        self._spawn(self._remove_after(p, grace_s))

    async def _remove_after(self, p: PodState, grace_s: float) -> None:
        if grace_s > 0:
            await asyncio.sleep(grace_s)
        if p.proc is not None:
            await asyncio.to_thread(p.proc.kill)
        if self.pods.pop(p.name, None) is None:
            return
        p.model.metadata.resource_version = str(self._next_rv())
        self._emit("pods", "DELETED", self._pod_json(p))
        self._refresh_slices()
        w = self.workloads.get(p.workload)
        if w is not None:
            self._reconcile(w)  # the controller replaces what is missing

    # -- the controllers -----------------------------------------------------------------
    def _reconcile(self, w: WorkloadState) -> None:
        live = [p for p in self.pods.values() if p.workload == f"{w.kind}/{w.name}"]
        live = [p for p in live if not p.terminating]
        for _ in range(w.replicas - len(live)):
            live.append(self._new_pod(w))
        extra = len(live) - w.replicas
        if extra > 0:
            for p in sorted(live, key=lambda p: self._rank(w, p))[:extra]:
                self._terminate(p, self.termination_s)

    def _rank(self, w: WorkloadState, p: PodState) -> tuple[float, ...]:
        """Which pod a scale-down removes first (lowest first)."""
        if w.kind == "statefulset":
            return (-int(p.name.rsplit("-", 1)[1]),)
        try:
            cost = float(p.annotations.get(DELETION_COST, "0"))
        except ValueError:
            cost = 0.0
        # not ready first, then the lowest deletion cost, then the most recently ready
        return (1.0 if p.ready else 0.0, cost, -p.ready_at)

    def _refresh_slices(self) -> None:
        """The EndpointSlice controller: each Service's pods, ``slice_size`` a slice."""
        wanted: dict[str, dict[str, Any]] = {}
        for svc in self.services.values():
            match = parse_selector(",".join(f"{k}={v}" for k, v in svc.selector.items()))
            pods = sorted((p for p in self.pods.values() if match(p.labels)), key=lambda p: p.name)
            chunks = [pods[i : i + self.slice_size] for i in range(0, len(pods), self.slice_size)]
            for i, chunk in enumerate(chunks or [[]]):
                name = f"{svc.name}-{i:05d}"
                wanted[name] = self._slice_json(svc, name, chunk)
        for name, obj in wanted.items():
            old = self.slices.get(name)
            if old is not None and _without_rv(old) == _without_rv(obj):
                continue
            obj["metadata"]["resourceVersion"] = str(self._next_rv())
            self.slices[name] = obj
            self._emit("endpointslices", "ADDED" if old is None else "MODIFIED", obj)
        for name in [n for n in self.slices if n not in wanted]:
            obj = self.slices.pop(name)
            obj["metadata"]["resourceVersion"] = str(self._next_rv())
            self._emit("endpointslices", "DELETED", obj)

    def _slice_json(self, svc: ServiceState, name: str, pods: list[PodState]) -> dict[str, Any]:
        endpoints = [
            V1Endpoint(
                addresses=[p.ip],
                conditions=V1EndpointConditions(
                    ready=p.ready and not p.terminating,
                    serving=p.ready,
                    terminating=p.terminating,
                ),
                target_ref=V1ObjectReference(
                    kind="Pod", name=p.name, namespace=svc.namespace, uid=p.model.metadata.uid
                ),
                zone=self.workloads[p.workload].zone if p.workload in self.workloads else None,
                node_name="standin-node",
            )
            for p in pods
        ]
        model = V1EndpointSlice(
            api_version="discovery.k8s.io/v1",
            kind="EndpointSlice",
            address_type="IPv4",
            metadata=V1ObjectMeta(
                name=name,
                namespace=svc.namespace,
                labels={
                    "kubernetes.io/service-name": svc.name,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
            ),
            endpoints=endpoints,
            ports=[DiscoveryV1EndpointPort(name=svc.port_name, port=self.port, protocol="TCP")],
        )
        return cast(dict[str, Any], self._json(model))

    def _set_replicas(self, w: WorkloadState, replicas: int) -> None:
        w.replicas, w.version = replicas, w.version + 1
        self._reconcile(w)


def _without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}
