"""The README's main command works: the demo starts a whole deployment, runs the
region-blackout drill under live chat sessions while the live view shows the states
and routing change, and ends with the verdict per criterion and the report's path.
With ``--vllm`` the same runs against real vLLM servers (the CPU build here).

The simulators' demo is judged on its verdicts (RTO and pre-warm windows: 30 s, many
times what a blackout takes) and its output; so scripts/test.sh runs it two at a time
with other outcome-only labs (OUTCOMES_PAIRED there): add nothing that times or judges a
latency.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.etcd]


def run_demo(tmp_path: Path, *extra: str, timeout: float) -> tuple[str, dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-m", "chaos.lab.demo", "--json", "--reports", str(tmp_path), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    return out.stdout, json.loads(out.stdout.strip().splitlines()[-1])


def check_blackout(stdout: str, result: dict[str, object], tmp_path: Path) -> None:
    assert result["passed"] is True and result["scenario"] == "region-blackout"
    rows = result["criteria"]
    transitions = result["transitions"]
    assert isinstance(rows, list) and isinstance(transitions, list)
    criteria = {c["name"]: c for c in rows}
    assert all(c["passed"] for c in criteria.values())
    assert {"prewarm_attainment", "session_consistency", "rto", "state_path"} <= set(criteria)
    path = [t["to_state"] for t in transitions if t["region"] == "us-east"]
    assert path[-3:] == ["FAILING_OVER", "RECOVERED", "NORMAL"]
    figures = result["figures"]
    assert isinstance(figures, dict)
    assert figures["prewarm_attained_fraction"] == 1.0 and figures["requests"] > 100
    # the live view showed the failover as it happened, and the story ends with the report
    assert "FAULT stop every vLLM server of us-east" in stdout
    assert "FAILING_OVER" in stdout and "prefix-cache hit rate" in stdout
    assert "dashboard: http://127.0.0.1:" in stdout  # the control plane's, live meanwhile
    report = Path(str(result["report_path"]))
    assert report.is_file() and report.is_relative_to(tmp_path)
    assert f"report:  {report.resolve()}" in stdout
    assert (tmp_path / "index.html").is_file()


def test_demo_runs_the_blackout_drill_and_prints_verdicts_and_the_report(tmp_path: Path) -> None:
    stdout, result = run_demo(tmp_path, timeout=180)
    check_blackout(stdout, result, tmp_path)


@pytest.mark.realvllm
@pytest.mark.timeout(600)  # three real vLLM servers start (~25 s each) and one restarts
def test_demo_runs_the_same_drill_against_real_vllm_servers(tmp_path: Path) -> None:
    from chaos.lab.vllm_cpu import SETUP_HINT, vllm_available

    if not vllm_available():  # skipped locally, never in CI
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real-vLLM demo; {SETUP_HINT}")
        pytest.skip(SETUP_HINT)
    stdout, result = run_demo(tmp_path, "--vllm", timeout=540)
    check_blackout(stdout, result, tmp_path)
    assert "vLLM servers + an agent each" in stdout
