"""One version, from pyproject.toml, shown everywhere (controlplane/kernel/version.py):
the Helm chart's appVersion agrees with it, every command's ``--version`` prints it, and
every component's /metrics carries it in ``tectonic_build_info``."""

from __future__ import annotations

import argparse
import importlib
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from controlplane.cli.failoverctl import app as failoverctl_app
from controlplane.kernel.version import (
    BUILD_INFO,
    PYTHON,
    UNKNOWN,
    VERSION,
    installed_version,
)
from controlplane.metrics import ControlPlaneMetrics
from regions.agent.cli import parse_args as agent_parse_args
from regions.agent.metrics import AgentMetrics
from regions.dataplane.metrics import DataPlaneMetrics
from regions.gateway.metrics import GatewayMetrics

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
CHARTS = sorted((REPO / "deploy" / "helm").glob("*/Chart.yaml"))


def test_the_distribution_read_is_the_one_pyproject_names() -> None:
    assert PYPROJECT["name"] == "tectonic"


@pytest.mark.parametrize("chart", CHARTS, ids=lambda p: p.parent.name)
def test_the_helm_charts_app_version_is_the_package_version(chart: Path) -> None:
    app_version = str(yaml.safe_load(chart.read_text())["appVersion"])
    assert app_version == PYPROJECT["version"], (
        f"{chart.relative_to(REPO)} appVersion {app_version!r} is not pyproject.toml's "
        f"version {PYPROJECT['version']!r}: change them together"
    )


def test_there_is_a_chart() -> None:
    assert CHARTS, "no deploy/helm/*/Chart.yaml found"


def test_the_version_shown_is_pyprojects() -> None:
    # the tests run installed (scripts/setup.sh: pip install -e .): 0+unknown is a failure
    assert PYPROJECT["version"] == VERSION, (
        f"the installed metadata says {VERSION!r}: pip install -e . (again, after changing "
        "the version)"
    )


def test_without_the_package_installed_the_version_is_unknown() -> None:
    assert installed_version("tectonic-no-such-distribution") == UNKNOWN == "0+unknown"


# ---- --version --------------------------------------------------------------------------


def test_failoverctl_prints_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    # No --server and no credentials needed: the flag is eager.
    with pytest.raises(SystemExit) as e:
        failoverctl_app(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"failoverctl {VERSION}\n"


def test_the_agent_prints_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    # Before its required flags (--region, --control-plane) are asked for.
    with pytest.raises(SystemExit) as e:
        agent_parse_args(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"tectonic-agent {VERSION}\n"


def _parser_of(module: str) -> Callable[[], argparse.ArgumentParser]:
    parser: Callable[[], argparse.ArgumentParser] = importlib.import_module(module)._parser
    return parser


@pytest.mark.parametrize(
    ("module", "prog"),
    [
        ("controlplane.__main__", "python -m controlplane"),
        ("regions.gateway.__main__", "python -m regions.gateway"),
        ("regions.picker.__main__", "tectonic-epp"),
        ("chaos.drills.cli", "python -m chaos"),
        ("bench.__main__", "python -m bench"),
    ],
)
def test_every_other_command_prints_its_version(
    module: str, prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        _parser_of(module)().parse_args(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"{prog} {VERSION}\n"


# ---- tectonic_build_info ----------------------------------------------------------------


def test_the_agents_metrics_text_carries_the_build_info() -> None:
    text = AgentMetrics("eu", ("http://a",)).render().decode()
    assert f"# TYPE {BUILD_INFO} gauge" in text
    found = [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == BUILD_INFO
    ]
    want = {"version": VERSION, "component": "agent", "python": PYTHON, "region": "eu"}
    assert found == [(want, 1.0)]


@pytest.mark.parametrize(
    ("metrics", "component"),
    [
        (lambda: ControlPlaneMetrics(), "controlplane"),
        (lambda: GatewayMetrics(), "gateway"),
        (lambda: DataPlaneMetrics(component="picker"), "picker"),
    ],
)
def test_every_components_registry_carries_the_build_info(
    metrics: Callable[[], ControlPlaneMetrics | DataPlaneMetrics], component: str
) -> None:
    labels = {"version": VERSION, "component": component, "python": PYTHON}
    assert metrics().registry.get_sample_value(BUILD_INFO, labels) == 1
