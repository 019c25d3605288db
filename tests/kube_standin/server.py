"""The stand-in Kubernetes API server, ``StandIn`` (tests/kube_standin/, whose
docstring says what it is and is not): its life in a thread of its own, its routes, and
what the tests call.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import yaml
from aiohttp import web
from kubernetes_asyncio.client import (
    ApiClient,
    V1ObjectMeta,
    V1OwnerReference,
    V2CrossVersionObjectReference,
    V2HorizontalPodAutoscaler,
    V2HorizontalPodAutoscalerSpec,
)

from tests.kube_standin.handlers import Handlers
from tests.kube_standin.records import (
    CHAOS_GROUP,
    CHAOS_VERSION,
    KEDA_GROUP,
    KEDA_VERSION,
    TOKEN,
    Call,
    PodState,
    ServiceState,
    WorkloadState,
)
from tests.kube_standin.watch import ListAndWatch

T = TypeVar("T")


class StandIn(Handlers, ListAndWatch):
    """The stand-in API server; see the package's docstring (tests/kube_standin/).
    ``start()`` / ``stop()`` are blocking (a fixture's); everything else is ``async``."""

    # -- life ----------------------------------------------------------------------------
    def start(self) -> StandIn:
        self._thread = threading.Thread(target=self._serve, name="kube-standin", daemon=True)
        self._thread.start()
        if not self._started.wait(15):
            raise RuntimeError("the stand-in API server did not start")
        self._write_kubeconfig()
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._startup())
        self._started.set()
        loop.run_forever()
        loop.close()

    async def _startup(self) -> None:
        self._api = ApiClient()  # for its serializer only (made in this loop: it has a session)
        app = web.Application(middlewares=[self._record])
        r = app.router
        ns = "/namespaces/{ns}"
        r.add_get("/apis/discovery.k8s.io/v1" + ns + "/endpointslices", self._list_slices)
        r.add_get("/api/v1" + ns + "/pods", self._list_pods)
        r.add_get("/api/v1" + ns + "/pods/{name}", self._get_pod)
        r.add_patch("/api/v1" + ns + "/pods/{name}", self._patch_pod)
        r.add_delete("/api/v1" + ns + "/pods/{name}", self._delete_pod)
        for plural in ("deployments", "statefulsets"):
            path = "/apis/apps/v1" + ns + f"/{plural}/{{name}}/scale"
            r.add_get(path, self._get_scale)
            r.add_patch(path, self._patch_scale)
        np = "/apis/networking.k8s.io/v1" + ns + "/networkpolicies"
        r.add_get(np, self._list_policies)
        r.add_post(np, self._create_policy)
        r.add_delete(np + "/{name}", self._delete_policy)
        chaos = f"/apis/{CHAOS_GROUP}/{CHAOS_VERSION}"
        r.add_get(chaos, self._chaos_discovery)
        r.add_get(chaos + ns + "/{plural}", self._list_chaos)
        r.add_post(chaos + ns + "/{plural}", self._create_chaos)
        r.add_delete(chaos + ns + "/{plural}/{name}", self._delete_chaos)
        r.add_get("/apis/autoscaling/v2" + ns + "/horizontalpodautoscalers", self._list_hpas)
        keda = f"/apis/{KEDA_GROUP}/{KEDA_VERSION}"
        r.add_get(keda + ns + "/scaledobjects", self._list_scaled_objects)
        # short: open watches are cut at shutdown, nothing else is long
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def _shutdown(self) -> None:
        for w in list(self._watchers):
            self._drop(w)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        procs = [p.proc for p in self.pods.values() if p.proc is not None]
        await asyncio.gather(*(asyncio.to_thread(p.kill) for p in procs))
        if self._runner is not None:
            await self._runner.cleanup()
        if self._api is not None:
            await self._api.close()

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "tectonic", "user": {"token": TOKEN}}],
            "contexts": [
                {
                    "name": "standin",
                    "context": {
                        "cluster": "standin",
                        "user": "tectonic",
                        "namespace": self.namespace,
                    },
                }
            ],
            "current-context": "standin",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    async def _in_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    # -- what tests call -----------------------------------------------------------------
    @property
    def calls(self) -> list[Call]:
        with self._calls_lock:
            return list(self._calls)

    def calls_since(self, mark: int) -> list[Call]:
        return self.calls[mark:]

    def mark(self) -> int:
        return len(self.calls)

    async def add_workload(
        self,
        kind: str,
        name: str,
        replicas: int,
        labels: dict[str, str],
        *,
        service: str | None = None,
        port_name: str = "http",
        process: bool = True,
        zone: str = "zone-a",
        hang: bool = False,
        wait: bool = True,
    ) -> None:
        """A Deployment or StatefulSet (and, with ``service``, a Service selecting its
        pods); waits until its pods are ready."""

        async def add() -> None:
            w = WorkloadState(kind, name, self.namespace, replicas, labels, process, zone, hang)
            self.workloads[f"{kind}/{name}"] = w
            if service is not None:
                self.services[service] = ServiceState(service, self.namespace, labels, port_name)
            self._reconcile(w)
            self._refresh_slices()

        await self._in_loop(add())
        if wait and not hang:
            await self.wait_ready(kind, name, replicas)

    async def add_hpa(
        self,
        name: str,
        target: str,
        *,
        kind: str = "Deployment",
        api_version: str = "apps/v1",
        made_by: str | None = None,
    ) -> None:
        """A HorizontalPodAutoscaler (autoscaling/v2) whose ``scaleTargetRef`` is ``kind``
        ``target``; ``made_by``: the ScaledObject owning it (KEDA makes one per object)."""
        owners = None
        if made_by is not None:
            owner = V1OwnerReference(
                api_version=f"{KEDA_GROUP}/{KEDA_VERSION}",
                kind="ScaledObject",
                name=made_by,
                uid=secrets.token_hex(8),
                controller=True,
            )
            owners = [owner]

        async def add() -> None:
            meta = V1ObjectMeta(
                name=name,
                namespace=self.namespace,
                resource_version=str(self._next_rv()),
                uid=secrets.token_hex(8),
                owner_references=owners,
            )
            ref = V2CrossVersionObjectReference(api_version=api_version, kind=kind, name=target)
            spec = V2HorizontalPodAutoscalerSpec(
                min_replicas=1, max_replicas=4, scale_target_ref=ref
            )
            self.hpas[name] = V2HorizontalPodAutoscaler(
                api_version="autoscaling/v2",
                kind="HorizontalPodAutoscaler",
                metadata=meta,
                spec=spec,
            )

        await self._in_loop(add())

    async def add_scaled_object(
        self, name: str, target: str, *, kind: str | None = None, api_version: str | None = None
    ) -> None:
        """A KEDA ScaledObject (keda.sh/v1alpha1) whose ``scaleTargetRef`` names ``target``;
        ``kind`` / ``api_version`` None: left out, as KEDA allows (Deployment, apps/v1)."""
        ref: dict[str, Any] = {"name": target}
        if kind is not None:
            ref["kind"] = kind
        if api_version is not None:
            ref["apiVersion"] = api_version

        async def add() -> None:
            self.scaled_objects[name] = {
                "apiVersion": f"{KEDA_GROUP}/{KEDA_VERSION}",
                "kind": "ScaledObject",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "resourceVersion": str(self._next_rv()),
                    "uid": secrets.token_hex(8),
                },
                "spec": {"scaleTargetRef": ref, "minReplicaCount": 1, "maxReplicaCount": 4},
            }

        await self._in_loop(add())

    async def wait_ready(self, kind: str, name: str, count: int, within: float = 60.0) -> None:
        """Until ``count`` pods of the workload are ready and none is terminating."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            pods = [p for p in list(self.pods.values()) if p.workload == f"{kind}/{name}"]
            if sum(p.ready for p in pods) == count and len(pods) == count:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{kind}/{name}: {count} ready pods not within {within}s")

    def pods_of(self, kind: str, name: str) -> list[PodState]:
        return sorted(
            (p for p in list(self.pods.values()) if p.workload == f"{kind}/{name}"),
            key=lambda p: p.created,
        )

    def pod_at(self, url: str) -> PodState | None:
        return next((p for p in list(self.pods.values()) if p.url == url), None)

    def replicas(self, kind: str, name: str) -> int:
        return self.workloads[f"{kind}/{name}"].replicas

    async def scale(self, kind: str, name: str, replicas: int) -> None:
        """What ``kubectl scale`` would do (not recorded: it is the test's, not a client's)."""

        async def scale() -> None:
            self._set_replicas(self.workloads[f"{kind}/{name}"], replicas)

        await self._in_loop(scale())

    async def while_disconnected(
        self, kind: str, name: str, replicas: int, *, compact: bool = False
    ) -> int:
        """Drop every watch, scale the workload while nobody watches and (``compact``)
        forget the history, all at once: a client resuming from the version it had
        seen meets 410 when compacted, else the events it missed. The version after."""

        async def change() -> int:
            for w in list(self._watchers):
                self._drop(w)
                self._watchers.discard(w)
            self._set_replicas(self.workloads[f"{kind}/{name}"], replicas)
            if compact:
                for resource in self._history:
                    self._history[resource].clear()
                    self._compacted[resource] = self._rv
            return self._rv

        return await self._in_loop(change())

    async def drop_watches(self, *, cut_next: bool = False) -> int:
        """Close every open watch stream: now, or (``cut_next``) while sending its next
        event, half of whose line goes out first. Returns how many there were."""

        async def drop() -> int:
            for w in self._watchers:
                if cut_next:
                    w.cut_next = True
                else:
                    self._drop(w)
            return len(self._watchers)

        return await self._in_loop(drop())

    async def compact(self) -> int:
        """Forget the history: a watch from any version seen so far answers 410."""

        async def compact() -> int:
            for resource in self._history:
                self._history[resource].clear()
                self._compacted[resource] = self._rv
            return self._rv

        return await self._in_loop(compact())

    async def watchers(self) -> int:
        async def count() -> int:
            return len(self._watchers)

        return await self._in_loop(count())
