"""The installed package carries every Python package of the tree: pyproject lists its
packages by hand, and a missing one builds a wheel that does not import (it happened:
``controlplane.kernel`` was missing, and only a Docker build would have shown it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("controlplane", "regions", "chaos", "bench")


def test_every_package_of_the_tree_is_in_the_wheel() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for root in ROOTS
        for init in (REPO / root).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages"
