"""Warm-pool sizing (controlplane.kernel.pool.sizing): pure arithmetic, units in the names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from controlplane.kernel.pool.sizing import (
    BurstProfile,
    check_pool,
    cold_fits,
    replicas_for_burst,
    wakes_within_budget,
    warm_needed,
)

# The worked example of the docstring and the README.
EXAMPLE = BurstProfile(
    burst_rps=100,
    replica_rps=30,
    cold_start_s=120,
    activation_s=8,
    budget_s=30,
    activation_rate=0.5,
)


def test_the_worked_example() -> None:
    assert replicas_for_burst(EXAMPLE) == 4
    assert not cold_fits(EXAMPLE)
    assert wakes_within_budget(EXAMPLE) == 12
    assert warm_needed(EXAMPLE) == 4
    report = check_pool(EXAMPLE, configured_warm=2)
    assert report.too_small and report.feasible
    assert (report.needed_warm, report.shortfall) == (4, 2)
    assert (report.absorbed_rps, report.unabsorbed_rps) == (60, 40)
    assert "2 short" in report.reason and "40 req/s unabsorbed" in report.reason
    assert not check_pool(EXAMPLE, configured_warm=4).too_small


def test_exact_multiples_do_not_round_up() -> None:
    p = EXAMPLE.model_copy(update={"burst_rps": 90.0})
    assert replicas_for_burst(p) == 3
    p = EXAMPLE.model_copy(update={"burst_rps": 0.3, "replica_rps": 0.1})
    assert replicas_for_burst(p) == 3  # 0.3 / 0.1 is 2.9999999999999996 in floats


def test_no_burst_needs_no_warm_pool() -> None:
    p = EXAMPLE.model_copy(update={"burst_rps": 0.0})
    report = check_pool(p, configured_warm=0)
    assert report.needed_warm == 0 and not report.too_small and report.unabsorbed_rps == 0


def test_cold_starts_that_fit_the_budget_cover_what_cold_slots_allow() -> None:
    p = EXAMPLE.model_copy(update={"cold_start_s": 15.0})  # 15 + 8 <= 30
    assert cold_fits(p)
    assert warm_needed(p) == 0  # unlimited COLD slots
    assert warm_needed(p, cold_slots=1) == 3
    report = check_pool(p, configured_warm=1, cold_slots=1)
    assert report.too_small and report.shortfall == 2 and report.absorbed_rps == 60
    assert "cold starts may cover" in report.reason


def test_activation_slower_than_the_budget_is_infeasible() -> None:
    p = EXAMPLE.model_copy(update={"activation_s": 45.0})
    assert wakes_within_budget(p) == 0
    report = check_pool(p, configured_warm=10)
    assert not report.feasible and not report.too_small  # more WARM would not help
    assert report.absorbed_rps == 0 and "no WARM pool meets it" in report.reason


def test_a_slow_activation_rate_caps_what_any_warm_pool_absorbs() -> None:
    p = EXAMPLE.model_copy(update={"activation_rate": 0.1})  # floor(22 * 0.1) + 1 = 3 < 4
    assert wakes_within_budget(p) == 3
    report = check_pool(p, configured_warm=4)
    assert not report.feasible and report.absorbed_rps == 90 and report.unabsorbed_rps == 10


def test_unbounded_activation_rate() -> None:
    p = EXAMPLE.model_copy(update={"activation_rate": None})
    assert wakes_within_budget(p) is None and check_pool(p, 4).feasible


def test_inputs_are_validated() -> None:
    with pytest.raises(ValidationError):
        BurstProfile(burst_rps=-1, replica_rps=1, cold_start_s=1, activation_s=1, budget_s=1)
    with pytest.raises(ValidationError):
        BurstProfile(burst_rps=1, replica_rps=0, cold_start_s=1, activation_s=1, budget_s=1)
    with pytest.raises(ValidationError):
        EXAMPLE.model_validate({**EXAMPLE.model_dump(), "burst": 1})


@given(st.floats(0, 1e4), st.floats(0.1, 1e3), st.integers(0, 200))
def test_a_pool_with_the_needed_warm_count_is_never_too_small(
    burst: float, per_replica: float, warm: int
) -> None:
    p = EXAMPLE.model_copy(
        update={"burst_rps": burst, "replica_rps": per_replica, "activation_rate": None}
    )
    need = warm_needed(p)
    assert not check_pool(p, need).too_small
    report = check_pool(p, warm)
    assert report.too_small == (warm < need)
    assert 0 <= report.absorbed_rps <= burst
    assert report.absorbed_rps + report.unabsorbed_rps == pytest.approx(burst)
    if not report.too_small:
        assert report.unabsorbed_rps == pytest.approx(0, abs=1e-6)
