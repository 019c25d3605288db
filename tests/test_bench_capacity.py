"""``python -m bench capacity``: its truth agrees with queueing theory, and the bench runs
end to end and prints a well-formed headline.

The truth (``bench/capacity_truth.py``) is checked where theory is exact: M/M/1 and
M/M/c (Erlang C) waiting-time percentiles, M/D/1's mean wait (Pollaczek-Khinchine),
the rate where the M/M/1 p99 meets a limit. The end-to-end run is small (half-second
steps, a coarse bracket, a short model run and truth check) on a real simulator;
its figures are checked for shape and sanity only: whether the goals are met is for
the bench to report, never for a test on a noisy machine.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.capacity_truth import EngineModel, SteadyState, services, truth
from chaos.capacity.workload import Workload
from controlplane.kernel.capacity.record import WorkloadProfile

REPO = Path(__file__).resolve().parent.parent
RUN = 1_000_000  # requests per model run in the theory checks (about 0.3 s each): their
# p99 then repeats within +-3 % over seeds at these loads (within +-7 % at rho 0.85)


def _exponential_mix(mean_s: float, n: int = RUN, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).exponential(mean_s, n)


def erlang_c(c: int, offered: float) -> float:
    """The probability that an arrival waits in M/M/c with ``offered`` = lambda / mu."""
    rho = offered / c
    terms = sum(offered**k / math.factorial(k) for k in range(c))
    top = offered**c / math.factorial(c) / (1 - rho)
    return top / (terms + top)


@pytest.mark.parametrize("rho", [0.5, 0.7])
def test_mm1_waiting_p99_is_theory(rho: float) -> None:
    """M/M/1 FIFO: P(W > t) = rho exp(-(mu - lambda) t), so the p99 of the wait (the
    first token when prefill is nil) is ln(100 rho) / (mu - lambda)."""
    mu = 1.0
    service = _exponential_mix(1 / mu)
    model = SteadyState(np.zeros_like(service), service, 1, requests=RUN, seed=3)
    lam = rho * mu
    assert model.p99(lam) == pytest.approx(math.log(100 * rho) / (mu - lam), rel=0.05)


@pytest.mark.parametrize(("c", "rho"), [(4, 0.7), (12, 0.8)])
def test_mmc_waiting_p99_is_erlang_c(c: int, rho: float) -> None:
    """M/M/c FIFO: P(W > t) = C(c, a) exp(-(c mu - lambda) t) (C: Erlang C), so the p99
    wait is ln(100 C) / (c mu - lambda) where C > 0.01."""
    mu = 2.0
    service = _exponential_mix(1 / mu)
    model = SteadyState(np.zeros_like(service), service, c, requests=RUN, seed=4)
    lam = rho * c * mu
    wait = erlang_c(c, lam / mu)
    assert model.saturation_rps == pytest.approx(c * mu, rel=0.01)
    assert model.p99(lam) == pytest.approx(math.log(100 * wait) / (c * mu - lam), rel=0.05)


def test_md1_mean_wait_is_pollaczek_khinchine() -> None:
    """M/D/1: mean wait rho D / (2 (1 - rho)); the prefill adds to the first token
    whatever the wait."""
    d, rho, prefill = 0.5, 0.8, 0.1
    model = SteadyState([prefill], [d], 1, requests=RUN, seed=5)
    ttft = model.ttft(rho / d)[model.warmup :]
    assert float(ttft.mean()) == pytest.approx(prefill + rho * d / (2 * (1 - rho)), rel=0.04)
    # far below saturation with c slots and a deterministic service nobody waits
    spread = SteadyState([prefill], [d], 8, requests=20_000, seed=5)
    assert spread.p99(0.2 * 8 / d) <= prefill + 0.3 * d


def test_the_rate_where_the_p99_meets_a_limit_is_theory() -> None:
    """The bisection on common random numbers finds M/M/1's rate where
    ln(100 lambda / mu) / (mu - lambda) = the limit (the p99 is monotone in the rate)."""
    mu, limit = 1.0, 15.0
    service = _exponential_mix(1 / mu, 200_000)
    model = SteadyState(np.zeros_like(service), service, 1, requests=200_000, seed=6)
    lo, hi = 0.02, 0.999
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.log(100 * mid) / (mu - mid) <= limit else (lo, mid)
    found = model.rate_where(limit)
    assert found is not None and found == pytest.approx(lo, rel=0.02)
    rates = [0.3, 0.5, 0.6, 0.7, 0.8, 0.9]
    p99s = [model.p99(r) for r in rates]
    assert p99s == sorted(p99s)


def test_truth_of_a_workload_is_ordered() -> None:
    """A real workload's truth: knee and ultimate below saturation, allowed = ultimate /
    the factor of safety, the warm mix (hits) bearing more than the cold one."""
    engine = EngineModel(slots=4, prefill_rate=6_000, decode_rate=150, block_size=16)
    profile = WorkloadProfile(
        prompt_tokens_p50=1_000, prompt_tokens_p90=2_000, output_tokens=32, shared_prefix_share=0.8
    )
    workload = Workload(profile, prefix_tokens=750, prefixes=8)
    found = {}
    for warm in (False, True):
        pool = services(engine, workload, 256, warm=warm, seed=1, tag="t")
        found[warm], _ = truth(
            pool,
            4,
            slo_s=2.0,
            knee_factor=2.0,
            lowest_rps=1.0,
            factor_of_safety=2.0,
            requests=50_000,
            seed=1,
        )
    cold, warm = found[False], found[True]
    for t in (cold, warm):
        assert t.knee_rps is not None and 1.0 < t.knee_rps <= t.ultimate_rps
        assert 0.5 * t.saturation_rps < t.ultimate_rps < t.saturation_rps
        assert t.allowed_rps == pytest.approx(t.ultimate_rps / 2)
    assert cold.hit_rate == 0 and warm.hit_rate > 0.3
    assert warm.ultimate_rps > 1.1 * cold.ultimate_rps


SMALL = [
    "--configs", "custom",
    "--step-s", "0.5", "--slots", "4", "--prefill-rate", "1000", "--decode-rate", "100",
    "--prompt-p50", "200", "--prompt-p90", "200", "--output-tokens", "4",
    "--prefix-tokens", "150", "--prefixes", "2", "--slo-s", "0.6", "--start-rps", "6",
    "--precision", "0.3", "--recover-s", "1.5", "--recover-window-s", "0.4",
    "--truth-requests", "50000", "--min-requests", "30", "--max-warmup-s", "1.5",
    "--max-measure-s", "2", "--check-s", "4", "--check-warmup-s", "1",
]  # fmt: skip


@pytest.mark.slow
def test_small_run_prints_one_headline_with_sane_figures() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "capacity", *SMALL, "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    head = json.loads(lines[0])
    assert head["bench"] == "capacity"
    for key in ("knee_error", "ultimate_error", "allowed_error", "beta_error", "probe_s"):
        assert isinstance(head[key], int | float) and math.isfinite(head[key]), key
    assert isinstance(head["overstatement"], int | float)
    assert head["t_recover_s"] is None or head["t_recover_s"] >= 0
    assert set(head["configs"]) == {"custom"}
    config = head["configs"]["custom"]
    assert set(config["probes"]) == {"cold", "warm"}
    truth_ = config["truth"]
    overs, ultimate_errors = [], []
    for kind in ("cold", "warm"):
        p, t = config["probes"][kind], truth_[kind]
        # the truth from the steady-state model: positive, the ultimate under saturation
        assert 0 < t["ultimate_rps"] < t["saturation_rps"] and t["knee_rps"] > 0
        assert head["saturation_true_rps"]["custom"][kind] == t["saturation_rps"]
        assert t["allowed_rps"] == pytest.approx(t["ultimate_rps"] / 2, abs=2e-3)
        assert p["ultimate_rps"] > 0 and p["steps"] >= 2  # the lowest and a sustained one at least
        # errors as stated, from the numbers in the headline
        signed = []
        for what in ("knee", "ultimate", "allowed"):
            m, x = p[f"{what}_rps"], t[f"{what}_rps"]
            assert p[f"{what}_error"] == pytest.approx(abs(m - x) / x, abs=2e-3), what
            signed.append((m - x) / x)
        assert p["overstatement"] == pytest.approx(max(signed), abs=2e-3)
        overs.append(p["overstatement"])
        ultimate_errors.append(p["ultimate_error"])
    assert head["ultimate_error"] == max(ultimate_errors)
    assert head["overstatement"] == max(overs)
    cold, warm = config["probes"]["cold"], config["probes"]["warm"]
    # the hit rate is the replica's, and agrees with the model's count of hits
    assert cold["hit_rate"] < 0.02 and warm["hit_rate"] == pytest.approx(
        warm["hit_rate_model"], abs=0.05
    )
    assert 0 < truth_["beta"] < 1 and config["beta_error"] == pytest.approx(
        abs(config["beta"] - truth_["beta"]), abs=1e-3
    )
    assert head["beta_error"] == config["beta_error"]
    check = config["truth_check"]
    assert check["rate_rps"] == truth_["cold"]["ultimate_rps"] and check["slo_s"] == 0.6
    assert check["p99_ttft_s"] > 0 and check["p99_model_same_run_s"] > 0
    assert 0 <= check["served_ratio"] <= 1 and isinstance(check["ok"], bool)
    assert head["truth_check_ok"] is check["ok"]
    assert head["probe_s"] == config["probe_s"] > 0 and config["settings"]["step_s"] == 0.5
    goals = {
        "knee_error",
        "ultimate_error",
        "allowed_error",
        "max_overstatement",
        "beta_error",
    }
    assert set(head["goals"]) == set(head["met"]) == goals
    assert all(isinstance(v, bool) for v in head["met"].values())
