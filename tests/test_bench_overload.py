"""``python -m bench overload`` runs end to end and prints a well-formed headline.

A short run (3 s of offered load per phase) on a real etcd, simulators and gateways;
the figures are checked for shape and sanity only: whether the goals are met is for the
bench to report, never for a test on a noisy machine.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.lab.local_etcd import etcd_available

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
REPO = Path(__file__).resolve().parent.parent
HEADLINE = (
    "goodput_ratio",
    "admitted_p99_over_slo",
    "goodput_ratio_without",
    "interactive_refused_share",
    "batch_refused_share",
)


def test_a_short_run_prints_one_headline_with_sane_figures() -> None:
    if not etcd_available():
        if os.environ.get("CI"):  # scripts/setup.sh installs etcd: never skipped there
            pytest.fail("CI must run the overload bench test: etcd is not installed")
        pytest.skip("etcd binary not installed (scripts/setup.sh installs etcd-server)")
    out = subprocess.run(
        [sys.executable, "-m", "bench", "overload", "--duration", "3", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["bench"] == "overload" and head["duration_s"] == 3
    for key in HEADLINE:
        assert isinstance(head[key], int | float) and math.isfinite(head[key]), key
        assert head[key] >= 0, key
    for key in ("interactive_refused_share", "batch_refused_share"):
        assert head[key] <= 1, key
    model = head["model"]
    # the ultimate load is within what the replicas run at all; offered twice the allowed
    assert 0 < model["ultimate_rps"] <= model["throughput_rps"]
    assert head["offered_rps"] == pytest.approx(2 * model["allowed_rps"], rel=0.01)

    with_, without = head["phases"]
    assert (with_["phase"], without["phase"]) == ("admission", "none")
    for phase in (with_, without):
        assert phase["sent"] > 0 and phase["other_statuses"] == []
        assert phase["within_slo"] <= phase["admitted"] <= phase["sent"]
    assert without["refused"] == {"interactive": 0, "batch": 0}  # nothing refuses there
    # every 429 says when to retry; the gateway counted what it admitted and refused
    assert with_["refusals_with_retry_after"] == with_["refused_count"]
    gateway = with_["gateway"]
    assert set(gateway["admitted"]) == set(gateway["refused"]) == {"interactive", "batch"}
    assert sum(gateway["admitted"].values()) >= with_["admitted"]  # and the warm-up's
    assert sum(gateway["refused"].values()) == with_["refused_count"]
    assert len(gateway["limits"]) == 2 and all(v >= 1 for v in gateway["limits"].values())
    assert set(head["goals"]) == set(head["met"])
    assert all(isinstance(v, bool) for v in head["met"].values())
    # what the phases say of the machine: the generator's lag, the replicas' pace and
    # the gateway's CPU, and a verdict that names its reasons
    for phase in (with_, without):
        machine = phase["machine"]
        for lag in ("send_lag", "loop_lag"):
            assert 0 <= machine[lag]["p99_s"] <= machine[lag]["max_s"]
        assert machine["replicas_rps"] > 0 and machine["replicas_pace"] > 0
        assert 0 <= machine["all_slots_busy_share"] <= 1
        assert 0 < machine["gateway_cpu_share"] <= (os.cpu_count() or 1)
        assert isinstance(machine["not_valid_because"], list)
    assert head["valid"] is not any(head["not_valid_because"].values())
