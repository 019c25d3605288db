"""``python -m bench soak`` in a short run: sustained streaming load through the
gateways with a region blackout in the middle. Behaviour, not speed: no request is
lost before its first byte (the gateway sends it to another region of the zone and
moves its session there), none is cut (a stream the blackout cuts is continued on
another region), no session is served outside its region, and the figures
are well formed. Memory growth is for the bench to report (36 s is too
short)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
REPO = Path(__file__).resolve().parent.parent


def test_short_soak_loses_nothing_and_keeps_sessions_consistent() -> None:
    # 36 s: the blackout in its middle is what the test is about, not the length
    args = ["--minutes", "0.6", "--sessions", "30", "--down-s", "8", "--quiet"]
    out = subprocess.run(
        [sys.executable, "-m", "bench", "soak", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    head = json.loads(out.stdout.strip().splitlines()[-1])
    assert head["bench"] == "soak" and head["requests"] > 250
    assert head["lost"] == 0, head["lost_reasons"]
    assert head["cut"] == 0  # a stream the blackout cut was continued elsewhere
    assert isinstance(head["continued"], int) and head["continued"] >= 0
    assert head["consistency_violations"] == 0
    assert head["ok"] + head["lost"] + head["cut"] == head["requests"]
    assert head["rss_growth_ratio"] > 0
    # the fault at the run's middle; a loop busy with 30 sessions may wake a little late
    assert head["failover_at_s"] == pytest.approx(18.0, abs=1.0)
