"""``KubernetesLauncher``: a warm pool whose replicas are the pods of a Deployment (or a
StatefulSet), found through the EndpointSlices of the Service in front of them.

    discovery = EndpointSliceDiscovery(conn, "models", "vllm-eu", port_name="http")
    launcher = KubernetesLauncher(discovery, Workload.parse("deployment/vllm-eu", "models"))
    pool = WarmPool(launcher, PoolConfig(active=1, warm=1))

- ``launch()``: the pool owns as many pods as it has launched. When the workload runs
  no pod the pool does not own yet (``spec.replicas`` <= owned + launches in flight), it
  raises the ``scale`` subresource by one (a PATCH carrying the ``resourceVersion`` it
  read: a concurrent writer answers 409 and the read is done again); then it waits for a
  routable endpoint that nobody owns, checks its ``/health`` and owns it. Pods that run
  already (the Deployment's own replicas, a pod the controller recreated, the pods of an
  agent that restarted) are so taken before any scale-up.
- ``stop(url)``: annotate exactly that pod with ``controller.kubernetes.io/pod-deletion-cost:
  "-1000"`` and lower ``replicas`` by one, then wait until that pod is terminating or
  gone. The ReplicaSet controller removes the pods of LOWER cost first (the default is
  0, the range int32), so the marked pod is the one taken, as long as no other pod ranks
  before it for another reason: a pod not scheduled, not running or not ready goes
  first whatever its cost (the controller's ranking), and a rollout in progress scales
  the two ReplicaSets proportionally. The wait says so when another pod went instead.
  A pod already gone still lowers ``replicas`` by one: the pool wants one replica fewer,
  and the controller would otherwise start a replacement nobody asked for.
- StatefulSets ignore the deletion cost: scaling one down always removes its highest
  ordinal (``name-<replicas-1>``). ``stop`` of that pod works; of any other it is refused
  (:class:`StopRefused`, a ``ReplicaError`` the pool logs and retries), since the scale-
  down would take a pod the pool did not choose. Prefer a Deployment for a pool.
- A launch cancelled (the pool's targets fell while it waited) lowers ``replicas`` by
  one again when a pod beyond those owned and awaited runs: the controller removes a
  pod not ready first. A StatefulSet does so only when its highest ordinal is not the
  pool's; else that pod stays for the next launch to take.
- ``detach()`` (the agent shutting down): ``stop`` does nothing from then on. The pods
  outlive the agent (as a static pool's do) and the next agent takes them over.

An HPA on the same workload would fight the pool over ``replicas``: give the pool its
own workload, or no HPA.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from kubernetes_asyncio.client import AppsV1Api, CoreV1Api, V1Scale
from kubernetes_asyncio.client.exceptions import ApiException

from regions.kube.discovery import Endpoints, EndpointSliceDiscovery
from regions.kube.endpoints import KubeEndpoint
from regions.kube.workload import Workload
from regions.pool.client import ReplicaError
from regions.pool.launchers import LaunchRefused

log = logging.getLogger("tectonic.kube.launcher")
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LOWEST_COST = "-1000"  # lower than every pod left at the default 0: removed first


class StopRefused(ReplicaError, LaunchRefused):
    """This replica cannot be stopped on its own (a StatefulSet's lower ordinal)."""


class KubernetesLauncher:
    """Replicas are a workload's pods; see the module docstring."""

    managed: bool = True
    variants: tuple[str, ...] = ()  # one pod template: what runs is the workload's

    def __init__(
        self,
        discovery: EndpointSliceDiscovery,
        workload: Workload,
        *,
        ready_timeout_s: float = 900.0,  # a vLLM pod: scheduling, image pull, model load
        stop_timeout_s: float = 120.0,
        request_timeout_s: float = 15.0,
        health_timeout_s: float = 2.0,
    ) -> None:
        self.discovery, self.workload = discovery, workload
        self.ready_timeout_s, self.stop_timeout_s = ready_timeout_s, stop_timeout_s
        self.request_timeout_s, self.health_timeout_s = request_timeout_s, health_timeout_s
        self._owned: dict[str, str] = {}  # url -> pod name
        self._launching = 0
        self._lock = asyncio.Lock()  # one read-modify-write of replicas at a time
        self._detached = False

    # -- what the pool calls -----------------------------------------------------------
    async def launch(self, variant: str | None = None) -> str:
        if variant is not None:
            raise LaunchRefused(
                f"{self.workload} has one pod template: no variant {variant!r} to launch"
            )
        if self._detached:
            raise LaunchRefused(f"the launcher of {self.workload} is detached (shutting down)")
        async with self._lock:
            replicas = await self._read_replicas()
            if replicas <= len(self._owned) + self._launching:
                await self._scale(lambda n: n + 1, "launch")
            self._launching += 1  # until it owns a pod: then that pod counts instead
        try:
            return await self._own_new_endpoint()
        except asyncio.CancelledError:
            if not self._detached:  # the pool no longer wants it (not shutting down)
                await self._withdraw()
            raise

    async def _withdraw(self) -> None:
        """A launch cancelled: lower ``replicas`` by one when the workload runs a pod
        beyond those the pool owns and the launches still in flight (the one this
        launch asked for, still starting). The ReplicaSet controller removes a pod not
        yet ready first. A StatefulSet removes its highest ordinal: only when the pool
        does not own that pod; else the pod stays for the next launch to take."""
        async with self._lock:
            replicas = await self._read_replicas()
            if replicas <= len(self._owned) + self._launching:
                return
            if self.workload.kind == "statefulset":
                highest = f"{self.workload.name}-{replicas - 1}"
                if highest in self._owned.values():
                    log.info(
                        "%s: launch cancelled; its pod stays for the next launch (the "
                        "scale-down would remove %s, which the pool owns)",
                        self.workload,
                        highest,
                    )
                    return
            await self._scale(lambda n: max(0, n - 1), "launch cancelled")

    async def stop(self, url: str) -> None:
        if self._detached:
            return
        pod = self._owned.get(url)
        if pod is None:
            return  # never ours, or stopped already
        async with self._lock:
            if self.workload.kind == "statefulset":
                await self._check_highest_ordinal(pod)
            del self._owned[url]
            marked = await self._mark_for_deletion(pod)
            await self._scale(lambda n: max(0, n - 1), f"stop {pod}")
        if marked:
            await self._wait_gone(url, pod)

    def detach(self) -> None:
        """Leave every pod running from now on (the agent is shutting down)."""
        self._detached = True

    # -- for the labeler and the agent -------------------------------------------------
    def owned(self) -> dict[str, str]:
        """The pool's replicas: base URL -> pod name."""
        return dict(self._owned)

    def pod_of(self, url: str) -> str | None:
        """The pod behind ``url``: the one owned, else the one the Service lists."""
        if url in self._owned:
            return self._owned[url]
        endpoint = self.discovery.endpoint(url)
        return endpoint.pod if endpoint is not None else None

    # -- scale -------------------------------------------------------------------------
    async def _apps(self) -> AppsV1Api:
        return AppsV1Api(await self.discovery.connection.api())

    async def _read_scale(self) -> V1Scale:
        apps, w = await self._apps(), self.workload
        t = self.request_timeout_s
        try:
            if w.kind == "deployment":
                return await apps.read_namespaced_deployment_scale(
                    w.name, w.namespace, _request_timeout=t
                )
            return await apps.read_namespaced_stateful_set_scale(
                w.name, w.namespace, _request_timeout=t
            )
        except ApiException as e:
            raise LaunchRefused(self._refused("read the scale of", e)) from e

    async def _read_replicas(self) -> int:
        scale = await self._read_scale()
        return int((scale.spec.replicas if scale.spec else 0) or 0)

    async def _scale(self, change: Callable[[int], int], why: str) -> int:
        """Set ``replicas`` to ``change(replicas)``, with the version read as the
        precondition; a 409 (someone else wrote it meanwhile) reads again."""
        w = self.workload
        for _ in range(5):
            scale = await self._read_scale()
            now = int((scale.spec.replicas if scale.spec else 0) or 0)
            wanted = change(now)
            body = {
                "metadata": {"resourceVersion": scale.metadata.resource_version},
                "spec": {"replicas": wanted},
            }
            apps, t = await self._apps(), self.request_timeout_s
            try:
                if w.kind == "deployment":
                    await apps.patch_namespaced_deployment_scale(
                        w.name, w.namespace, body, _request_timeout=t
                    )
                else:
                    await apps.patch_namespaced_stateful_set_scale(
                        w.name, w.namespace, body, _request_timeout=t
                    )
            except ApiException as e:
                if e.status == 409:
                    continue
                raise LaunchRefused(self._refused("scale", e)) from e
            log.info("%s: replicas %d -> %d (%s)", w, now, wanted, why)
            return wanted
        raise LaunchRefused(f"{w}: replicas kept changing under the pool (409 five times)")

    # -- launch ------------------------------------------------------------------------
    def _unowned(self, endpoints: Endpoints) -> list[KubeEndpoint]:
        return [e for e in endpoints if e.routable and e.pod and e.url not in self._owned]

    async def _own_new_endpoint(self) -> str:
        """Wait for a routable endpoint nobody owns whose ``/health`` answers; own it.
        The check and the claim happen with no await between them, so that two
        launches in flight never take the same pod."""
        deadline = time.monotonic() + self.ready_timeout_s
        claimed = False
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    await self.discovery.wait_until(
                        lambda eps: bool(self._unowned(eps)), max(0.0, left)
                    )
                except TimeoutError:
                    raise LaunchRefused(self._late()) from None
                candidates = self._unowned(self.discovery.endpoints)
                if candidates:  # else another launch took it first
                    break
            endpoint = candidates[0]
            url, pod = endpoint.url, endpoint.pod
            assert pod is not None
            self._owned[url], claimed = pod, True
            self._launching -= 1
        finally:
            if not claimed:
                self._launching -= 1
        try:
            healthy = await self._healthy(url, deadline)
        except BaseException:  # cancelled (the pool stopping): the pod is nobody's again
            del self._owned[url]
            raise
        if healthy:
            log.info("%s: pod %s at %s is the pool's", self.workload, pod, url)
            return url
        del self._owned[url]  # ready to the kubelet, not reachable from here
        raise LaunchRefused(
            f"pod {pod} of {self.workload} is ready in the Service but its /health at "
            f"{url} does not answer from the agent (a NetworkPolicy?)"
        )

    async def _healthy(self, url: str, deadline: float) -> bool:
        limit = aiohttp.ClientTimeout(total=self.health_timeout_s)
        async with aiohttp.ClientSession(timeout=limit) as http:
            while time.monotonic() < deadline:
                try:
                    async with http.get(url + "/health") as r:
                        if r.status == 200:
                            return True
                except (aiohttp.ClientError, OSError, TimeoutError):
                    pass
                await asyncio.sleep(0.25)
        return False

    def _late(self) -> str:
        return (
            f"{self.workload}: no new ready endpoint in Service "
            f"{self.discovery.namespace}/{self.discovery.service} within "
            f"{self.ready_timeout_s:g}s (pods Pending for want of a GPU? an image pull? "
            "a readiness probe failing?)"
        )

    # -- stop --------------------------------------------------------------------------
    async def _check_highest_ordinal(self, pod: str) -> None:
        replicas = await self._read_replicas()
        highest = f"{self.workload.name}-{replicas - 1}"
        if pod != highest:
            raise StopRefused(
                f"{self.workload}: a StatefulSet scaled down removes its highest ordinal "
                f"({highest}), not {pod}, and ignores {DELETION_COST}; the pool cannot stop "
                f"{pod} on its own (use a Deployment for a warm pool)"
            )

    async def _mark_for_deletion(self, pod: str) -> bool:
        """Annotate ``pod`` with the lowest deletion cost; False when it is gone."""
        core = CoreV1Api(await self.discovery.connection.api())
        body = {"metadata": {"annotations": {DELETION_COST: LOWEST_COST}}}
        try:
            await core.patch_namespaced_pod(
                pod, self.workload.namespace, body, _request_timeout=self.request_timeout_s
            )
        except ApiException as e:
            if e.status == 404:
                log.info("%s: pod %s is gone already; scaling down by one", self.workload, pod)
                return False
            raise ReplicaError(self._refused(f"annotate pod {pod} of", e)) from e
        return True

    async def _wait_gone(self, url: str, pod: str) -> None:
        def gone(eps: Endpoints) -> bool:
            e = next((e for e in eps if e.url == url), None)
            return e is None or e.terminating or e.pod != pod

        try:
            await self.discovery.wait_until(gone, self.stop_timeout_s)
        except TimeoutError:
            log.warning(
                "%s: scaled down for pod %s, which is still serving after %gs: the "
                "controller removed another pod (one not ready ranks first whatever its "
                "%s); %s keeps the lowest cost and goes at the next scale-down",
                self.workload,
                pod,
                self.stop_timeout_s,
                DELETION_COST,
                pod,
            )

    def _refused(self, what: str, e: ApiException) -> str:
        hint = ""
        if e.status in (401, 403):
            hint = (
                f": the service account needs get/patch on {self.workload.kind}s/scale "
                "and patch on pods"
            )
        elif e.status == 404:
            hint = ": no such workload (check --kube-workload and --kube-namespace)"
        return f"cannot {what} {self.workload}: HTTP {e.status} {e.reason}{hint}"
