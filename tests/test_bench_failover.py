"""``python -m bench failover`` runs end to end and prints a well-formed headline.

One failover round and one leader-kill round on real processes. The figures are
checked for shape and sanity only: whether the goals are met is for the bench to
report on a quiet machine, never for a test to assert on a noisy one.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.failover import GOALS
from chaos.lab.local_etcd import etcd_available

pytestmark = [pytest.mark.slow, pytest.mark.etcd]

REPO = Path(__file__).resolve().parent.parent
COMMAND = ["-m", "bench", "failover", "--rounds", "1", "--leader-rounds", "1"]
FIGURES = (
    "detect_s_p50",
    "detect_s_p99",
    "switch_ms_p50",
    "switch_ms_p99",
    "leader_resume_s",
    "resume_over_ttl",
    "probe_interval_s",
)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_one_round_prints_one_headline_with_sane_figures() -> None:
    if not etcd_available():
        pytest.fail("the etcd binary is not installed: run scripts/setup.sh")
    proc = subprocess.run(
        [sys.executable, *COMMAND, "--lease-ttl", "2", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # --quiet: only the headline
    out = json.loads(lines[0])
    assert isinstance(out, dict)

    assert out["bench"] == "failover"
    assert out["rounds"] == 1
    assert out["lease_ttl_s"] == 2
    assert out["failure_threshold"] == 3
    for key in FIGURES:
        assert _positive(out[key]), (key, out[key])
    assert out["detect_s_p50"] <= out["detect_s_p99"]
    assert out["switch_ms_p50"] <= out["switch_ms_p99"]
    assert out["resume_over_ttl"] == pytest.approx(out["leader_resume_s"] / (2 + 2), rel=1e-3)
    assert out["goals"] == {
        "detect_s_p99": GOALS.detect_s_p99,
        "switch_ms_p99": GOALS.switch_ms_p99,
        "resume_over_ttl": GOALS.resume_over_ttl,
    }
    assert set(out["met"]) == set(out["goals"])
    assert all(isinstance(v, bool) for v in out["met"].values())
