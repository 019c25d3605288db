"""The scaling efficiency's arithmetic (chaos/capacity/pair.py, steps.py): the pair's ultimate
per replica over one replica's alone, the pair's plan stopping once its ultimate is
bracketed under the single one's, and every replica of a pair offered the same
arrivals and lengths as one alone, with prompts of its own."""

from __future__ import annotations

import json

import pytest

from chaos.capacity.steps import plan_requests
from chaos.capacity.verdicts import scaling, ultimate_bracketed
from chaos.capacity.workload import Workload, requests
from controlplane.kernel.capacity.bearing import CapacitySLO, ProbePlan, Step, analyze
from controlplane.kernel.capacity.record import WorkloadProfile

SLO = CapacitySLO(ttft_p99_s=1.0)
PLAN = ProbePlan(start_rps=2.0, growth=2.0, precision=0.1, max_rps=16.0)
WORKLOAD = Workload(
    WorkloadProfile(
        prompt_tokens_p50=200, prompt_tokens_p90=400, output_tokens=4, shared_prefix_share=0.5
    ),
    prefix_tokens=100,
    prefixes=2,
)


def step(rate: float, p99: float) -> Step:
    return Step(rate, p99, 0.0, rate, 0)


def test_a_pair_that_breaks_the_sla_under_the_single_ultimate_scales_at_the_ratio() -> None:
    # p99 crosses the SLO (1.0) halfway between 8 and 12 rps per replica: at 10
    pair = analyze([step(2, 0.1), step(8, 0.5), step(12, 1.5)], SLO)
    assert pair.ultimate_bounded
    assert scaling(16.0, pair) == pytest.approx(10 / 16)


def test_a_pair_that_meets_the_sla_at_the_single_ultimate_scales_at_one() -> None:
    pair = analyze([step(2, 0.1), step(8, 0.3), step(16, 0.6)], SLO)  # the ceiling: 16
    assert not pair.ultimate_bounded
    assert scaling(16.0, pair) == 1.0
    # two ultimates each bracketed to the plan's precision can cross: never over 1
    over = analyze([step(2, 0.1), step(17, 0.9), step(18, 1.1)], SLO)
    assert scaling(16.0, over) == 1.0


def test_the_pairs_plan_stops_once_the_ultimate_is_bracketed() -> None:
    assert not ultimate_bracketed([], PLAN, SLO)
    assert not ultimate_bracketed([step(2, 0.1), step(4, 0.2)], PLAN, SLO)  # climbing
    assert not ultimate_bracketed([step(2, 0.1), step(8, 2.0)], PLAN, SLO)  # 8 over 2: wide
    assert ultimate_bracketed([step(2, 0.1), step(10, 0.9), step(10.5, 1.2)], PLAN, SLO)
    # a miss below the highest pass (noise) brackets nothing
    assert not ultimate_bracketed([step(2, 0.1), step(4, 1.2), step(8, 0.9)], PLAN, SLO)


def test_each_replica_of_a_pair_gets_the_same_arrivals_and_lengths_and_its_own_prompts() -> None:
    offsets = [0.0, 0.1, 0.25, 0.5]
    urls = ["http://a", "http://b"]
    planned = plan_requests(WORKLOAD, "m", 3, urls, offsets, warm=False, tag="t")
    a = [p for p in planned if p.url == "http://a"]
    b = [p for p in planned if p.url == "http://b"]
    assert [p.at_s for p in a] == [p.at_s for p in b] == offsets
    assert [p.prompt_tokens for p in a] == [p.prompt_tokens for p in b]
    prompts = [json.loads(p.body)["messages"][0]["content"] for p in planned]
    assert len(set(prompts)) == len(prompts)  # cold: no prompt sent twice
    # one replica alone gets the workload's requests as they are (its tag unchanged)
    alone = plan_requests(WORKLOAD, "m", 3, urls[:1], offsets, warm=False, tag="t")
    same = requests(WORKLOAD, len(offsets), warm=False, seed=3, tag="t")
    assert [p.body for p in alone] == [r.body("m") for r in same]
    assert [p.prompt_tokens for p in alone] == [p.prompt_tokens for p in a]
