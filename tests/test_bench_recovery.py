"""``python -m bench recovery`` runs end to end and prints a well-formed headline.

A tiny run (one round, a compressed ramp, few tenants) on a real etcd, simulators and a
gateway; the figures are checked for shape and sanity only: whether the goal is met is
for the bench to report, never for a test on a noisy machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.lab.local_etcd import etcd_available

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
REPO = Path(__file__).resolve().parent.parent


def test_tiny_run_prints_one_headline_with_sane_figures() -> None:
    if not etcd_available():
        if os.environ.get("CI"):  # scripts/setup.sh installs etcd: never skipped there
            pytest.fail("CI must run the recovery bench test: etcd is not installed")
        pytest.skip("etcd binary not installed (scripts/setup.sh installs etcd-server)")
    args = [
        "--rounds",
        "1",
        "--tenants",
        "6",
        "--prompt-tokens",
        "200",
        "--sessions-per-s",
        "8",
        "--steady-s",
        "2",
        "--failover-s",
        "0.5",
        "--step-percent",
        "25",
        "--step-interval",
        "0.5",
        "--no-warm-first",
        "--quiet",
    ]
    # Without warm first: its recall can warm all six tenants at home before the first
    # request of the one-step recovery lands, and this checks the cold accounting
    # (warm first has tests/integration/test_gateway_warm_first.py).
    out = subprocess.run(
        [sys.executable, "-m", "bench", "recovery", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["bench"] == "recovery" and head["rounds"] == 1
    assert head["window_s"] == 2.0 and head["errors"] == 0
    for name in ("p99_ratio_recovery", "p99_ratio_all_at_once"):
        assert isinstance(head[name], float) and head[name] > 0
    for name in ("p99_ms_steady", "p99_ms_graduated", "p99_ms_all_at_once"):
        [p99] = head[name]
        assert 0 < p99 < 10_000
    # home's caches were reset before each recovery: the first requests of the one-step
    # recovery missed; the graduated one was pre-warmed from home's catalog first (which
    # may hold nothing yet in so short a run), through home's agent
    assert head["cold_all_at_once"][0] > 0 and head["cold_graduated"][0] >= 0
    assert head["recovery_prewarm"] == "catalog" and head["warm_first"] is False
    [tenants] = head["prewarm_tenants"]
    assert isinstance(tenants, int) and 0 <= tenants <= 6
    assert head["cold_graduated_prewarmed"][0] <= head["cold_graduated"][0]
    assert set(head["goals"]) == set(head["met"]) == {"p99_ratio_recovery"}
    assert isinstance(head["met"]["p99_ratio_recovery"], bool)
