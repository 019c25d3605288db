"""``python -m bench cost``: a quick run prints one well-formed headline with sane
figures for the ramp and the failover (never whether a goal is met, nor a timing: that
is for the bench to report)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
KEYS = ("max_spend_over_budget", "interactive_attainment", "batch_shed_share")
# the failover scenario's: shares in [0, 1]; back_within_budget_s may be None (still over
# at the end of the run)
SHARES = (
    "failover_interactive_attainment",
    "failover_batch_shed_share",
    "after_allowance_interactive_attainment",
    "after_allowance_batch_shed_share",
)
PHASES = ("before", "allowance", "after")


# ~6.5 s alone on 2 cores (the failover adds ~2 s), more beside the other quick tests
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
    assert set(head["met"]) == {
        "max_spend_over_budget",
        "interactive_attainment",
        "after_allowance_interactive_attainment",
    }
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
    assert "failover" in settings
    _failover_keys(head)


def _failover_keys(head: dict[str, Any]) -> None:
    """The failover's headline keys, and its run: the allowance's window and phases."""
    for key in SHARES:
        value = head[key]
        assert isinstance(value, int | float) and 0 <= value <= 1, key
    assert isinstance(head["allowance_s"], int | float) and head["allowance_s"] > 0
    inside = head["max_spend_over_budget_in_allowance"]
    assert isinstance(inside, int | float) and inside > 0
    back = head["back_within_budget_s"]
    assert back is None or (isinstance(back, int | float) and back >= 0)
    fo = head["failover"]
    assert isinstance(fo, dict)
    lead, lapse = fo["allowance_window_s"]
    assert lapse - lead == head["allowance_s"]
    assert set(fo["phases"]) == set(PHASES)
    total = sum(fo["phases"][p]["requests"] for p in PHASES)
    assert total == fo["requests"] + fo["phases"]["before"]["requests"] > 0
    # the leader's budget was exempt within the window, less its wind-down, and said
    # when it lapsed
    assert fo["exempt_from_s"] == lead and fo["lapsed_at_s"] == lapse - fo["wind_down_s"]
    assert head["max_spend_over_budget_by_scenario"]["failover"] == fo["max_spend_over_budget"]
