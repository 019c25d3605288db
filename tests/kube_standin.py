"""A STAND-IN for the Kubernetes API server, for the tests of regions/kube and chaos/kube.

This is not a kube-apiserver (none can run where these tests run: no package ships one,
and nothing can be downloaded). It is a small aiohttp server on 127.0.0.1 that speaks
the part of the API server's wire protocol Tectonic's adapters use, so that the real
client (``kubernetes-asyncio``) and the real adapters are exercised over real HTTP:

- list and watch of EndpointSlices and Pods: chunked JSON lines, ``resourceVersion``,
  BOOKMARK events (with ``allowWatchBookmarks``), ``timeoutSeconds``, a watch from a
  compacted version answered with an ERROR event of code 410 (or, ``gone_as_status``,
  an HTTP 410), and hooks for a test to drop the streams (now, or cutting the next
  event in the middle of its line);
- GET/PATCH ``deployments/NAME/scale`` and ``statefulsets/NAME/scale`` (a
  ``metadata.resourceVersion`` in the patch is a precondition: 409 when stale);
- PATCH pods (strategic-merge and JSON merge patches of maps: the two agree there),
  DELETE pods (``gracePeriodSeconds``), GET pods;
- create / delete / list NetworkPolicies (stored, never enforced: a CNI enforces them);
- API discovery for Chaos Mesh (``GET /apis/chaos-mesh.org/v1alpha1``: present or 404
  per stand-in) and its HTTPChaos / NetworkChaos objects (stored, never acted on);
- every call recorded (:attr:`StandIn.calls`).

Every object it serves goes through ``kubernetes-asyncio``'s own models and
``ApiClient.sanitize_for_serialization`` (custom resources, which have no model, are
the dicts the client sent; a BOOKMARK's object is kind, apiVersion and metadata only, as a
real server's), so the JSON cannot drift from what the client parses.

It also plays the controllers the adapters rely on: a Deployment's ReplicaSet (scale
up creates pods; scale down removes the pods that rank first: not ready, then the
lowest ``controller.kubernetes.io/pod-deletion-cost``, then the newest; a deleted pod
is replaced), a StatefulSet (``name-0..N-1``; scale down removes the highest ordinal)
and the EndpointSlice controller (one slice per ``slice_size`` endpoints of a Service;
``ready`` = the pod is ready and not terminating, ``serving`` = ready, ``terminating``).
The "pods" are real simulators (``chaos.lab.procs.start_simulator``) on their own
127.0.0.x address and the stand-in's port, so whatever probes them speaks real HTTP;
``process=False`` workloads (a control plane, etcd) are pods with nothing behind them.

The server runs in a thread of its own with its own event loop, as a real API server is
another process: code that blocks on it from a test's loop (a drill target) does not
deadlock. Test-facing methods are ``async`` and run their work in that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import json
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import yaml
from aiohttp import web
from kubernetes_asyncio.client import (
    ApiClient,
    DiscoveryV1EndpointPort,
    V1APIResource,
    V1APIResourceList,
    V1Container,
    V1Endpoint,
    V1EndpointConditions,
    V1EndpointSlice,
    V1EndpointSliceList,
    V1ListMeta,
    V1NetworkPolicy,
    V1NetworkPolicyList,
    V1ObjectMeta,
    V1ObjectReference,
    V1Pod,
    V1PodCondition,
    V1PodList,
    V1PodSpec,
    V1PodStatus,
    V1Scale,
    V1ScaleSpec,
    V1ScaleStatus,
    V1Status,
    V1WatchEvent,
)

from chaos.lab.procs import Proc, start_simulator

T = TypeVar("T")
TOKEN = "stand-in-token"
CHAOS_GROUP, CHAOS_VERSION = "chaos-mesh.org", "v1alpha1"
CHAOS_KINDS = {"httpchaos": "HTTPChaos", "networkchaos": "NetworkChaos"}
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


@dataclass(frozen=True)
class Call:
    """One request the stand-in answered."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    status: int
    body: Any = None  # the JSON sent, if any

    @property
    def watch(self) -> bool:
        return self.query.get("watch", "").lower() == "true"

    def describe(self) -> str:
        q = "&".join(f"{k}={v}" for k, v in sorted(self.query.items()))
        return f"{self.method} {self.path}{'?' + q if q else ''} -> {self.status}"


@dataclass
class PodState:
    model: V1Pod
    workload: str  # kind/name
    ip: str
    port: int
    proc: Proc | None = None
    ready_at: float = 0.0
    created: int = 0  # creation order

    @property
    def name(self) -> str:
        return str(self.model.metadata.name)

    @property
    def ready(self) -> bool:
        return any(
            c.type == "Ready" and c.status == "True" for c in self.model.status.conditions or ()
        )

    @property
    def terminating(self) -> bool:
        return self.model.metadata.deletion_timestamp is not None

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.model.metadata.labels or {})

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.model.metadata.annotations or {})


@dataclass
class WorkloadState:
    kind: str  # deployment | statefulset
    name: str
    namespace: str
    replicas: int
    labels: dict[str, str]
    process: bool
    zone: str
    hang: bool = False  # pods that never become ready (no GPU free, a failing probe)
    version: int = 0
    ordinals: itertools.count[int] = field(default_factory=itertools.count)


@dataclass
class ServiceState:
    name: str
    namespace: str
    selector: dict[str, str]
    port_name: str


@dataclass(eq=False)  # by identity: a set of the open streams
class Watcher:
    resource: str  # pods | endpointslices
    namespace: str
    selector: str
    queue: asyncio.Queue[tuple[int, str, dict[str, Any]]]
    request: web.Request
    cut_next: bool = False
    dropped: asyncio.Event = field(default_factory=asyncio.Event)


def parse_selector(text: str) -> Callable[[dict[str, str]], bool]:
    """Equality-based label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``."""
    tests: list[Callable[[dict[str, str]], bool]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "!=" in part:
            k, v = part.split("!=", 1)
            tests.append(lambda labels, k=k, v=v: labels.get(k) != v)
        elif "=" in part:
            k, v = part.replace("==", "=").split("=", 1)
            tests.append(lambda labels, k=k, v=v: labels.get(k) == v)
        elif part.startswith("!"):
            tests.append(lambda labels, k=part[1:]: k not in labels)
        else:
            tests.append(lambda labels, k=part: k in labels)
    return lambda labels: all(t(labels) for t in tests)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null removes a key). On maps, strategic merge agrees."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def free_port() -> int:
    """A port free on every address (the pods share it, each on its own 127.0.0.x)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


class StandIn:
    """The stand-in API server; see the module docstring. ``start()`` / ``stop()`` are
    blocking (a fixture's); everything else is ``async``."""

    def __init__(
        self,
        workdir: Path,
        *,
        namespace: str = "models",
        chaos_mesh: bool = False,
        bookmark_s: float = 0.2,
        slice_size: int = 100,
        gone_as_status: bool = False,
        termination_s: float = 0.3,
        sim_args: tuple[str, ...] = (),
        first_ip: int = 10,
    ) -> None:
        self.workdir, self.namespace = workdir, namespace
        self.chaos_mesh, self.bookmark_s, self.slice_size = chaos_mesh, bookmark_s, slice_size
        self.gone_as_status, self.termination_s = gone_as_status, termination_s
        self.sim_args = sim_args
        self.port = free_port()  # every pod's port
        self._ips = (f"127.0.{n // 250}.{n % 250 + 1}" for n in itertools.count(first_ip))
        self.url = ""
        self.kubeconfig = workdir / "kubeconfig"
        self._calls: list[Call] = []
        self._calls_lock = threading.Lock()
        self._recorded: set[int] = set()  # requests noted already (by id)
        self._rv = 0
        self._history: dict[str, list[tuple[int, str, dict[str, Any]]]] = {
            "pods": [],
            "endpointslices": [],
        }
        self._compacted: dict[str, int] = {"pods": 0, "endpointslices": 0}
        self.pods: dict[str, PodState] = {}
        self.workloads: dict[str, WorkloadState] = {}  # kind/name
        self.services: dict[str, ServiceState] = {}
        self.slices: dict[str, dict[str, Any]] = {}  # name -> serialized slice
        self._slice_rv: dict[str, int] = {}
        self.network_policies: dict[str, V1NetworkPolicy] = {}
        self.chaos: dict[tuple[str, str], dict[str, Any]] = {}  # (plural, name) -> object
        self._watchers: set[Watcher] = set()
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._api: ApiClient | None = None
        self._started = threading.Event()

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

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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

    def _drop(self, w: Watcher) -> None:
        """Cut ``w``'s connection now (its stream loop wakes on the sentinel)."""
        w.dropped.set()
        _cut(w.request)
        w.queue.put_nowait((-1, "", {}))

    # -- the recorder --------------------------------------------------------------------
    @web.middleware
    async def _record(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        body: Any = None
        if request.can_read_body:
            raw = await request.read()
            with contextlib.suppress(ValueError):
                body = json.loads(raw) if raw else None
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._note(request, 401, body)
            return self._status(401, "Unauthorized", "no or bad token")
        try:
            response = await handler(request)
        except web.HTTPException as e:  # the router's 404 / 405
            response = self._status(e.status, e.reason, e.text or e.reason)
        except Exception as e:  # a stand-in bug: recorded, and said out loud
            self._note(request, 500, body)
            raise RuntimeError(f"stand-in failed on {request.method} {request.path}") from e
        finally:
            noted = id(request) in self._recorded  # a watch, noted when it opened
            self._recorded.discard(id(request))
        if not noted:
            self._note(request, response.status, body)
        return response

    def _note(
        self, request: web.Request, status: int, body: Any = None, *, early: bool = False
    ) -> None:
        """Record a call; ``early``: a watch, when its stream opens (it may never end),
        which the recorder then leaves alone."""
        if early:
            self._recorded.add(id(request))
        call = Call(
            request.method,
            request.path,
            dict(request.query),
            request.headers.get("Content-Type", ""),
            status,
            body,
        )
        with self._calls_lock:
            self._calls.append(call)

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        return json.loads(raw) if raw else None

    # -- serialization: through the client's models -------------------------------------
    def _json(self, model: Any) -> Any:
        assert self._api is not None
        return self._api.sanitize_for_serialization(model)

    def _model(self, data: Any, klass: str) -> Any:
        assert self._api is not None
        return self._api.deserialize(cast(Any, SimpleNamespace(data=json.dumps(data))), klass)

    def _answer(self, model: Any, status: int = 200) -> web.Response:
        return web.json_response(self._json(model), status=status)

    def _status(self, code: int, reason: str, message: str) -> web.Response:
        status = V1Status(
            api_version="v1",
            kind="Status",
            status="Failure" if code >= 400 else "Success",
            code=code,
            reason=reason,
            message=message,
            metadata=V1ListMeta(),
        )
        return self._answer(status, code)

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    # -- events --------------------------------------------------------------------------
    def _emit(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self._history[resource].append((rv, kind, obj))
        for w in self._watchers:
            if w.resource == resource and self._matches(w.namespace, w.selector, obj):
                w.queue.put_nowait((rv, kind, obj))

    def _matches(self, namespace: str, selector: str, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return meta.get("namespace") == namespace and parse_selector(selector)(
            meta.get("labels") or {}
        )

    # -- pods ----------------------------------------------------------------------------
    def _pod_json(self, p: PodState) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(p.model))

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

    # -- list and watch ------------------------------------------------------------------
    async def _list_slices(self, request: web.Request) -> web.StreamResponse:
        ns, selector = request.match_info["ns"], request.query.get("labelSelector", "")
        current = [o for o in self.slices.values() if self._matches(ns, selector, o)]
        if _watching(request):
            return await self._watch(request, "endpointslices", ns, selector, current)
        items = [self._model(o, "V1EndpointSlice") for o in current]
        meta = V1ListMeta(resource_version=str(self._rv))
        return self._answer(
            V1EndpointSliceList(
                api_version="discovery.k8s.io/v1",
                kind="EndpointSliceList",
                items=items,
                metadata=meta,
            )
        )

    async def _list_pods(self, request: web.Request) -> web.StreamResponse:
        ns, selector = request.match_info["ns"], request.query.get("labelSelector", "")
        current = [self._pod_json(p) for p in self.pods.values()]
        current = [o for o in current if self._matches(ns, selector, o)]
        if _watching(request):
            return await self._watch(request, "pods", ns, selector, current)
        items = [p.model for p in self.pods.values() if self._pod_json(p) in current]
        meta = V1ListMeta(resource_version=str(self._rv))
        return self._answer(V1PodList(api_version="v1", kind="PodList", items=items, metadata=meta))

    async def _watch(
        self,
        request: web.Request,
        resource: str,
        namespace: str,
        selector: str,
        current: list[dict[str, Any]],
    ) -> web.StreamResponse:
        since_text = request.query.get("resourceVersion", "")
        since = int(since_text) if since_text not in ("", "0") else None
        gone = since is not None and since < self._compacted[resource]
        if gone and self.gone_as_status:
            return self._status(410, "Expired", f"too old resource version: {since}")
        w = Watcher(resource, namespace, selector, asyncio.Queue(), request)
        if since is None:  # "any version": the current state first, as ADDED
            for obj in current:
                w.queue.put_nowait((int(obj["metadata"]["resourceVersion"]), "ADDED", obj))
        elif not gone:
            for rv, kind, obj in self._history[resource]:
                if rv > since and self._matches(namespace, selector, obj):
                    w.queue.put_nowait((rv, kind, obj))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        self._note(request, 200, early=True)
        if gone:
            await self._send_error(response, since or 0)
            return response
        self._watchers.add(w)
        try:
            await self._stream(w, response, _timeout(request), _bookmarks(request))
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watchers.discard(w)
        return response

    async def _stream(
        self, w: Watcher, response: web.StreamResponse, timeout_s: float, bookmarks: bool
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if w.dropped.is_set():
                _cut(w.request)
                return
            wait = min(self.bookmark_s, max(0.0, deadline - time.monotonic()))
            try:
                _rv, kind, obj = await asyncio.wait_for(w.queue.get(), wait)
            except TimeoutError:
                if bookmarks and not w.dropped.is_set():
                    await self._send_bookmark(w, response)
                continue
            if w.dropped.is_set():
                return
            line = self._event_line(kind, obj)
            if w.cut_next:
                await response.write(line[: len(line) // 2])
                _cut(w.request)
                return
            await response.write(line)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()

    def _event_line(self, kind: str, obj: dict[str, Any]) -> bytes:
        event = self._json(V1WatchEvent(type=kind, object=obj))
        return json.dumps(event).encode() + b"\n"

    async def _send_bookmark(self, w: Watcher, response: web.StreamResponse) -> None:
        meta = self._json(V1ObjectMeta(resource_version=str(self._rv)))
        kind, api = (
            ("Pod", "v1") if w.resource == "pods" else ("EndpointSlice", "discovery.k8s.io/v1")
        )
        obj = {"kind": kind, "apiVersion": api, "metadata": meta}  # a bookmark: no spec
        await response.write(self._event_line("BOOKMARK", obj))

    async def _send_error(self, response: web.StreamResponse, since: int) -> None:
        status = V1Status(
            api_version="v1",
            kind="Status",
            status="Failure",
            code=410,
            reason="Expired",
            message=f"too old resource version: {since} ({self._rv})",
            metadata=V1ListMeta(),
        )
        await response.write(self._event_line("ERROR", self._json(status)))
        await response.write_eof()

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

    def _set_replicas(self, w: WorkloadState, replicas: int) -> None:
        w.replicas, w.version = replicas, w.version + 1
        self._reconcile(w)

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


# -- helpers -----------------------------------------------------------------------------
def _watching(request: web.Request) -> bool:
    return request.query.get("watch", "").lower() in ("true", "1")  # True or true


def _bookmarks(request: web.Request) -> bool:
    return request.query.get("allowWatchBookmarks", "").lower() in ("true", "1")


def _timeout(request: web.Request) -> float:
    return float(request.query.get("timeoutSeconds", "1800"))


def _cut(request: web.Request) -> None:
    """Drop the connection under the stream (no last chunk: the client sees it cut)."""
    if request.transport is not None:
        request.transport.close()


def _has_list(value: Any) -> bool:
    if isinstance(value, list):
        return True
    return isinstance(value, dict) and any(_has_list(v) for v in value.values())


def _without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}
