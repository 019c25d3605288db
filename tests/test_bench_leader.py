"""``python -m bench leader`` runs end to end: the leader is SIGKILLed at each of the
four points of a failover and a new leader finishes it. What must hold whatever the
machine's load: every phase ran, the new leader acted, no completed step was done
twice. Whether ``resume_over_ttl`` meets its goal is for the bench to report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
REPO = Path(__file__).resolve().parent.parent


def test_leader_killed_at_each_step_and_no_step_repeated() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "leader"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.strip().splitlines()]
    rounds, head = lines[:-1], lines[-1]
    assert head["bench"] == "leader" and head["lease_ttl_s"] == 3
    assert head["phases"] == ["before_prewarm", "during_prewarm", "after_switch", "during_recovery"]
    assert head["repeated_steps"] == 0
    for r in rounds:
        assert r["killed"] != r["new_leader"]  # the other replica took over ...
        assert 0 < r["leader_resume_s"] <= r["next_step_s"]  # ... and moved the failover on
    assert head["resume_over_ttl"] == pytest.approx(head["leader_resume_s"] / 5, abs=1e-3)
