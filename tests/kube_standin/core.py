"""The stand-in API server's state and what every part of it uses
(tests/kube_standin/): the recorder of calls, serialization through kubernetes-asyncio's
own models, and the events watches are sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from aiohttp import web
from kubernetes_asyncio.client import (
    ApiClient,
    V1ListMeta,
    V1NetworkPolicy,
    V1Status,
    V2HorizontalPodAutoscaler,
)

from tests.kube_standin.records import (
    TOKEN,
    Call,
    PodState,
    ServiceState,
    Watcher,
    WorkloadState,
    free_port,
    parse_selector,
)


class StandInCore:
    """The stand-in's state (its options, objects, history and open watches), the
    recorder middleware, serialization and events; the other parts of ``StandIn`` build
    on it."""

    def __init__(
        self,
        workdir: Path,
        *,
        namespace: str = "models",
        chaos_mesh: bool = False,
        keda: bool = False,
        bookmark_s: float = 0.2,
        slice_size: int = 100,
        gone_as_status: bool = False,
        termination_s: float = 0.3,
        sim_args: tuple[str, ...] = (),
        first_ip: int = 10,
    ) -> None:
        self.workdir, self.namespace = workdir, namespace
        self.chaos_mesh, self.bookmark_s, self.slice_size = chaos_mesh, bookmark_s, slice_size
        # Read at each request, so a test may flip them: KEDA's CRD installed (else its
        # scaledobjects answer 404), and the resources whose list RBAC forbids (403).
        self.keda = keda
        self.forbidden: set[str] = set()  # plurals: horizontalpodautoscalers, scaledobjects
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
        self.hpas: dict[str, V2HorizontalPodAutoscaler] = {}  # name -> autoscaling/v2 object
        self.scaled_objects: dict[str, dict[str, Any]] = {}  # name -> keda.sh/v1alpha1 object
        self._watchers: set[Watcher] = set()
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._api: ApiClient | None = None
        self._started = threading.Event()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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

    def _pod_json(self, p: PodState) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(p.model))

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
