"""Drill records with non-finite numbers: a first-token p99 in the histogram's +Inf
bucket is inf, and a drill's samples and figures carry it into ``result.json``, which
the history, ``failoverctl drill show`` and the reports read back. A scenario, bound to
its region through JSON, refuses an infinite tolerance instead of carrying one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from chaos.drills.result import DrillResult, Sample
from chaos.drills.scenario import SCENARIO_DIR, load_scenario
from controlplane.kernel.config import ConfigError


def test_a_result_with_infinite_and_nan_figures_reads_back() -> None:
    result = DrillResult(
        id="d1",
        scenario="region-blackout",
        title="t",
        region="us-east",
        started_at=1.0,
        ended_at=2.0,
        passed=False,
        samples=(Sample(t=1.5, first_token_p99_s=math.inf, error_rate=math.nan),),
        figures={"first_token_p99_s": math.inf, "rto_s": 3.5},
    )
    text = result.model_dump_json()
    assert json.loads(text)["figures"]["first_token_p99_s"] == "Infinity"  # valid JSON
    back = DrillResult.model_validate_json(text)
    assert back.figures == {"first_token_p99_s": math.inf, "rto_s": 3.5}
    sample = back.samples[0]
    # inf is "slower than the largest bucket", not "nothing measured" (None)
    assert sample.first_token_p99_s == math.inf
    assert sample.error_rate is not None and math.isnan(sample.error_rate)


def test_a_scenario_refuses_an_infinite_tolerance(tmp_path: Path) -> None:
    data = yaml.safe_load((SCENARIO_DIR / "auth-503-storm.yaml").read_text())
    probes = data["steady_state"]["probes"]
    assert probes[-1]["probe"] == "error_rate"
    probes[-1]["max"] = math.inf
    path = tmp_path / "inf.yaml"
    path.write_text(yaml.safe_dump(data))  # written as .inf
    assert ".inf" in path.read_text()
    finite = r"steady_state\.probes\[3\]\.max: Input should be a finite number"
    with pytest.raises(ConfigError, match=finite):
        load_scenario(path)
    probes[-1]["max"] = 0.01
    path.write_text(yaml.safe_dump(data))
    assert load_scenario(path).bind("eu-west").region == "eu-west"
