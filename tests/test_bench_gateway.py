"""``python -m bench gateway`` runs end to end and prints a well-formed headline.

A small run on real processes; figures are checked for shape and sanity only: whether
the goals are met is for the bench to report, never for a test on a noisy machine.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
def test_small_run_prints_one_headline_with_sane_figures(client: str) -> None:
    small = ["--requests", "200", "--throughput-requests", "300", "--blocks", "2"]
    out = subprocess.run(
        [sys.executable, "-m", "bench", "gateway", *small, "--client", client, "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["bench"] == "gateway" and head["client"] == client
    assert head["requests_per_side"] == {"latency": 400, "throughput": 600}
    for key in ("added_latency_ms_p50", "added_latency_ms_p99", "throughput_ratio"):
        assert isinstance(head[key], int | float) and math.isfinite(head[key]), key
    assert head["throughput_ratio"] > 0
    cpu = head["cpu_ms_per_request"]
    assert set(cpu) == {"direct", "gateway"}
    assert set(cpu["direct"]) == set(cpu["gateway"]) == {"gateway", "load_generator", "simulator"}
    # each process that worked for a side used CPU for it; the gateway is idle direct
    assert cpu["gateway"]["gateway"] > cpu["direct"]["gateway"] >= 0
    # /proc counts CPU in clock ticks (10 ms): in a run this small one side's share of a
    # lean process can read 0 (CI saw it), so each process is judged over both sides
    for proc in ("simulator", "load_generator"):
        assert all(cpu[side][proc] >= 0 for side in cpu) and sum(c[proc] for c in cpu.values()) > 0
    assert set(head["goals"]) == set(head["met"])
    assert all(isinstance(v, bool) for v in head["met"].values())
