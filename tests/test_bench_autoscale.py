"""``python -m bench autoscale``: its model serves a fixed pool as the capacity bench's
FIFO model does, its HPA limits a scale-up as Kubernetes' defaults say, and a quick run
prints a well-formed headline with sane figures (never whether a goal is met: that is
for the bench to report)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.autoscale_policies import Hpa, HpaBehavior
from bench.autoscale_sim import ACTIVE, EngineSpec, Lifecycle, Sim, requests_at
from bench.capacity_truth import Service, simulate
from regions.simulator import service_model

REPO = Path(__file__).resolve().parent.parent
POLICIES = {"hpa_cpu", "keda_queue", "dynamo", "tectonic_reactive", "tectonic", "oracle"}
FIGURES = ("p99_over_steady", "slo_attainment", "replica_s", "cost_over_oracle")


def test_hit_tokens_are_whole_blocks_and_never_the_last_token() -> None:
    assert service_model.hit_tokens(100, 0.5, 16) == 48
    assert service_model.hit_tokens(33, 1.0, 16) == 32
    assert service_model.hit_tokens(32, 1.0, 16) == 16  # the last token is computed
    assert service_model.hit_tokens(100, 0.0, 16) == 0


def test_one_replica_of_the_model_is_the_capacity_benchs_fifo_engine() -> None:
    """A pool of one ACTIVE replica serves in arrival order on its slots, as
    ``bench.capacity_truth.simulate`` does: the same first tokens and completions."""
    engine = EngineSpec(slots=3)
    rng = np.random.default_rng(4)
    at = np.cumsum(rng.exponential(0.05, 400)).tolist()
    arr = requests_at(at, [0.7] * len(at), engine, seed=4)
    sim = Sim(
        engine, Lifecycle(), arr, start_s=0.0, end_s=math.ceil(at[-1]), launches=[1.0],
        hit_rate=lambda t: 0.7,
    )  # fmt: skip
    sim.place(ACTIVE)
    sim.run([])
    served = [
        Service(p, 0, a, b) for p, a, b in zip(arr.prompt, arr.prefill, arr.decode, strict=True)
    ]
    expected = simulate(at, served, engine.slots)
    first = np.asarray([f for f, _ in expected]) - np.asarray(at)
    assert np.allclose(sim.ttft, first)
    assert np.allclose(sim.done, [d for _, d in expected])


def test_hpa_scale_up_is_at_most_double_or_four_more_per_minute() -> None:
    hpa = Hpa(HpaBehavior(), "queue", 5.0)
    assert hpa._up_limit(0.0, 2) == 6  # +4 beats x2
    assert hpa._up_limit(0.0, 10) == 20  # x2 beats +4
    hpa.changes = [(0.0, 6)]
    assert hpa._up_limit(30.0, 10) == 8  # 4 at the period's start: at most 8
    assert hpa._up_limit(61.0, 10) == 20


@pytest.mark.slow
def test_quick_run_prints_one_headline_with_sane_figures() -> None:
    out = subprocess.run(
        [
            sys.executable, "-m", "bench", "autoscale", "--quick", "--quiet",
            "--dynamo-predictors", "kalman,constant",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["bench"] == "autoscale"
    for key in ("policies", "policies_hit_collapse"):
        policies = head[key]
        assert set(policies) == POLICIES
        for name, figures in policies.items():
            if "skipped" in figures:  # dynamo without its venv: says why
                assert name == "dynamo" and figures["skipped"]
                continue
            for f in FIGURES:
                assert isinstance(figures[f], int | float) and math.isfinite(figures[f]), (name, f)
            assert 0 <= figures["slo_attainment"] <= 1
            assert figures["replica_s"] > 0 and figures["cost_over_oracle"] > 0
            assert figures["p99_over_steady"] > 0
        assert policies["oracle"]["cost_over_oracle"] == 1.0
        # the standby planned for (240 rps) is beyond what the oracle's ACTIVE carry at
        # the start of both scenarios: a policy that cannot see ahead pays for it
        floor = policies["oracle"]["causal_floor_cost_over_oracle"]
        assert floor > 1.0
        # a floor: the Tectonic policies hold that plan, and none pays less
        assert floor <= policies["tectonic"]["cost_over_oracle"]
        assert floor <= policies["tectonic_reactive"]["cost_over_oracle"]
        # the launches charged as drawn, not at their least: never under the floor
        assert policies["oracle"]["causal_floor_drawn_launches"] >= floor
        dynamo = policies["dynamo"]
        assert "skipped" in dynamo or set(dynamo["by_predictor"]) <= {"kalman", "constant"}
    assert isinstance(head["model_error"], float) and 0 <= head["model_error"] < 10
    assert head["model_check"]["served"] > 0.9
    assert set(head["met"]) == {"policies", "policies_hit_collapse", "model_error"}
    settings = head["settings"]
    assert settings["slo_s"] > 0 and settings["time_compression"] == 1.0
    assert settings["launch_s"] == [60.0, 180.0] and settings["wake_s"] > 0
    assert settings["prices"]["WARM"] == 0.6
