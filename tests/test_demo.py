"""The README's main command works: the demo runs its blackout story end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.etcd]


def test_demo_fails_over_survives_a_leader_kill_and_recovers() -> None:
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
