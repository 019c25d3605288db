"""What a Kubernetes drill acts on: a region's model pods and labelled pod groups, how
they are listed and deleted, and the pure reading of a pod (running, ready, ordinal,
which pod a replica id names)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kubernetes_asyncio.client import ApiClient, CoreV1Api, V1Pod
from kubernetes_asyncio.client.exceptions import ApiException

# records a fact for the drill's journal: what was deleted, created, waited for
Note = Callable[[str, object], None]


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


def refused(what: str, e: ApiException) -> str:
    """The message of a call the API server refused."""
    hint = " (the drill's service account needs the drill Role)" if e.status in (401, 403) else ""
    return f"cannot {what}: HTTP {e.status} {e.reason}{hint}"


async def list_pods(api: ApiClient, namespace: str, selector: str, timeout_s: float) -> list[V1Pod]:
    """The pods ``selector`` matches, by name (a stable order for "the first N")."""
    page = await CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=selector, _request_timeout=timeout_s
    )
    return sorted(page.items or (), key=lambda p: str(p.metadata.name))


async def delete_pod(api: ApiClient, namespace: str, name: str, timeout_s: float) -> bool:
    """DELETE with zero grace; False when it was gone already."""
    try:
        await CoreV1Api(api).delete_namespaced_pod(
            name, namespace, grace_period_seconds=0, _request_timeout=timeout_s
        )
    except ApiException as e:
        if e.status == 404:
            return False
        raise KubeDrillError(refused(f"delete pod {namespace}/{name}", e)) from e
    return True


def leader_pod(rid: str, pods: Sequence[str]) -> str | None:
    """The pod of the replica id ``rid``: the pod named so, or the one whose name is
    ``rid`` less its ``-<pid>`` tail (the default id is ``<hostname>-<pid>``)."""
    if rid in pods:
        return rid
    head, _, tail = rid.rpartition("-")
    return head if tail.isdigit() and head in pods else None


def running(p: V1Pod) -> bool:
    """Not being deleted, and running or about to."""
    return p.metadata.deletion_timestamp is None and (p.status.phase if p.status else "") in (
        "Running",
        "Pending",
    )


def ready(p: V1Pod) -> bool:
    if p.metadata.deletion_timestamp is not None or p.status is None:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())


def ordinal(name: str, default: int) -> int:
    """A StatefulSet pod's ordinal (its name's ``-<digits>`` tail), else ``default``."""
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else default
