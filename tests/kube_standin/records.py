"""What the stand-in API server keeps (tests/kube_standin/): the calls it answered, its
pods, workloads, Services and open watches; equality-based label selectors, JSON merge
patches and a port free on every address.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes_asyncio.client import V1Pod

from chaos.lab.procs import Proc

TOKEN = "stand-in-token"
CHAOS_GROUP, CHAOS_VERSION = "chaos-mesh.org", "v1alpha1"
CHAOS_KINDS = {"httpchaos": "HTTPChaos", "networkchaos": "NetworkChaos"}
KEDA_GROUP, KEDA_VERSION = "keda.sh", "v1alpha1"  # ScaledObjects: a CRD, as Chaos Mesh's
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
