"""The README's main command works: the demo runs its blackout story end to end, with
chat sessions through the gateways that stay sticky: the failed region's sessions move
once and stay, nothing else moves, nothing bounces back when it recovers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.etcd]


def test_demo_fails_over_survives_a_leader_kill_and_recovers_with_sticky_sessions() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "chaos.demo", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["passed"] is True
    assert result["transitions"] == [
        "NORMAL->FAILING_OVER",
        "FAILING_OVER->RECOVERED",
        "RECOVERED->NORMAL",
    ]
    assert result["detect_s"] > 0 and result["leader_takeover_s"] > 0
    assert "BLACKOUT us-east" in out.stdout and "took over" in out.stdout
    # The failover pre-warmed the targets with us-east's top prefixes, all within budget.
    pre = result["prewarm"]
    assert pre["prefixes_total"] >= 1 and pre["attained_fraction"] == 1.0
    assert "PRE-WARM:" in out.stdout

    # Traffic ran through the gateways the whole time, and sessions stayed sticky.
    assert result["requests_ok"] > 0 and "sessions by serving region" in out.stdout
    assert result["sessions_moved"] > 0
    assert result["moved_by_home"] == {"us-east": result["sessions_moved"]}
    assert result["moved_outside_victim"] == 0
    assert result["sessions_moved"] == result["victim_sessions"]  # every us-east session
    assert set(result["moved_to"]) <= {"us-west", "us-central"}
    assert result["bounces"] == 0, result["bounced_sessions"]
    assert result["violations"] == 0
    assert result["gateway_consistency_violations"] == 0
    # Whatever failed, failed for sessions of the region that went down.
    assert set(result["failed_by_home"]) <= {"us-east"}, result["failure_reasons"]
