"""``python -m bench capacity`` runs end to end and prints a well-formed headline.

A small run (one-second steps, a coarse bracket) on a real simulator; figures are
checked for shape and sanity only: whether the goals are met is for the bench to
report, never for a test on a noisy machine.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
SMALL = [
    "--step-s", "0.5", "--slots", "4", "--prefill-rate", "1000", "--decode-rate", "100",
    "--prompt-p50", "200", "--prompt-p90", "200", "--output-tokens", "4",
    "--prefix-tokens", "150", "--prefixes", "2", "--slo-s", "0.6", "--start-rps", "6",
    "--precision", "0.3", "--recover-s", "1.5", "--recover-window-s", "0.4",
]  # fmt: skip


def test_small_run_prints_one_headline_with_sane_figures() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "capacity", *SMALL, "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["bench"] == "capacity"
    for key in ("knee_error", "ultimate_error", "beta_error", "probe_s"):
        assert isinstance(head[key], int | float) and math.isfinite(head[key]), key
    assert head["t_recover_s"] is None or head["t_recover_s"] >= 0
    assert set(head["probes"]) == {"cold", "warm"}
    cold, warm = head["probes"]["cold"], head["probes"]["warm"]
    # the truth from the model, the measurement from the probe, both positive
    for p in (cold, warm):
        assert p["ultimate_true_rps"] > 0 and p["ultimate_rps"] > 0 and p["steps"] >= 3
        assert p["ultimate_error"] == pytest.approx(
            abs(p["ultimate_rps"] - p["ultimate_true_rps"]) / p["ultimate_true_rps"], abs=1e-3
        )
    assert head["ultimate_error"] == max(cold["ultimate_error"], warm["ultimate_error"])
    # the hit rate is the replica's, and agrees with the model's count of hits
    assert cold["hit_rate"] < 0.02 and warm["hit_rate"] == pytest.approx(
        warm["hit_rate_model"], abs=0.05
    )
    assert 0 < head["beta_true"] < 1 and head["beta_error"] == pytest.approx(
        abs(head["beta"] - head["beta_true"]), abs=1e-3
    )
    assert head["probe_s"] > 0 and head["settings"]["step_s"] == 0.5
    assert set(head["goals"]) == set(head["met"]) == {"knee_error", "ultimate_error", "beta_error"}
    assert all(isinstance(v, bool) for v in head["met"].values())
