"""The import contracts in pyproject.toml: no hand-kept module list, and each one breaks.

The contracts forbid by wildcard ("controlplane.*"), so a module added to controlplane/
is covered without being named; the kernel's floors are exhaustive, so a module added
to the kernel must take a floor. These tests copy the sources to a scratch folder, add
imports that break the rules, and check that lint-imports says which contract broke:
a contract that cannot fail proves nothing."""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import regions

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = CONFIG["contracts"]
LINT = Path(sys.executable).with_name("lint-imports")


def _children(package: object) -> set[str]:
    path = package.__path__  # type: ignore[attr-defined]
    name = package.__name__  # type: ignore[attr-defined]
    return {f"{name}.{m.name}" for m in pkgutil.iter_modules(path)}


def _name(starts: str) -> str:
    found = [str(c["name"]) for c in CONTRACTS if str(c["name"]).startswith(starts)]
    assert len(found) == 1, f"one contract named {starts!r}..., found {len(found)}"
    return found[0]


def test_no_contract_lists_the_services_module_by_module() -> None:
    for c in CONTRACTS:
        named = [*c.get("forbidden_modules", []), *c.get("source_modules", [])]
        service = [m for m in named if m.startswith("controlplane.") and "kernel" not in m]
        assert len(service) <= 6, f"{c['name']!r} lists {len(service)} service modules"
    assert len(CONTRACTS) >= 20


def test_every_region_module_belongs_to_a_component() -> None:
    # A module directly under regions/ is shared by the components; only small helpers
    # may live there, anything else belongs inside one component's package (or the
    # data plane's shared core).
    shared = {"regions.http_expect", "regions.http_errors"}
    packages = {
        "regions.agent",
        "regions.dataplane",
        "regions.gateway",
        "regions.kube",
        "regions.picker",
        "regions.pool",
        "regions.simulator",
    }
    assert _children(regions) == shared | packages


def _scratch(tmp: Path) -> Path:
    for top in ("controlplane", "regions", "chaos"):
        shutil.copytree(
            ROOT / top, tmp / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def _add(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(f"\n{line}\n")


def _lint(tree: Path) -> str:
    if not LINT.exists():
        pytest.skip("lint-imports is not installed next to this python: scripts/setup.sh")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [str(LINT), "--no-cache", "--no-logo"], cwd=tree, env=env, capture_output=True, text=True
    )
    return " ".join((out.stdout + out.stderr).split())  # names wrap across lines


def test_the_unmodified_tree_keeps_every_contract(tmp_path: Path) -> None:
    out = _lint(_scratch(tmp_path))
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in out, out[-2000:]


def test_a_new_service_module_is_covered_without_being_named(tmp_path: Path) -> None:
    tree = _scratch(tmp_path)
    _add(tree / "controlplane" / "brand_new_service.py", "X = 1")
    _add(tree / "controlplane" / "kernel" / "keys.py", "import controlplane.brand_new_service")
    _add(tree / "regions" / "dataplane" / "ring.py", "import controlplane.brand_new_service")
    out = _lint(tree)
    assert f"{_name('The kernel stands alone')} BROKEN" in out, out[-3000:]
    assert f"{_name('The region agent, gateway, simulator, warm pool')} BROKEN" in out


def test_the_kernel_floors_data_plane_core_and_picker_break_when_crossed(tmp_path: Path) -> None:
    tree = _scratch(tmp_path)
    kernel = tree / "controlplane" / "kernel"
    _add(kernel / "model.py", "import controlplane.kernel.config")  # the foundation up
    _add(kernel / "prefix" / "catalog.py", "import controlplane.kernel.sessions.resolve")
    _add(tree / "regions" / "dataplane" / "prompts.py", "import regions.gateway.app")
    _add(tree / "regions" / "picker" / "pick.py", "import regions.gateway.proxy")
    out = _lint(tree)
    floors = _name("The kernel has floors")
    assert f"{floors} BROKEN" in out, out[-3000:]
    assert "controlplane.kernel.model -> controlplane.kernel.config" in out
    assert "controlplane.kernel.prefix.catalog -> controlplane.kernel.sessions.resolve" in out
    assert f"{_name('The data plane')} BROKEN" in out
    assert f"{_name('The endpoint picker builds on')} BROKEN" in out
    assert "regions.picker.pick -> regions.gateway.proxy" in out


def test_a_kernel_module_without_a_floor_breaks_the_floors(tmp_path: Path) -> None:
    tree = _scratch(tmp_path)
    _add(tree / "controlplane" / "kernel" / "drifter.py", "X = 1")
    out = _lint(tree)
    assert f"{_name('The kernel has floors')} BROKEN" in out, out[-3000:]
    assert "drifter" in out
