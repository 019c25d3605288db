"""bench autoscale's goals (bench/autoscale_figures.py): behind a peer on cost alone is
out of reach when that peer misses the SLO for less than meeting it costs."""

from __future__ import annotations

from bench.autoscale_figures import scenario_goals


def entry(attainment: float, cost: float) -> dict[str, object]:
    return {"slo_attainment": attainment, "cost_over_oracle": cost, "p99_over_steady": 1.0}


def test_behind_on_cost_to_a_peer_under_the_oracle_or_the_floor_is_out_of_reach() -> None:
    policies = {
        "tectonic": entry(1.0, 1.35),
        "hpa_cpu": entry(0.02, 0.63),  # under the oracle's cost: misses the SLO
        "keda_queue": entry(0.5, 1.32),  # over the oracle's, under the causal floor
        "oracle": {**entry(1.0, 1.0), "causal_floor_cost_over_oracle": 1.34},
    }
    got = scenario_goals(policies)
    assert got["ahead_of_peers"] is False and set(got["behind"]) == {"hpa_cpu", "keda_queue"}  # type: ignore[arg-type]
    assert got["cost_floor"] == 1.34 and got["cost_over_oracle"] is False
    why = got["out_of_reach"]
    assert isinstance(why, dict) and set(why) == {"hpa_cpu", "keda_queue"}
    assert "under the oracle's" in why["hpa_cpu"] and "causal floor 1.340" in why["keda_queue"]


def test_a_cheaper_peer_that_meets_the_slo_or_one_ahead_on_attainment_is_within_reach() -> None:
    policies = {
        "tectonic": entry(0.995, 1.35),
        "hpa_cpu": entry(0.999, 0.9),  # ahead on attainment too
        "keda_queue": entry(0.992, 1.2),  # meets the SLO for less
        "oracle": {**entry(1.0, 1.0), "causal_floor_cost_over_oracle": 1.1},
    }
    got = scenario_goals(policies)
    assert set(got["behind"]) == {"hpa_cpu", "keda_queue"}  # type: ignore[arg-type]
    assert got["out_of_reach"] == {}
