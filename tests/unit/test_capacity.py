"""The bearing-capacity model (controlplane.kernel.capacity.bearing): the knee, the ultimate and
failure loads read from a probe's steps, the probe's plan, the cache effect's fit."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controlplane.kernel.capacity.bearing import (
    CapacitySLO,
    ProbePlan,
    Step,
    analyze,
    fit_hit_effect,
    utilization,
)

SLO = CapacitySLO(ttft_p99_s=1.0)


def step(rate: float, p99: float, errors: float = 0.0, timeouts: int = 0) -> Step:
    return Step(rate, p99, errors, rate * (1 - errors), timeouts)


def test_knee_and_ultimate_are_interpolated_between_steps() -> None:
    curve = analyze(
        [step(2, 0.10), step(4, 0.12), step(8, 0.30), step(16, 1.50, 0.01), step(32, 9.0, 0.2)],
        SLO,
    )
    assert curve.baseline_p99_s == 0.10
    # p99 crosses 2 x 0.10 between 4 (0.12) and 8 (0.30): at 4 + 4 x 0.08 / 0.18
    assert curve.knee_rps == pytest.approx(4 + 4 * 0.08 / 0.18)
    # the SLA breaks between 8 and 16: p99 reaches 1.0 at 8 + 8 x 0.7 / 1.2 (12.7),
    # errors reach 0.5 % at 8 + 8 x 0.5 = 12: the earlier of the two
    assert curve.ultimate_rps == pytest.approx(12)
    assert curve.ultimate_bounded
    assert curve.failure_rps == 32
    assert curve.allowed_rps(2.0) == pytest.approx(curve.ultimate_rps / 2)


def test_without_a_step_over_the_sla_the_ultimate_is_a_lower_bound() -> None:
    curve = analyze([step(1, 0.1), step(2, 0.1)], SLO)
    assert (curve.ultimate_rps, curve.ultimate_bounded, curve.knee_rps) == (2, False, None)


def test_a_first_step_already_over_the_sla_is_refused() -> None:
    with pytest.raises(ValueError, match="probe from a lower rate"):
        analyze([step(5, 2.0)], SLO)
    with pytest.raises(ValueError, match="no probe steps"):
        analyze([], SLO)


def test_a_timeout_ends_the_ultimate_at_the_step_before() -> None:
    curve = analyze([step(1, 0.1), step(2, 0.2, timeouts=1)], SLO)
    assert curve.ultimate_rps == 1 and curve.failure_rps == 2


def test_slo_settings_are_checked() -> None:
    with pytest.raises(ValidationError):
        CapacitySLO(ttft_p99_s=0)
    with pytest.raises(ValidationError, match="failure_error_rate"):
        CapacitySLO(ttft_p99_s=1, error_rate=0.1, failure_error_rate=0.05)
    with pytest.raises(ValueError):
        ProbePlan(start_rps=0)
    with pytest.raises(ValueError, match="factor of safety"):
        analyze([step(1, 0.1)], SLO).allowed_rps(0.5)


def queue(capacity: float, base: float) -> object:
    """A replica whose first-token p99 grows like a queue's, base / (1 - rate/capacity),
    and which fails (errors, timeouts) past its capacity."""

    def measure(rate: float) -> Step:
        if rate >= capacity:
            return step(rate, 30.0, 0.3, timeouts=3)
        return step(rate, base / (1 - rate / capacity))

    return measure


def probe(plan: ProbePlan, measure: object, slo: CapacitySLO) -> list[Step]:
    steps: list[Step] = []
    while (rate := plan.next_rate(steps, slo)) is not None:
        steps.append(measure(rate))  # type: ignore[operator]
    return steps


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.floats(5, 500),
    base=st.floats(0.02, 0.3),
    slo_s=st.floats(0.5, 3.0),
    start_share=st.floats(0.01, 0.2),
)
def test_the_plan_finds_the_ultimate_load_within_its_precision(
    capacity: float, base: float, slo_s: float, start_share: float
) -> None:
    slo = CapacitySLO(ttft_p99_s=slo_s)
    plan = ProbePlan(start_rps=capacity * start_share, precision=0.05)
    steps = probe(plan, queue(capacity, base), slo)
    truth = capacity * (1 - base / slo_s)  # where base / (1 - r/c) = slo
    curve = analyze(steps, slo)
    assert curve.ultimate_bounded
    assert abs(curve.ultimate_rps - truth) / truth <= 0.05
    assert len(steps) <= plan.max_steps
    # the knee: where base / (1 - r/c) passes twice the lowest step's p99
    knee_truth = capacity * (1 - base / (2 * curve.baseline_p99_s))
    if steps[0].offered_rps < knee_truth < truth * 0.95:  # a knee inside the probed range
        assert curve.knee_rps is not None
        assert abs(curve.knee_rps - knee_truth) / knee_truth <= 0.05


def test_a_failure_step_ends_the_climb_and_the_bracket_is_halved_below_it() -> None:
    plan = ProbePlan(start_rps=1, precision=0.05)
    steps = [step(1, 0.1), step(2, 9.0, 0.5)]
    assert plan.next_rate(steps, SLO) == 1.5
    steps.append(step(1.5, 0.2))
    assert plan.next_rate(steps, SLO) == 1.75


def test_the_plan_climbs_to_its_ceiling_and_stops() -> None:
    plan = ProbePlan(start_rps=1, growth=2, max_rps=3)
    steps = probe(plan, lambda r: step(r, 0.1), SLO)
    assert [s.offered_rps for s in steps] == [1, 2, 3]


@given(r_base=st.floats(1, 1000), beta=st.floats(0, 0.95))
def test_the_cache_effect_is_recovered_from_two_hit_rates(r_base: float, beta: float) -> None:
    points = [(h, r_base / (1 - beta * h)) for h in (0.0, 0.8)]
    fit = fit_hit_effect(points)
    assert fit.r_base == pytest.approx(r_base, rel=1e-6)
    assert fit.beta == pytest.approx(beta, abs=1e-6)
    assert fit.capacity(0.5) == pytest.approx(r_base / (1 - beta * 0.5), rel=1e-6)


def test_the_cache_effect_needs_two_hit_rates() -> None:
    with pytest.raises(ValueError, match="two hit rates"):
        fit_hit_effect([(0.5, 10.0), (0.5, 11.0)])


def test_utilization() -> None:
    assert utilization(8, 10) == 0.8
    assert utilization(0, 0) == 0.0
    assert math.isinf(utilization(1, 0))
