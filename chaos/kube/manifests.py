"""The objects a drill creates in a cluster, built from the scenario: pure, no I/O.

- :func:`blackout_policy`: a region blackout as a NetworkPolicy selecting the region's
  model pods with no ingress and no egress rule: all traffic to and from them denied.
  Only where the cluster's network plugin enforces NetworkPolicies (Calico, Cilium,
  Antrea, ...); a plugin that does not (flannel alone, kindnet before 1.32 ...) accepts
  the object and lets everything through, and nothing in the API says which plugin
  runs (no field, no reliable object): the drill target makes this mode opt-in and
  checks from where it runs whether the pods still answer.
- :func:`chaos_objects`: the scenario's ``fault`` (the simulator's ``/_sim/fault``
  fields) as Chaos Mesh objects: ``added_latency_s`` an HTTPChaos delay on requests,
  ``unavailable_rate`` / ``error_rate`` an HTTPChaos replacing the answers' status with
  503 / 500, ``health_down`` the same on ``/health`` only, ``hang`` a NetworkChaos
  losing every packet. Chaos Mesh picks pods, not requests: a rate is the fraction of
  the region's pods that fail all their requests (at least one pod), which is what the
  returned notes say. ``stream_error_after`` (an in-band error mid-stream) has no
  Chaos Mesh counterpart and is refused. Every object carries a ``duration`` so that a
  drill whose rollbacks never ran cannot leave a fault behind for ever.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import (
    V1LabelSelector,
    V1NetworkPolicy,
    V1NetworkPolicySpec,
    V1ObjectMeta,
)

CHAOS_GROUP, CHAOS_VERSION = "chaos-mesh.org", "v1alpha1"
DRILL_LABEL = "tectonic.io/drill-region"  # on everything a drill creates: how it is found again
MANAGED_BY = {"app.kubernetes.io/managed-by": "tectonic-drill"}


class FaultRefused(ValueError):
    """A fault this target cannot inject (said why)."""


@dataclass(frozen=True, slots=True)
class ChaosObject:
    plural: str  # httpchaos | networkchaos
    body: dict[str, Any]
    note: str = ""

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


def region_slug(region: str) -> str:
    """``region`` as a label value and a part of a DNS-1123 name."""
    return re.sub(r"[^a-z0-9-]+", "-", region.lower()).strip("-")[:40] or "region"


def object_name(prefix: str, region: str) -> str:
    """A DNS-1123 name for ``prefix`` and ``region`` (at most 63 characters)."""
    return f"{prefix}-{region_slug(region)}"[:63].rstrip("-")


def blackout_policy(region: str, namespace: str, pod_labels: Mapping[str, str]) -> V1NetworkPolicy:
    """Deny all ingress and egress of the region's model pods."""
    return V1NetworkPolicy(
        api_version="networking.k8s.io/v1",
        kind="NetworkPolicy",
        metadata=V1ObjectMeta(
            name=object_name("tectonic-blackout", region),
            namespace=namespace,
            labels={DRILL_LABEL: region_slug(region), **MANAGED_BY},
        ),
        spec=V1NetworkPolicySpec(
            pod_selector=V1LabelSelector(match_labels=dict(pod_labels)),
            policy_types=["Ingress", "Egress"],
            ingress=[],  # no rule: nothing allowed in
            egress=[],  # nor out
        ),
    )


def chaos_objects(
    region: str,
    namespace: str,
    pod_labels: Mapping[str, str],
    fault: Mapping[str, object],
    *,
    pods: int,
    port: int,
    duration_s: int = 600,
) -> list[ChaosObject]:
    """The Chaos Mesh objects for ``fault``; :class:`FaultRefused` for a field with no
    counterpart, before anything is built."""
    if fault.get("stream_error_after") is not None:
        raise FaultRefused(
            "stream_error_after (an in-band error mid-stream) has no Chaos Mesh "
            "counterpart: run that drill on the lab's simulators"
        )
    unknown = set(fault) - {
        "added_latency_s", "unavailable_rate", "error_rate", "health_down", "hang",
        "stream_error_after",
    }  # fmt: skip
    if unknown:
        raise FaultRefused(f"unknown fault field(s) {sorted(unknown)}")
    base = _Base(region, namespace, dict(pod_labels), port, f"{duration_s}s")
    out: list[ChaosObject] = []
    latency = _number(fault, "added_latency_s")
    if latency > 0:
        out.append(
            base.http("latency", {"target": "Request", "delay": f"{round(latency * 1000)}ms"})
        )
    for field, code in (("unavailable_rate", 503), ("error_rate", 500)):
        rate = _number(fault, field)
        if rate > 0:
            mode, value, note = _pods_for(rate, pods, field)
            spec = {"target": "Response", "replace": {"code": code}}
            out.append(base.http(f"{code}", spec, mode=mode, value=value, note=note))
    if fault.get("health_down"):
        spec = {"target": "Response", "path": "/health", "replace": {"code": 503}}
        out.append(base.http("health", spec))
    if fault.get("hang"):
        out.append(
            base.network("hang", {"action": "loss", "loss": {"loss": "100", "correlation": "0"}})
        )
    if not out:
        raise FaultRefused(f"the fault {dict(fault)} injects nothing")
    return out


def _number(fault: Mapping[str, object], key: str) -> float:
    value = fault.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def _pods_for(rate: float, pods: int, field: str) -> tuple[str, str | None, str]:
    if rate >= 1.0:
        return "all", None, ""
    n = max(1, min(pods, math.ceil(rate * pods))) if pods else 1
    note = (
        f"{field} {rate:g}: Chaos Mesh fails whole pods, not a share of requests: "
        f"{n} of {pods} pod(s)"
    )
    return "fixed", str(n), note


@dataclass(frozen=True, slots=True)
class _Base:
    region: str
    namespace: str
    labels: dict[str, str]
    port: int
    duration: str

    def _object(
        self, kind: str, what: str, spec: dict[str, Any], mode: str, value: str | None
    ) -> dict[str, Any]:
        selector = {"namespaces": [self.namespace], "labelSelectors": dict(self.labels)}
        full: dict[str, Any] = {
            "mode": mode,
            "selector": selector,
            "duration": self.duration,
            **spec,
        }
        if value is not None:
            full["value"] = value
        return {
            "apiVersion": f"{CHAOS_GROUP}/{CHAOS_VERSION}",
            "kind": kind,
            "metadata": {
                "name": object_name(f"tectonic-{what}", self.region),
                "namespace": self.namespace,
                "labels": {DRILL_LABEL: region_slug(self.region), **MANAGED_BY},
            },
            "spec": full,
        }

    def http(
        self,
        what: str,
        spec: dict[str, Any],
        *,
        mode: str = "all",
        value: str | None = None,
        note: str = "",
    ) -> ChaosObject:
        spec = {"port": self.port, "path": "*", **spec}
        return ChaosObject("httpchaos", self._object("HTTPChaos", what, spec, mode, value), note)

    def network(self, what: str, spec: dict[str, Any]) -> ChaosObject:
        spec = {"direction": "to", **spec}
        return ChaosObject("networkchaos", self._object("NetworkChaos", what, spec, "all", None))


def drill_selector(region: str) -> str:
    """The label selector of what a drill created for ``region``."""
    return f"{DRILL_LABEL}={region_slug(region)}"
