"""``python -m bench placement`` runs end to end and prints a well-formed headline.

A short run (few prompts, short prefixes, a short warm-up) of the three front ends on
a real etcd, two simulators, a gateway and vllm-router, loaded by ``vllm bench
serve``; the figures are checked for shape and sanity only: whether the goals are met
is for the bench to report, never for a test on a noisy machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.placement import VLLM_BENCH, router_binary
from chaos.lab.local_etcd import etcd_available
from chaos.lab.vllm_cpu import SETUP_HINT

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("tectonic", "round_robin", "peer")


def _needs(ok: bool, what: str) -> None:
    """Skip without ``what`` locally; CI installs all of it, so there it fails."""
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the placement bench test: {what}")
    pytest.skip(what)


def test_short_run_prints_one_headline_with_sane_figures() -> None:
    _needs(etcd_available(), "etcd binary not installed (scripts/setup.sh installs etcd-server)")
    _needs(
        router_binary() is not None,
        "vllm-router is not installed (a dev dependency: pip install -e '.[dev]')",
    )
    _needs(VLLM_BENCH.exists(), f"no vllm bench client in .venv-vllm: {SETUP_HINT}")
    args = [
        "--prompts",
        "64",
        "--rounds",
        "1",
        "--prefixes",
        "4",
        "--prefix-tokens",
        "256",
        "--warmup-s",
        "2",
        "--quiet",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "bench", "placement", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["bench"] == "placement"
    for system in SYSTEMS:
        assert 0 < head[f"p50_ms_{system}"] <= head[f"p99_ms_{system}"] < 10_000
        assert head[f"rps_{system}"] > 0
        # four prefixes shared by 16 prompts each: every front end hits some
        assert 0 < head[f"hit_rate_{system}"] < 1
        assert head[f"failed_{system}"] == 0
    for name in ("p99_ms_tectonic", "hit_rate_tectonic", "rps_tectonic"):
        assert isinstance(head["met"][name], bool)
    assert set(head["goals"]) == set(head["met"])
    # one round of the three (the medians over rounds and the count of rounds each goal
    # held: tests/unit/test_placement_rounds.py)
    assert set(head["met_in_rounds"]) == set(head["met"])
    assert all(0 <= n <= 1 for n in head["met_in_rounds"].values())
    assert head["settings"]["prompts"] == 64 and head["settings"]["rounds"] == 1
    assert head["settings"]["concurrency"] == 16
