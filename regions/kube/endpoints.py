"""EndpointSlices folded into replica endpoints: pure, no I/O.

A Service's endpoints are spread over EndpointSlices (``discovery.k8s.io/v1``), each
with its own ports and up to 100 endpoints; the same endpoint may sit in two slices for
a moment while the controller moves it. :func:`fold_slices` turns the slices of one
Service into one :class:`KubeEndpoint` per address, with the port Tectonic talks to:

- ``conditions`` as the API defines them: ``ready`` nil means true, ``serving`` nil
  means true, ``terminating`` nil means false;
- ``targetRef`` (the pod's name and namespace: what the launcher annotates, the labeler
  labels and a drill deletes) and ``zone``;
- the port by name (``port_name``, e.g. ``http``) or number (``port``, the pod's
  container port: slices list target ports), or the slice's only port.

Routable (:attr:`KubeEndpoint.routable`): ready and not terminating. A pod that is
terminating but still serving (``serving=true, terminating=true``: its readiness probe
passes while it drains) is listed, so the agent can see it go, and never routed: it is
on its way out (a scale-down or a deletion) and new work sent there is cut when it
exits. vLLM's own readiness says nothing about sleep: a sleeping vLLM is Ready to the
kubelet, so readiness here is only "the process answers", never "it is awake".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kubernetes_asyncio.client import V1EndpointSlice

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class PortNotFound(ValueError):
    """A slice has no port that matches what discovery was asked to use."""


@dataclass(frozen=True, slots=True)
class KubeEndpoint:
    """One endpoint of the Service (one pod, for pod-backed Services)."""

    address: str
    port: int
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    pod: str | None = None  # targetRef.name (kind Pod)
    pod_namespace: str | None = None
    zone: str | None = None
    node: str | None = None
    slice: str = ""  # the EndpointSlice it was read from

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address  # IPv6
        return f"http://{host}:{self.port}"

    @property
    def routable(self) -> bool:
        return self.ready and not self.terminating


def service_selector(service: str) -> str:
    """The label selector of a Service's EndpointSlices."""
    return f"{SERVICE_NAME_LABEL}={service}"


def slice_port(s: V1EndpointSlice, port_name: str | None, port: int | None) -> int | None:
    """The port of slice ``s`` to use; None when the slice lists no ports at all (the
    controller writes such slices for a Service with no matching pods)."""
    ports = list(s.ports or ())
    if not ports:
        return None
    if port is not None:
        if any(p.port == port for p in ports):
            return port
        raise PortNotFound(f"slice {_name(s)} has no port {port} (has {_ports(s)})")
    if port_name is not None:
        for p in ports:
            if (p.name or "") == port_name:
                return int(p.port)
        raise PortNotFound(f"slice {_name(s)} has no port named {port_name!r} (has {_ports(s)})")
    if len(ports) == 1:
        return int(ports[0].port)
    raise PortNotFound(
        f"slice {_name(s)} has several ports ({_ports(s)}): say which (a port name or number)"
    )


def endpoints_of(s: V1EndpointSlice, port_name: str | None, port: int | None) -> list[KubeEndpoint]:
    """The endpoints of one slice (FQDN slices are skipped: a pod has an address)."""
    if (s.address_type or "IPv4") == "FQDN":
        return []
    number = slice_port(s, port_name, port)
    if number is None:
        return []
    out = []
    for e in s.endpoints or ():
        if not e.addresses:
            continue
        c = e.conditions
        ref = e.target_ref
        is_pod = ref is not None and (ref.kind or "Pod") == "Pod"
        out.append(
            KubeEndpoint(
                address=e.addresses[0],  # the API: consumers use the first address
                port=number,
                ready=_flag(c.ready if c else None, default=True),
                serving=_flag(c.serving if c else None, default=True),
                terminating=_flag(c.terminating if c else None, default=False),
                pod=ref.name if is_pod else None,
                pod_namespace=ref.namespace if is_pod else None,
                zone=e.zone or None,
                node=e.node_name or None,
                slice=_name(s),
            )
        )
    return out


def fold_slices(
    slices: Iterable[V1EndpointSlice], *, port_name: str | None = None, port: int | None = None
) -> tuple[KubeEndpoint, ...]:
    """Every endpoint of these slices, once per URL, sorted by URL. An endpoint in two
    slices (moving between them) is taken from the slice where it is routable, else the
    first one by slice name: the fold does not depend on the order slices arrive in."""
    best: dict[str, KubeEndpoint] = {}
    for s in sorted(slices, key=_name):
        for e in endpoints_of(s, port_name, port):
            seen = best.get(e.url)
            if seen is None or (e.routable and not seen.routable):
                best[e.url] = e
    return tuple(best[u] for u in sorted(best))


def routable_urls(endpoints: Iterable[KubeEndpoint]) -> list[str]:
    """Base URLs of the endpoints to route to: ready and not terminating."""
    return [e.url for e in endpoints if e.routable]


def _flag(value: bool | None, *, default: bool) -> bool:
    return default if value is None else bool(value)


def _name(s: V1EndpointSlice) -> str:
    return (s.metadata.name if s.metadata else None) or ""


def _ports(s: V1EndpointSlice) -> str:
    return ", ".join(f"{p.name or '(unnamed)'}:{p.port}" for p in s.ports or ()) or "none"
