"""Sustained steps (issue 28): the verdict that sees an unsustainable rate, the search
that claims only what it saw held, the step timing, and the figures read from requests."""

from __future__ import annotations

import math

import pytest

from chaos.capacity.results import Outcome, RequestResult
from chaos.capacity.stats import fit_unloaded, percentile, saturation_rps, sustained_figures
from controlplane.kernel.capacity.bearing import (
    CapacitySLO,
    Step,
    SustainedSearch,
    analyze,
    backlog_slack,
    keeps_up,
    knee_limit,
    meets_sla,
    past_knee,
    relaxation_s,
    sustained_timing,
)

SLO = CapacitySLO(ttft_p99_s=1.0)


def held(
    rate: float, p99: float, served: float = 1.0, growth: float = 0.0, judged: int = 400
) -> Step:
    return Step(rate, p99, 0.0, rate * served, 0, served, growth, judged, 4.0)


def test_a_step_that_falls_behind_misses_the_sla_whatever_its_p99() -> None:
    assert meets_sla(held(10, 0.5), SLO)
    assert not meets_sla(held(10, 0.5, served=0.9), SLO)  # served 90 % of what arrived
    assert not meets_sla(held(10, 0.5, growth=0.08), SLO)  # the backlog grew
    assert keeps_up(held(10, 0.5, served=0.96, growth=0.04), SLO)  # within the tolerance
    screening = Step(10, 0.5, 0.0, 3.0)  # from an empty queue: not judged on keeping up
    assert keeps_up(screening, SLO) and not screening.sustained


def test_a_few_requests_short_at_a_low_rate_is_chance_not_a_backlog() -> None:
    # 9 arrivals, 8 completed: one request in service at the window's end
    assert backlog_slack(held(2, 0.3, judged=9), SLO) == pytest.approx(2 + 3 * 2.0)
    assert keeps_up(held(2, 0.3, served=8 / 9, judged=9), SLO)
    assert not keeps_up(held(2, 0.3, served=0.1, judged=100), SLO)  # 90 short of 100


def test_the_search_steps_down_from_the_bound_then_halves_the_bracket() -> None:
    search = SustainedSearch(floor_rps=2.0, bound_rps=20.0, precision=0.05)
    assert search.next_rate([], SLO, 0.2) == pytest.approx(17.0)  # 0.85 x the bound
    steps = [held(17.0, 1.4)]  # over the SLO: [2, 17], wide: down by 0.85 again
    assert search.next_rate(steps, SLO, 0.2) == pytest.approx(14.45)
    steps.append(held(14.45, 0.8))  # held: [14.45, 17], narrow: halved
    assert search.next_rate(steps, SLO, 0.2) == pytest.approx(15.725)
    steps.append(held(15.725, 0.9))
    assert search.next_rate(steps, SLO, 0.2) == pytest.approx((15.725 + 17) / 2)
    steps.append(held((15.725 + 17) / 2, 1.1, served=0.5))  # fell behind: [15.725, 16.36]
    # the ultimate bracketed within 5 %; the knee (p99 over 0.4) next, below 14.45
    assert search.next_rate(steps, SLO, 0.2) == pytest.approx(0.85 * 14.45)


def test_the_search_ends_with_the_knee_bracketed_and_the_ultimate_is_what_held() -> None:
    search = SustainedSearch(floor_rps=2.0, bound_rps=None, precision=0.1)
    steps = [held(2.0, 0.2), held(10.0, 0.9), held(10.5, 1.2, served=0.8)]
    # ultimate bracketed [10, 10.5]; the knee (p99 over 0.4) lies in [2, 10]
    assert search.next_rate(steps[1:], SLO, 0.2) == pytest.approx(8.5)
    steps.append(held(8.5, 0.45))
    assert search.next_rate(steps[1:], SLO, 0.2) == pytest.approx(7.225)
    steps.append(held(7.225, 0.38))  # under: [7.225, 8.5] is 17.6 %: halved
    assert search.next_rate(steps[1:], SLO, 0.2) == pytest.approx(7.8625)
    steps.append(held(7.8625, 0.39))
    assert search.next_rate(steps[1:], SLO, 0.2) is None  # the knee within 10 %
    curve = analyze(steps, SLO, bound_rps=20.0, saturation_rps=30.0)
    assert curve.ultimate_rps == 10.0 and curve.ultimate_bounded  # what held, not interpolated
    assert curve.knee_rps is not None and 7.8625 <= curve.knee_rps <= 8.5


def test_a_knee_not_seen_below_a_bounded_ultimate_is_the_ultimate() -> None:
    steps = [held(2.0, 0.3), held(9.0, 0.5), held(9.5, 0.55, served=0.5)]
    curve = analyze(steps, SLO)  # p99 never doubled; the SLA broke on the backlog
    assert curve.ultimate_rps == 9.0 and curve.knee_rps == 9.0


def test_every_step_held_the_bound_still_bounds_and_saturation_caps() -> None:
    steps = [held(2.0, 0.2), held(9.0, 0.7)]
    unbounded = analyze(steps, SLO)
    assert unbounded.ultimate_rps == 9.0 and not unbounded.ultimate_bounded
    assert analyze(steps, SLO, bound_rps=9.5).ultimate_bounded
    capped = analyze(steps, SLO, saturation_rps=8.0)
    assert capped.ultimate_rps == 8.0 and capped.saturation_rps == 8.0


def test_the_timing_grows_with_the_load_and_is_capped() -> None:
    # relaxation of one server at the saturation throughput: 1 / (mu (1 - sqrt(rho))^2)
    assert relaxation_s(25.0, 100.0) == pytest.approx(1 / (100 * 0.25))
    low = sustained_timing(
        2.0, 10.0, min_s=5.0, min_requests=100, max_warmup_s=60.0, max_measure_s=90.0
    )
    high = sustained_timing(
        9.0, 10.0, min_s=5.0, min_requests=100, max_warmup_s=60.0, max_measure_s=90.0
    )
    assert low.warmup_s == pytest.approx(3 * relaxation_s(2.0, 10.0))
    assert low.measure_s == pytest.approx(50.0)  # 100 arrivals at 2 rps
    assert high.warmup_s == 60.0  # 3 x 36 s, capped
    assert high.measure_s == pytest.approx(relaxation_s(9.0, 10.0))  # longer than 100 / 9
    assert high.total_s == high.warmup_s + high.measure_s
    with pytest.raises(ValueError):
        relaxation_s(0.0, 10.0)


def req(arrive: float, wait: float, service: float = 0.5) -> RequestResult:
    return RequestResult(
        planned_s=arrive,
        sent_s=arrive,
        first_token_s=arrive + wait + 0.1,
        done_s=arrive + wait + service,
        outcome=Outcome.OK,
        status=200,
        detail="",
        prompt_tokens=10,
        generated_tokens=2,
        cached_tokens=0,
        url="u",
    )


def test_a_steady_window_keeps_up_and_a_growing_queue_does_not() -> None:
    # 10 rps for 40 s; judged over [20, 40)
    steady = [req(i / 10, 0.0) for i in range(400)]
    figs = sustained_figures(steady, 10.0, 20.0, 20.0, timeout_s=30.0).figures
    assert figs.requests == 200 and figs.step.sustained
    assert figs.step.served_ratio == pytest.approx(1.0, abs=0.01)
    assert abs(figs.step.backlog_growth or 0.0) < 0.01
    assert figs.step.throughput_rps == pytest.approx(10.0, abs=0.1)
    assert keeps_up(figs.step, SLO)
    # a server that completes 8 per second: the queue grows by 2 each second
    growing = [req(i / 10, wait=i / 10 * 0.25, service=0.125) for i in range(400)]
    late = sustained_figures(growing, 10.0, 20.0, 20.0, timeout_s=30.0).figures
    assert late.step.served_ratio is not None and late.step.served_ratio < 0.85
    assert (late.step.backlog_growth or 0.0) > 0.1
    assert not keeps_up(late.step, SLO)


def test_workload_errors_are_left_out_of_a_sustained_step() -> None:
    results = [req(i / 10, 0.0) for i in range(400)]
    refused = [
        RequestResult(20.0 + i / 10, 20.0 + i / 10, None, 20.0 + i / 10, Outcome.WORKLOAD,
                      400, "maximum context length", 0, 0, None, "u")
        for i in range(50)
    ]  # fmt: skip
    figs = sustained_figures([*results, *refused], 10.0, 20.0, 20.0, timeout_s=30.0).figures
    assert figs.step.error_rate == 0.0 and figs.requests == 200


def test_the_saturation_is_the_completion_rate_under_a_backlog() -> None:
    # all at once; one slot, 0.25 s each: 4 completions per second
    burst = [req(0.0, wait=0.25 * i, service=0.25) for i in range(100)]
    assert saturation_rps(burst) == pytest.approx(4.0, rel=0.02)
    assert saturation_rps(burst[:5]) is None
    assert math.isfinite(saturation_rps(burst) or math.inf)


def test_a_step_over_the_slo_but_under_the_knee_limit_ends_the_knee_search() -> None:
    # baseline 0.6 s: the knee's limit (1.2 s) is above the SLO (1.0 s). 6.47 kept up but
    # missed the SLO with p99 1.1: past the ultimate (5.5), so it bounds the knee too.
    # Judged by its p99 alone it did not, and a probe asked for 6.56 thirteen times.
    search = SustainedSearch(floor_rps=4.0, bound_rps=20.0, precision=0.25)
    steps = [held(5.5, 0.7), held(6.47, 1.1), held(7.62, 1.3)]
    assert search.next_rate(steps, SLO, 0.6) is None  # the knee in [5.5, 6.47]: within 25 %
    curve = analyze([held(4.0, 0.6), *steps], SLO)
    assert curve.ultimate_rps == 5.5 and curve.knee_rps == 5.5


def test_a_step_between_that_misses_the_slo_halves_the_ultimates_bracket_again() -> None:
    search = SustainedSearch(floor_rps=4.0, bound_rps=20.0, precision=0.01)
    steps = [held(5.5, 0.7), held(6.0, 1.1), held(6.4, 1.3)]
    rate = search.next_rate(steps, SLO, 0.6)
    assert rate == pytest.approx(5.75)  # the ultimate's bracket [5.5, 6.0], halved
    assert search.next_rate([*steps, held(5.75, 1.1)], SLO, 0.6) == pytest.approx(5.625)


# ---- the knee's limit, scaled by the requests each step drew ------------------------------


def prompt(tokens: int, ttft: float, cached: int | None = 0, at: float = 0.0) -> RequestResult:
    return RequestResult(at, at, at + ttft, at + ttft + 1.0, Outcome.OK, 200, "", tokens, 8,
                         cached, "u")  # fmt: skip


def test_the_unloaded_line_is_fitted_on_uncached_tokens() -> None:
    # 5 ms fixed + 1/8,000 s a token, on prompts of 100..4,000 tokens, 300 of them cached
    rs = [prompt(n, 0.005 + (n - 300) / 8_000, cached=300) for n in range(400, 4_000, 100)]
    line = fit_unloaded(rs)
    assert line is not None
    assert line.fixed_s == pytest.approx(0.005) and line.per_token_s == pytest.approx(1 / 8_000)
    assert line.p99(rs) == pytest.approx(percentile([r.ttft_s or 0 for r in rs], 99))
    assert fit_unloaded(rs[:9]) is None  # too few to fit
    flat = fit_unloaded([prompt(100, 0.2 - i / 1_000) for i in range(20)])  # one length
    assert flat is not None and flat.per_token_s == 0 and flat.fixed_s == pytest.approx(0.1905)


def test_a_heavier_draw_of_prompts_is_not_taken_for_queueing() -> None:
    # the lowest step drew light prompts (p99 0.43 s; the mix's is ~0.70 s); a step whose
    # requests would take 0.68 s unloaded reads 0.93 s: under 2 x 0.43 x 0.68 / 0.43
    base = Step(2.0, 0.429, 0.0, 2.0, unloaded_p99_s=0.43)
    heavier = Step(6.72, 0.927, 0.0, 6.72, 0, 1.0, 0.0, 400, 4.0, unloaded_p99_s=0.68)
    slo = CapacitySLO(ttft_p99_s=2.0)
    assert knee_limit(heavier, base, slo) == pytest.approx(2 * 0.429 * 0.68 / 0.43)
    assert not past_knee(heavier, base, slo)
    unscaled = Step(6.72, 0.927, 0.0, 6.72, 0, 1.0, 0.0, 400, 4.0)  # no line: 2 x 0.429
    assert past_knee(unscaled, base, slo)
    queued = Step(8.0, 1.5, 0.0, 8.0, 0, 1.0, 0.0, 400, 5.0, unloaded_p99_s=0.68)
    curve = analyze([base, heavier, queued], slo)
    # the knee between 6.72 (p99 0.68 of its limit) and 8.0 (1.10 of it), interpolated
    r_lo, r_hi = 0.927 / knee_limit(heavier, base, slo), 1.5 / knee_limit(queued, base, slo)
    expected = 6.72 + (1 - r_lo) / (r_hi - r_lo) * (8.0 - 6.72)
    assert curve.knee_rps == pytest.approx(expected)
    search = SustainedSearch(floor_rps=2.0, bound_rps=9.0, precision=0.1)
    held_steps = [heavier, queued, Step(8.5, 2.5, 0.0, 8.0, 0, 0.9, 0.1, 400, 9.0)]
    nxt = search.next_rate(held_steps, slo, base)
    # the ultimate bracketed [8, 8.5]; the knee in [6.72, 8] by the scaled limit: halved
    assert nxt == pytest.approx((6.72 + 8.0) / 2)
