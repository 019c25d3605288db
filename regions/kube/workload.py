"""The workload whose pods a warm pool scales: pure, so that the agent's config can
check ``--kube-workload`` without loading the Kubernetes client."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

WorkloadKind = Literal["deployment", "statefulset"]
_KINDS: dict[str, WorkloadKind] = {
    "deployment": "deployment",
    "deployments": "deployment",
    "deploy": "deployment",
    "statefulset": "statefulset",
    "statefulsets": "statefulset",
    "sts": "statefulset",
}
DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # an object's name (RFC 1123)


@dataclass(frozen=True, slots=True)
class Workload:
    """A Deployment or StatefulSet, by kind, name and namespace."""

    kind: WorkloadKind
    name: str
    namespace: str

    @classmethod
    def parse(cls, text: str, namespace: str) -> Workload:
        """``deployment/NAME`` or ``statefulset/NAME`` (``deploy/``, ``sts/`` too)."""
        kind, sep, name = text.partition("/")
        if not sep or kind.lower() not in _KINDS or not DNS_NAME.match(name):
            raise ValueError(f"workload {text!r}: expected deployment/NAME or statefulset/NAME")
        return cls(_KINDS[kind.lower()], name, namespace)

    def __str__(self) -> str:
        return f"{self.kind}/{self.name} in namespace {self.namespace}"
