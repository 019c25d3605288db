"""``bench placement``'s rounds (bench/placement.py): the front ends' order rotates,
each figure of the headline is the median of its rounds, and the headline counts the
rounds in which each goal held."""

from __future__ import annotations

import pytest

from bench.placement import SYSTEMS, Figures, Options, headline, median_figures, round_orders


def fig(system: str, round_: int, p99: float, rps: float, hit: float) -> Figures:
    return Figures(system, round_, p99 / 4, p99, rps, hit, 100, 0, 8, 0.1)


def test_each_round_rotates_the_order_so_none_always_goes_first() -> None:
    orders = round_orders(4)
    assert orders[:3] == [
        ("tectonic", "round_robin", "peer"),
        ("round_robin", "peer", "tectonic"),
        ("peer", "tectonic", "round_robin"),
    ]
    assert orders[3] == orders[0] and all(sorted(o) == sorted(SYSTEMS) for o in orders)


def test_the_median_of_the_rounds_ignores_one_disturbed_round() -> None:
    rounds = [
        fig("peer", 1, 80, 46.0, 0.61),
        fig("peer", 2, 300, 30.0, 0.2),
        fig("peer", 3, 90, 46.5, 0.63),
    ]
    m = median_figures(rounds)
    assert (m.p99_ttft_ms, m.rps, m.hit_rate, m.round) == (90, 46.0, 0.61, 0)
    assert m.completed == 300 and m.max_held_one_replica == 8
    with pytest.raises(ValueError):
        median_figures([])


def test_the_headline_judges_the_medians_and_counts_the_rounds() -> None:
    per_round = {
        "tectonic": [fig("tectonic", 1, 70, 47.0, 0.70), fig("tectonic", 2, 95, 46.0, 0.60)],
        "round_robin": [
            fig("round_robin", 1, 85, 46.5, 0.62),
            fig("round_robin", 2, 90, 46.5, 0.62),
        ],
        "peer": [fig("peer", 1, 86, 46.6, 0.61), fig("peer", 2, 88, 46.6, 0.61)],
    }
    medians = {s: median_figures(f) for s, f in per_round.items()}
    head = headline(medians, Options(rounds=2), 1.0, per_round)
    assert head["p99_ms_tectonic"] == 82.5 and head["hit_rate_tectonic"] == 0.65
    assert head["met"] == {
        "p99_ms_tectonic": True,
        "hit_rate_tectonic": True,
        "rps_tectonic": False,
    }
    # one round of two met each goal: luck, which the medians alone would hide
    assert head["met_in_rounds"] == {
        "p99_ms_tectonic": 1,
        "hit_rate_tectonic": 1,
        "rps_tectonic": 1,
    }
