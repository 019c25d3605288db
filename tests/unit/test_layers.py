"""The import contracts in pyproject.toml name the control plane's service module by
module (import-linter has no "all of controlplane but the kernel"): these tests make a
module added to controlplane/ fail here until the contracts name it, and keep the
component list of docs/architecture.md §8 in step with the tree."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import controlplane
import regions

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"
]


def _children(package: object) -> set[str]:
    path = package.__path__  # type: ignore[attr-defined]
    name = package.__name__  # type: ignore[attr-defined]
    return {f"{name}.{m.name}" for m in pkgutil.iter_modules(path)}


def _contract(starts: str) -> dict[str, object]:
    found = [c for c in CONTRACTS if str(c["name"]).startswith(starts)]
    assert len(found) == 1, f"one contract named {starts!r}..., found {len(found)}"
    return found[0]


SERVICE = _children(controlplane) - {"controlplane.kernel"}


def test_the_kernel_contract_names_every_service_module() -> None:
    forbidden = set(_contract("The kernel stands alone")["forbidden_modules"])  # type: ignore[arg-type]
    assert forbidden >= SERVICE, f"add to the kernel contract: {sorted(SERVICE - forbidden)}"


def test_the_components_contract_names_every_service_module() -> None:
    c = _contract(
        "The region agent, gateway, simulator, warm pool, drills and capacity probe build on"
    )
    forbidden = set(c["forbidden_modules"])  # type: ignore[arg-type]
    assert forbidden == SERVICE, (
        f"missing: {sorted(SERVICE - forbidden)}, not modules: {sorted(forbidden - SERVICE)}"
    )


def test_every_region_module_belongs_to_a_component() -> None:
    # A module directly under regions/ is shared by the components; only small helpers
    # may live there, anything else belongs inside one component's package.
    shared = {"regions.http_expect", "regions.http_errors"}
    packages = {
        "regions.agent",
        "regions.gateway",
        "regions.kube",
        "regions.picker",
        "regions.pool",
        "regions.simulator",
    }
    assert _children(regions) == shared | packages
