"""Tectonic's version, from one source: ``[project] version`` in pyproject.toml.

Read at run time from the installed distribution's metadata (``pip install`` and
``pip install -e .`` both write it), never copied into code, so a release changes one
line. From a source tree that was never installed there is no metadata and nothing else
is read: the version is ``0+unknown`` (a PEP 440 local version that sorts below every
release), which says plainly that nobody knows what this build is.

Every command a user runs takes ``--version`` (:func:`add_version_flag`), and every
component's Prometheus ``/metrics`` carries ``tectonic_build_info`` (:func:`build_info`).
The Helm chart's ``appVersion`` is kept equal to it by tests/unit/test_version.py.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Gauge

DISTRIBUTION = "tectonic"  # pyproject.toml's [project] name
UNKNOWN = "0+unknown"
BUILD_INFO = "tectonic_build_info"


def installed_version(distribution: str = DISTRIBUTION) -> str:
    """The installed ``distribution``'s version, or :data:`UNKNOWN` if it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return UNKNOWN


VERSION: str = installed_version()
PYTHON: str = platform.python_version()


def version_text(prog: str) -> str:
    """What ``--version`` prints: ``tectonic-agent 0.1.0``."""
    return f"{prog} {VERSION}"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``<prog> <version>`` and exit 0 (argparse fills in the prog)."""
    parser.add_argument(
        "--version",
        action="version",
        version=version_text("%(prog)s"),
        help="print the Tectonic version and exit",
    )


def build_info(
    registry: CollectorRegistry, component: str, extra: Mapping[str, str] | None = None
) -> Gauge:
    """``tectonic_build_info{version, component, python, **extra} 1`` on ``registry``: the
    Prometheus convention for a build's identity (a constant 1; the labels are the data),
    so ``count by (version) (tectonic_build_info)`` shows a rolling upgrade's progress."""
    # Imported here, not at the top: the command lines import this module for --version
    # and should not pay for prometheus_client.
    from prometheus_client import Gauge

    labels = {"version": VERSION, "component": component, "python": PYTHON, **(extra or {})}
    gauge = Gauge(
        BUILD_INFO,
        "The Tectonic build this process runs: always 1; the labels say which",
        list(labels),
        registry=registry,
    )
    gauge.labels(**labels).set(1)
    return gauge
