"""``python -m bench cost``: a quick run prints one well-formed headline with sane
figures (never whether a goal is met: that is for the bench to report)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KEYS = ("max_spend_over_budget", "interactive_attainment", "batch_shed_share")


# ~4.6 s alone on 2 cores, over 5 s beside the other quick tests on two workers
@pytest.mark.slow
def test_quick_run_prints_one_headline_with_sane_figures() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "cost", "--quick", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["bench"] == "cost"
    for key in KEYS:
        assert isinstance(head[key], int | float) and math.isfinite(head[key]), key
    assert head["max_spend_over_budget"] > 0
    assert 0 <= head["interactive_attainment"] <= 1
    assert 0 <= head["batch_shed_share"] <= 1
    assert set(head["met"]) == {"max_spend_over_budget", "interactive_attainment"}
    assert set(head["goals"]) == set(head["met"])
    with_budget, without = head["budget"], head["no_budget"]
    assert with_budget["requests"] == without["requests"] > 0
    assert with_budget["interactive"] + with_budget["batch"] == with_budget["requests"]
    # the budget binds at the peak: the ladder sheds batch there, and without a budget
    # nothing is shed and the pool grows past what the budget pays for
    assert with_budget["short_s"] > 0 and with_budget["shed_batch_applied_at_s"] is not None
    assert without["batch_shed_share"] == 0
    assert without["max_spend_per_hour"] > head["budget_per_hour"]
    assert without["peak_active"] > with_budget["peak_active"]
    settings = head["settings"]
    assert settings["oracle_peak_active"] > 0 and settings["budget_per_hour"] > 0
    assert "ladder" in settings and "shedding" in settings
