"""``python -m bench etcd_rtt`` runs end to end with tiny counts and prints a
well-formed headline; its argument checks refuse bad round-trip times. Shape and
causality only (a delayed link cannot make the switch faster): no timing goal on a
shared machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main
from chaos.lab.local_etcd import etcd_available

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.etcd
def test_tiny_etcd_rtt_bench_prints_a_sane_headline() -> None:
    if not etcd_available():
        pytest.fail("the etcd binary is not installed: run scripts/setup.sh")
    args = ("--rtts", "0,100", "--switches", "3", "--pins", "3", "--keepalives", "2")
    args += ("--lab-flags-rtt", "off", "--no-control-plane", "--quiet")
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "etcd_rtt", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # --quiet: only the headline
    head = json.loads(lines[0])
    assert head["bench"] == "etcd_rtt" and head["members"] == 3
    for key in ("switch_ms_p99_rtt0", "switch_ms_p99_rtt100", "pin_ms_p99_rtt100"):
        assert isinstance(head[key], float) and head[key] > 0, key
    # 100 ms more on every link: the commit cannot get cheaper (a causal check)
    assert head["switch_ms_p99_rtt100"] >= head["switch_ms_p99_rtt0"]
    figures = head["figures"]
    assert figures["lease_survived_rtt0"] in (True, False)
    assert figures["failover_detect_s_rtt100"] is None  # --no-control-plane


@pytest.mark.parametrize("rtts", ["-30", "0,-1", "abc", "5000", ""])
def test_bad_round_trip_times_are_an_argparse_error(
    rtts: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main(["etcd_rtt", "--rtts", rtts])
    assert exc.value.code == 2
    assert "--rtts" in capsys.readouterr().err
