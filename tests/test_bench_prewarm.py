"""``python -m bench prewarm`` runs end to end and prints a well-formed headline.

A tiny run on real simulator processes; figures are checked for shape and sanity only:
whether the goals are met is for the bench to report, never for a test on a noisy
machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def test_tiny_run_prints_one_headline_with_sane_figures() -> None:
    args = [
        "--replicas",
        "2",
        "--prefixes",
        "12",
        "--prefix-tokens",
        "160",
        "--per-replica",
        "1,2",
        "--rounds",
        "1",
        "--sample",
        "4",
        "--quiet",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "bench", "prewarm", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["bench"] == "prewarm" and head["prefixes"] == 12
    assert 0 <= head["attainment"] <= 1
    assert set(head["sweep"]) == {"1", "2"}
    assert all(0 <= run["attainment"] <= 1 for run in head["sweep"].values())
    assert all(0 <= a <= 1 for a in head["budget_cut"]["attainment"])
    assert head["hit_rate_warm"] > head["hit_rate_cold"]
    assert head["ttft_p50_warm_s"] > 0 and head["ttft_p50_cold_s"] > 0
    assert (
        set(head["goals"])
        == set(head["met"])
        == {"attainment", "sent_after_deadline", "ttft_ratio", "hit_rate_warm"}
    )
    assert all(isinstance(v, bool) for v in head["met"].values())
    # sealed payloads (docs/residency.md), opened inside the timed run, warm all the same
    sealed = head["sealed"]
    assert sealed["attainment"] == head["sweep"]["2"]["attainment"] == 1
    assert sealed["seal_us_per_payload"] > 0 and sealed["open_us_per_payload"] > 0
    assert sealed["bytes_sealed"] > sealed["bytes_clear"] and sealed["warm_s_ratio"] > 0
