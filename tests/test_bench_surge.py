"""``python -m bench surge`` runs end to end with tiny settings and prints a well-formed
headline: two labs of simulator warm pools (scaling on, scaling off), a failover of a
loaded region into one target and its recovery, first-token p99s before and after.
Shape and sanity only: whether scaling beats no scaling, or the goal is met, is for the
bench to report at its defaults, never for a test on a shared machine."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.lab.local_etcd import etcd_available

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
REPO = Path(__file__).resolve().parent.parent
ARGS = (
    *("--settle-s", "2", "--settle-limit-s", "1", "--before-s", "5", "--after-s", "6"),
    *("--scale-back-limit-s", "1", "--rate", "2", "--quiet"),
)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_tiny_surge_bench_prints_a_sane_headline() -> None:
    if not etcd_available():
        pytest.fail("the etcd binary is not installed: run scripts/setup.sh")
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "surge", *ARGS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # --quiet: only the headline
    head = json.loads(lines[0])
    assert head["bench"] == "surge"
    for key in ("p99_ratio_with", "p99_ratio_without"):
        assert _positive(head[key]), key
    for run in ("with_scaling", "without_scaling"):
        figures = head[run]
        assert _positive(figures["ttft_p99_before_s"]) and _positive(figures["ttft_p99_after_s"])
        assert figures["requests_before"] > 0 and figures["requests_after"] > 0
        assert figures["target_active_before"] >= 1
        assert figures["replica_counts"] and all(len(r) == 4 for r in figures["replica_counts"])
    assert head["with_scaling"]["scaling"] is True
    assert head["without_scaling"]["scaling"] is False
    assert head["without_scaling"]["scaled_back_s"] is None  # only measured with scaling
    back = head["scaled_back_s"]
    assert back is None or (isinstance(back, int | float) and back >= 0)
    assert set(head["goals"]) == set(head["met"]) == {"p99_ratio_with"}
    assert isinstance(head["met"]["p99_ratio_with"], bool)
    assert "compressed" in head
