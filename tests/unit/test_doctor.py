"""failoverctl doctor's questions (controlplane/cli/doctor.py), decided on fake answers
and a fake clock: each question's PASS, FAIL and UNKNOWN, the exit code, and the
command's reading of the repository."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.cli import doctor as d
from controlplane.cli.doctor_cmd import find_repo, read_repo
from controlplane.core.cold_start import ColdStart
from controlplane.core.spend import CostReport, PoolCost, ScopeCost
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import (
    CapacityRecord,
    HitProbe,
    WorkloadProfile,
    critical_hit_rate,
)
from controlplane.kernel.codec import encode
from controlplane.kernel.ladder.file import load_ladder, parse_ladder
from controlplane.kernel.pool.cost import BudgetLift
from controlplane.kernel.pool.scale import GuardLesson, ScaleRecord

NOW = 1_800_000_000.0  # the fake clock
DAY = 86400.0
REPO = Path(__file__).resolve().parents[2]
V = d.Verdict


def bearing(**kw: object) -> pb.RegionCapacity:
    base: dict[str, object] = {
        "source": "measured",
        "reason": "probed 2.0 h ago",
        "cbu": 0.5,
        "allowed_rps": 100.0,
        "load_rps": 50.0,
        "hit_rate": 0.5,
        "beta": 0.5,
        "measured_at": NOW - 7200,
        "engine_version": "0.11.0",
    }
    base.update(kw)
    return pb.RegionCapacity(**base)  # type: ignore[arg-type]


def unit(name: str = "east", **kw: object) -> pb.RegionStatus:
    fields: dict[str, object] = {"name": name, "capacity": bearing()}
    fields.update(kw)
    return pb.RegionStatus(**fields)  # type: ignore[arg-type]


def capacity_record(region: str = "east", ttft: float = 1.5) -> CapacityRecord:
    probe = HitProbe(hit_rate=0.0, baseline_p99_s=0.1, ultimate_rps=10, ultimate_bounded=True)
    return CapacityRecord(
        region=region,
        measured_at=NOW - 7200,
        engine_version="0.11.0",
        replica=f"http://{region}-0:8000",
        slo=CapacitySLO(ttft_p99_s=ttft),
        factor_of_safety=2.0,
        probes=(probe,),
        r_base_rps=10.0,
        beta=0.5,
        profile=WorkloadProfile(
            prompt_tokens_p50=500, prompt_tokens_p90=2000, output_tokens=64, shared_prefix_share=0.5
        ),
    )


def scale_record(unit: str = "east", horizon: float = 30.0, **kw: object) -> ScaleRecord:
    fields: dict[str, object] = {
        "unit": unit,
        "active": 2,
        "warm": 1,
        "decided_at": NOW - 5,
        "changed_at": NOW - 600,
        "reasons": (
            f"load 50 rps, forecast 52 (P90 60) in {horizon:g} s at hit rate 0.50: 30 rps "
            "per replica (measured) -> 2 ACTIVE",
        ),
        "load_rps": 50.0,
        "forecast_rps": 52.0,
        "upper_rps": 60.0,
        "per_replica_rps": 30.0,
        "capacity": "measured",
    }
    fields.update(kw)
    return ScaleRecord.model_validate(fields)


def facts(
    units: list[pb.RegionStatus] | None = None,
    *,
    capacity: pb.CapacityResponse | str | None = None,
    scale: pb.ScaleResponse | str | None = None,
    readiness: pb.ReadinessResponse | str | None = None,
    drills: pb.DrillsResponse | str | None = None,
    **kw: object,
) -> d.Facts:
    us = units if units is not None else [unit()]
    cap = capacity if capacity is not None else pb.CapacityResponse()
    return d.Facts(
        now=NOW,
        status=pb.StatusResponse(regions=us, generated_at=NOW),
        capacity=cap,
        scale=scale if scale is not None else pb.ScaleResponse(scaling=True),
        readiness=readiness if readiness is not None else pb.ReadinessResponse(),
        drills=drills if drills is not None else pb.DrillsResponse(),
        **kw,  # type: ignore[arg-type]
    )


def with_capacity(*records: CapacityRecord) -> pb.CapacityResponse:
    return pb.CapacityResponse(
        regions=[pb.RegionCapacityRecord(region=r.region, record_json=encode(r)) for r in records]
    )


def with_scale(*records: ScaleRecord) -> pb.ScaleResponse:
    return pb.ScaleResponse(
        scaling=True,
        pools=[pb.PoolScale(unit=r.unit, record_json=encode(r)) for r in records],
    )


# ---- 1. WARM standby -----------------------------------------------------------------
def test_warm_standby_is_unknown_while_an_input_is_not_measured() -> None:
    u = unit(signals={"replicas_warm": 1, "activation_p95_s": 4.0})
    line = d.check_warm_standby(facts([u], scale=with_scale(scale_record())))
    assert line.verdict is V.UNKNOWN
    assert "activation rate" in line.evidence and "burst load" in line.evidence
    assert "has 1 WARM now, wake p95 4.0 s, 30.0 rps per replica (measured)" in line.evidence


def test_a_measured_activation_rate_is_evidence_and_a_missing_one_is_typed() -> None:
    u = unit(signals={"replicas_warm": 1, "activation_p95_s": 4.0, "activation_rate": 1.5})
    line = d.check_warm_standby(facts([u], scale=with_scale(scale_record())))
    assert line.verdict is V.UNKNOWN  # the burst, cold start and budget are still unmeasured
    assert "activation rate 1.50 replicas/s (measured)" in line.evidence
    assert "activation rate (no batch" not in line.evidence
    assert d.sizing_inputs(u, None).activation_rate == 1.5
    missing = d.check_warm_standby(facts([unit(signals={"replicas_warm": 1})]))
    assert "activation rate (no batch of 2 or more wakes" in missing.evidence
    assert "typed scaling.activation_rate does not count" in missing.evidence


def test_a_typed_capacity_is_not_a_measured_per_replica_capacity() -> None:
    rec = scale_record(capacity="typed capacity_rps 100 over 2 ACTIVE")
    inputs = d.sizing_inputs(unit(signals={"replicas_warm": 1}), rec)
    assert inputs.replica_rps is None and inputs.warm_now == 1


def checked(warm_now: int, *, measured: bool = True, feasible: bool = True) -> pb.ScaleResponse:
    """GetScale with the leader's cold-start check of east (core/cold_start.py)."""
    cold = ColdStart(
        unit="east",
        activation_p95_s=2.0,
        budget_s=0.5,
        warm_now=warm_now,
        warm_needed=3,
        burst_rps=90.0,
        feasible=feasible,
        measured={"activation_s": True, "activation_rate": measured, "replica_rps": True},
        activation_rate=1.5,
    )
    resp = with_scale(scale_record())
    resp.pools[0].cold_start_json = json.dumps(dataclasses.asdict(cold)).encode()
    return resp


@pytest.mark.parametrize(
    ("warm_now", "kw", "verdict", "said"),
    [
        (3, {}, V.PASS, "3 WARM now, 3 needed for a burst of 90 rps beyond ACTIVE"),
        (2, {}, V.FAIL, "2 WARM now, 3 needed"),
        (5, {"feasible": False}, V.FAIL, "cannot finish within the horizon"),
        (5, {"measured": False}, V.UNKNOWN, "not measured: activation rate"),
    ],
)
def test_warm_standby_from_the_leaders_cold_start_check(
    warm_now: int, kw: dict[str, bool], verdict: d.Verdict, said: str
) -> None:
    """With the leader's check in GetScale, Q1 is its answer: PASS or FAIL only when the
    activation time, the activation rate and one replica's capacity were all measured."""
    line = d.check_warm_standby(facts([unit()], scale=checked(warm_now, **kw)))
    assert line.verdict is verdict and said in line.evidence, line.evidence


def measured(warm: int) -> d.SizingInputs:
    return d.SizingInputs(
        warm_now=warm,
        activation_s=8.0,
        activation_rate=0.5,
        replica_rps=30.0,
        burst_rps=100.0,
        cold_start_s=120.0,
        budget_s=30.0,
    )


@pytest.mark.parametrize(("warm", "verdict"), [(4, V.PASS), (2, V.FAIL)])
def test_warm_standby_against_the_sizing_formula(warm: int, verdict: d.Verdict) -> None:
    # sizing.py's worked example: 100 rps at 30 per replica, cold too slow: 4 WARM
    line = d.check_warm_standby(facts(sizing={"east": measured(warm)}))
    assert line.verdict is verdict
    assert f"{warm} WARM configured, 4 needed" in line.evidence
    assert "activation rate 0.50 replicas/s, measured" in line.evidence
    assert bool(line.todo) is (verdict is not V.PASS)


# ---- 2. activation p95 ---------------------------------------------------------------
@pytest.mark.parametrize(("p95", "verdict"), [(0.4, V.PASS), (0.6, V.FAIL)])
def test_wake_p95_against_a_third_of_the_slo(p95: float, verdict: d.Verdict) -> None:
    u = unit(signals={"activation_p95_s": p95})
    line = d.check_activation(facts([u], capacity=with_capacity(capacity_record(ttft=1.5))))
    assert line.verdict is verdict
    assert "(SLO 1.5 s / 3)" in line.evidence and "last 32 wakes since it started" in line.evidence
    assert "how many and since when not reported" in line.evidence  # an older agent


def test_wake_p95_says_how_far_back_it_sees_and_takes_the_leaders_budget() -> None:
    """The agent's wake count and the oldest wake's age are the p95's window; the
    leader's cold-start budget (the topology's SLO / 3) is the bound, with or without a
    capacity probe."""
    signals = {"activation_p95_s": 0.9, "activation_wakes": 7, "activation_span_s": 3 * 3600}
    resp = checked(1)  # its cold-start check: budget 0.5 s
    line = d.check_activation(facts([unit(signals=signals)], scale=resp))
    assert line.verdict is V.FAIL, line.evidence
    assert "wake p95 0.90 s > 0.50 s (SLO 1.5 s / 3)" in line.evidence
    assert "over its last 7 wake(s), the oldest 3.0h ago" in line.evidence
    assert "90 days are Prometheus's" in line.evidence


def test_wake_p95_unknown_without_a_wake_or_an_slo() -> None:
    assert d.check_activation(facts()).verdict is V.UNKNOWN
    line = d.check_activation(facts([unit(signals={"activation_p95_s": 0.2})]))
    assert line.verdict is V.UNKNOWN and "no first-token SLO known" in line.evidence


def test_a_pool_reads_its_regions_slo() -> None:
    u = unit("east.chat", pool_of="east", signals={"activation_p95_s": 0.2})
    line = d.check_activation(facts([u], capacity=with_capacity(capacity_record("east"))))
    assert line.verdict is V.PASS


# ---- 3. the hit-rate alert -----------------------------------------------------------
RULES_WITHOUT = "groups:\n- name: t\n  rules:\n  - alert: X\n    expr: up == 0\n"
RULES_WITH = (
    "groups:\n- name: t\n  rules:\n  - alert: HitRateLow\n"
    "    expr: tectonic_region_hit_rate < 0.45\n"
)


def risky() -> pb.RegionStatus:
    """East by capacity_record's probe: 2 ACTIVE of R_base 10, FOS 2: 10 rps fully cold,
    beta 0.5; it serves 15 rps, at hit rate 0.5."""
    return unit(capacity=bearing(hit_rate=0.5, load_rps=15.0, active_replicas=2))


def test_critical_hit_rate_from_the_probes_beta() -> None:
    # allowed(h) = 10 / (1 - 0.5 h) = 15 at h = (1 - 10/15) / 0.5
    rec = capacity_record()
    h, basis = d.unit_critical_hit_rate(risky(), rec)
    assert h == pytest.approx((1 - 10 / 15) / 0.5) and "beta 0.50, 2 ACTIVE" in basis
    assert critical_hit_rate(rec, 2, 0.0) == -math.inf  # no load: borne at any hit rate
    assert critical_hit_rate(rec.model_copy(update={"beta": 0.0}), 2, 15.0) == math.inf
    assert d.unit_critical_hit_rate(risky(), None)[0] is None
    stale = unit(capacity=bearing(source="stale", load_rps=15.0, active_replicas=2))
    assert "a stale probe's: see question 7" in d.unit_critical_hit_rate(stale, rec)[1]


def probed(*us: pb.RegionStatus, **kw: object) -> d.Facts:
    return facts(list(us), capacity=with_capacity(capacity_record()), **kw)


def test_hit_rate_alert_missing_fails_where_a_drop_goes_below_load() -> None:
    line = d.check_hit_rate_alert(probed(risky(), rules=RULES_WITHOUT, rules_source="r.yaml"))
    assert line.verdict is V.FAIL
    assert "below hit rate 0.67" in line.evidence and "no rule in r.yaml" in line.evidence
    assert "TectonicHitRateNearCritical" in line.todo


def test_a_fixed_hit_rate_alert_passes_only_high_enough() -> None:
    high = RULES_WITH.replace("0.45", "0.8")
    line = d.check_hit_rate_alert(probed(risky(), rules=high))
    assert line.verdict is V.PASS and "fires below 0.8" in line.evidence
    line = d.check_hit_rate_alert(probed(risky(), rules=RULES_WITH))  # under 0.67 + 0.1
    assert line.verdict is V.FAIL and "fires below 0.45, under 0.77" in line.evidence


def test_the_shipped_alert_follows_the_critical_hit_rate() -> None:
    """TectonicHitRateNearCritical compares the hit rate with the leader's critical hit
    rate + 0.1: it passes wherever a probe measured beta, whatever the load; a margin
    under 0.1 fails."""
    text = (REPO / "runbooks/alerts/tectonic-alerts.yaml").read_text()
    line = d.check_hit_rate_alert(probed(risky(), rules=text))
    assert line.verdict is V.PASS, line.evidence
    assert "TectonicHitRateNearCritical fires below it + 0.1 (0.77)" in line.evidence
    thin = text.replace(
        "tectonic_region_critical_hit_rate) + 0.1", "tectonic_region_critical_hit_rate) + 0.05"
    )
    line = d.check_hit_rate_alert(probed(risky(), rules=thin))
    assert line.verdict is V.FAIL and "critical + 0.05" in line.evidence


def test_hit_rate_alert_passes_where_even_cold_bears_the_load() -> None:
    calm = unit(capacity=bearing(load_rps=8.0, active_replicas=2))  # 10 cold > 8
    line = d.check_hit_rate_alert(probed(calm, rules=RULES_WITHOUT))
    assert line.verdict is V.PASS and "even fully cold" in line.evidence


def test_hit_rate_alert_unknown_without_rules_or_a_probe() -> None:
    assert d.check_hit_rate_alert(probed(risky())).verdict is V.UNKNOWN  # no rules file
    line = d.check_hit_rate_alert(facts([risky()], rules=RULES_WITHOUT))
    assert line.verdict is V.UNKNOWN and "no capacity probe record" in line.evidence


# ---- 4. the forecast horizon ---------------------------------------------------------
def test_horizon_read_from_the_scalers_reason() -> None:
    assert d.horizon_of(scale_record(horizon=30)) == 30.0
    longer = "load 5 rps, forecast 5 (P90 6) in 42 s (the measured wake p95) at hit rate 0.10"
    assert d.horizon_of(scale_record(reasons=(longer,))) == 42.0
    dark = "signal dark (no agent report): the size holds"
    assert d.horizon_of(scale_record(reasons=(dark,))) is None


def test_forecast_horizon_out_of_range_fails() -> None:
    line = d.check_forecast(facts(scale=with_scale(scale_record(horizon=60))))
    assert line.verdict is V.FAIL and "horizon 60 s" in line.evidence


def test_forecast_horizon_in_range_is_unknown_until_enough_forecasts_are_scored() -> None:
    few = scale_record(horizon=33, forecast_error=0.05, forecast_error_samples=4)
    line = d.check_forecast(facts(scale=with_scale(few)))
    assert line.verdict is V.UNKNOWN
    assert "horizon 33 s" in line.evidence and "4 of 5 forecasts scored" in line.evidence
    assert "forecast error" in line.todo


@pytest.mark.parametrize(("error", "verdict"), [(0.08, V.PASS), (0.25, V.PASS), (0.4, V.FAIL)])
def test_forecast_error_against_its_threshold(error: float, verdict: d.Verdict) -> None:
    r = scale_record(horizon=30, forecast_error=error, forecast_error_samples=12)
    line = d.check_forecast(facts(scale=with_scale(r)))
    assert line.verdict is verdict, line.evidence
    assert f"forecast error {error:.0%}" in line.evidence and "12 scored" in line.evidence
    assert "P90 band is +15%" in line.evidence


def test_forecast_unknown_without_scaling_or_records() -> None:
    assert d.check_forecast(facts(scale=pb.ScaleResponse(scaling=False))).verdict is V.UNKNOWN
    assert d.check_forecast(facts(scale="UNAVAILABLE")).verdict is V.UNKNOWN
    assert d.check_forecast(facts()).verdict is V.UNKNOWN


def test_forecast_pass_once_every_part_passes() -> None:
    # a line with only passing findings passes: the combination rule
    found = [d.Finding(V.PASS, "a"), d.Finding(V.PASS, "b")]
    assert d._line(4, "q", found, lambda v: "do").verdict is V.PASS


# ---- 5. drills in 7 days -------------------------------------------------------------
def run(region: str = "east", ago_s: float = DAY, **kw: object) -> pb.DrillRun:
    fields: dict[str, object] = {
        "id": "d1",
        "scenario": "region-blackout",
        "region": region,
        "started_at": NOW - ago_s - 60,
        "ended_at": NOW - ago_s,
        "passed": True,
    }
    fields.update(kw)
    return pb.DrillRun(**fields)  # type: ignore[arg-type]


def test_no_drill_in_seven_days_fails() -> None:
    old = pb.DrillsResponse(runs=[run(ago_s=8 * DAY), run(ago_s=DAY, dry_run=True)])
    line = d.check_drills(facts(drills=old))
    assert line.verdict is V.FAIL and "east: no failover drill" in line.evidence


def test_a_capacity_probe_is_not_a_failover_drill() -> None:
    probe = pb.DrillsResponse(runs=[run(scenario="capacity-probe")])
    assert d.check_drills(facts(drills=probe)).verdict is V.FAIL


BLACKOUT = ["steady_state_before", "prewarm_attainment", "session_consistency", "rto"]
LATENCY = ["steady_state_before", "degradation_order", "session_consistency"]


def test_a_week_of_drills_that_recorded_the_three_criteria_passes() -> None:
    """No shipped scenario measures all three: the week's newest drill that recorded
    each criterion answers for it (a blackout's pre-warm, a latency drill's ladder)."""
    week = [run(criteria=BLACKOUT), run(id="d2", ago_s=2 * DAY, criteria=LATENCY)]
    line = d.check_drills(facts(drills=pb.DrillsResponse(runs=week)))
    assert line.verdict is V.PASS, line.evidence
    assert "east: drill d1 (region-blackout, 24.0h ago) passed" in line.evidence
    assert "degradation_order (in drill d2 (region-blackout, 2.0d ago))" in line.evidence
    assert not line.todo


def test_a_drill_that_did_not_measure_or_failed_a_criterion_fails() -> None:
    line = d.check_drills(facts(drills=pb.DrillsResponse(runs=[run(criteria=BLACKOUT)])))
    assert line.verdict is V.FAIL
    assert "no drill of the week measured degradation_order" in line.evidence
    assert "latency-injection" in line.todo
    bad = run(passed=False, failed=["prewarm_attainment"], criteria=BLACKOUT + LATENCY)
    line = d.check_drills(facts(drills=pb.DrillsResponse(runs=[bad])))
    assert line.verdict is V.FAIL and "failed prewarm_attainment" in line.evidence
    # an older failure is not the answer once a newer drill measured it again
    older = run(
        id="d0", ago_s=3 * DAY, passed=False, failed=["prewarm_attainment"], criteria=BLACKOUT
    )
    fixed = [run(criteria=BLACKOUT + LATENCY), older]
    assert d.check_drills(facts(drills=pb.DrillsResponse(runs=fixed))).verdict is V.PASS


def test_drills_without_their_criteria_list_are_unknown_unless_one_failed() -> None:
    line = d.check_drills(facts(drills=pb.DrillsResponse(runs=[run()])))
    assert line.verdict is V.UNKNOWN and "24.0h ago" in line.evidence
    assert "which criteria it judged" in line.evidence
    old = run(passed=False, failed=["degradation_order"])  # no criteria: an older service
    line = d.check_drills(facts(drills=pb.DrillsResponse(runs=[old])))
    assert line.verdict is V.FAIL and "failed degradation_order" in line.evidence
    assert d.check_drills(facts(drills="UNAVAILABLE")).verdict is V.UNKNOWN


# ---- 6. the degradation-order test in CI ---------------------------------------------
def repo(**kw: object) -> d.RepoFacts:
    fields: dict[str, object] = {
        "root": "/r",
        "order_test": "RUNBOOK = ... 'runbooks' / 'degradation.yaml'",
        "ci_script": "exec .venv/bin/pytest -q",
        "ci_entry": "exec scripts/test.sh",
        "testpaths": ("tests",),
        "ladder_steps": ("spec_off", "context_cap"),
        "ladder_sha256": "ab" * 32,
    }
    fields.update(kw)
    return d.RepoFacts(**fields)  # type: ignore[arg-type]


def deployed(sha: str = "ab" * 32, steps: tuple[str, ...] = ("spec_off", "context_cap")) -> d.Facts:
    status = pb.StatusResponse(
        regions=[unit()], responder="cp-a", ladder_sha256=sha, ladder_steps=list(steps)
    )
    return dataclasses.replace(facts(repo=repo()), status=status)


def test_ladder_ci_unknown_without_a_repository_or_the_deployed_ladder() -> None:
    assert d.check_ladder_ci(facts()).verdict is V.UNKNOWN
    line = d.check_ladder_ci(facts(repo=repo()))  # an older control plane: no digest
    assert line.verdict is V.UNKNOWN and "spec_off > context_cap" in line.evidence
    assert "reports no ladder" in line.evidence


def test_ladder_ci_passes_with_the_deployed_ladder_the_checkouts() -> None:
    line = d.check_ladder_ci(deployed())
    assert line.verdict is V.PASS, line.evidence
    assert "cp-a runs the checkout's runbooks/degradation.yaml" in line.evidence
    other = d.check_ladder_ci(deployed(sha="cd" * 32, steps=("spec_off",)))
    assert other.verdict is V.FAIL and "steps spec_off vs spec_off > context_cap" in other.evidence


def test_ladder_ci_fails_without_the_test_or_with_a_foreign_step() -> None:
    assert d.check_ladder_ci(facts(repo=repo(order_test=None))).verdict is V.FAIL
    assert d.check_ladder_ci(facts(repo=repo(testpaths=("tests/unit",)))).verdict is V.FAIL
    stepped = unit(degradation_steps=["shed_everything"])
    line = d.check_ladder_ci(facts([stepped], repo=repo()))
    assert line.verdict is V.FAIL and "shed_everything" in line.evidence


def test_this_checkout_runs_the_order_test_in_ci() -> None:
    root = find_repo(Path(__file__).resolve().parent)
    assert root == REPO
    facts_ = read_repo(REPO)
    assert facts_.ladder_steps, facts_.ladder_error
    assert facts_.ladder_sha256 == load_ladder(REPO / "runbooks/degradation.yaml").digest
    line = d.check_ladder_ci(facts(repo=facts_))
    assert "runs in CI" in line.evidence and line.verdict is V.UNKNOWN


def test_the_ladder_digest_is_of_the_ladder_not_of_its_text() -> None:
    path = REPO / "runbooks/degradation.yaml"
    text = path.read_text()
    ladder = parse_ladder(yaml.safe_load(text))
    assert parse_ladder(yaml.safe_load("# a comment\n" + text)).digest == ladder.digest
    data = yaml.safe_load(text)
    data["steps"] = data["steps"][:-1]
    assert parse_ladder(data).digest != ladder.digest


# ---- 7. capacity ---------------------------------------------------------------------
def test_capacity_measured_of_the_engine_running_passes_stale_or_typed_fails() -> None:
    line = d.check_capacity(facts([unit(engine_version="0.11.0")]))
    assert line.verdict is V.PASS
    assert "measured 2.0h ago on engine 0.11.0, the one it runs" in line.evidence
    stale = unit(capacity=bearing(source="stale", reason="measured 20.0 days ago (max 14)"))
    line = d.check_capacity(facts([stale, unit("west", engine_version="0.11.0")]))
    assert line.verdict is V.FAIL and "east: stale: measured 20.0 days ago" in line.evidence
    upgraded = d.check_capacity(facts([unit(engine_version="0.11.0, 0.12.0")]))
    assert upgraded.verdict is V.FAIL and "it runs 0.11.0, 0.12.0" in upgraded.evidence


def test_capacity_the_scalers_guard_found_short_since_its_probe_fails() -> None:
    # the guard tripped right after a scale-down to 3, an hour after the probe (2 h ago)
    lesson = GuardLesson(at=NOW - 3600, active=3, load_rps=80.0, hit_rate=0.5)
    scale = with_scale(scale_record(lesson=lesson), scale_record("west"))
    us = [unit(engine_version="0.11.0"), unit("west", engine_version="0.11.0")]
    line = d.check_capacity(facts(us, scale=scale))
    assert line.verdict is V.FAIL
    assert "east: measured 2.0h ago, but since then the scaler's guard found 3 ACTIVE short" in (
        line.evidence
    )
    assert "west: measured 2.0h ago on engine 0.11.0, the one it runs" in line.evidence
    assert "failoverctl capacity probe" in line.todo
    older = with_scale(scale_record(lesson=lesson.model_copy(update={"at": NOW - 9000})))
    assert d.check_capacity(facts(us[:1], scale=older)).verdict is V.PASS  # probed since


def test_capacity_not_compared_with_the_engine_running_is_unknown() -> None:
    line = d.check_capacity(facts([unit(capacity=bearing(engine_version=""))]))
    assert line.verdict is V.UNKNOWN and "recorded no engine version" in line.evidence
    line = d.check_capacity(facts([unit()]))  # no agent report of what runs
    assert line.verdict is V.UNKNOWN and "reports no engine version running" in line.evidence


# ---- 8. budget -----------------------------------------------------------------------
RULES = (REPO / "runbooks/alerts/tectonic-alerts.yaml").read_text(encoding="utf-8")


def pool_cost(
    name: str = "east", dollars: float = 8.0, budget: float | None = 40.0, **kw: object
) -> PoolCost:
    fields: dict[str, object] = {
        "unit": name,
        "zone": "us",
        "active": 2,
        "warm": 0,
        "lent": 0,
        "dollars_per_hour": dollars,
        "budget": budget,
        "utilisation": None if budget is None else dollars / budget,
        "efficiency": 0.8,
    }
    fields.update(kw)
    return PoolCost.model_validate(fields)


def cost(
    *pools: PoolCost, zone: float | None = 120.0, fleet: float | None = None
) -> pb.CostResponse:
    spent = sum(p.dollars_per_hour for p in pools)
    scopes = [
        ScopeCost(
            scope="zone",
            name="us",
            dollars_per_hour=spent,
            budget=zone,
            utilisation=None if zone is None else spent / zone,
        ),
        ScopeCost(
            scope="fleet",
            name="fleet",
            dollars_per_hour=spent,
            budget=fleet,
            utilisation=None if fleet is None else spent / fleet,
        ),
    ]
    report = CostReport(at=NOW, pools=pools, scopes=tuple(scopes))
    return pb.CostResponse(report_json=encode(report), generated_at=NOW)


def test_budget_unknown_only_without_a_cost_section() -> None:
    line = d.check_budget(facts(cost=pb.CostResponse(), rules=RULES))
    assert line.verdict is V.UNKNOWN and "no cost: section" in line.evidence
    assert "cost:" in line.todo
    assert d.check_budget(facts(cost="UNAVAILABLE")).verdict is V.UNKNOWN


def test_budget_passes_with_the_alerts_and_under_budget() -> None:
    line = d.check_budget(facts(cost=cost(pool_cost()), rules=RULES, rules_source="rules.yaml"))
    assert line.verdict is V.PASS, line.evidence
    assert "TectonicBudgetBinding, TectonicPoolEfficiencyLow in rules.yaml" in line.evidence
    assert "east: $8.00/h of $40.00/h (20%)" in line.evidence
    assert "zone us: $8.00/h of $120.00/h (7%)" in line.evidence
    # the week's history is Prometheus's, and the line says so
    assert "tectonic_budget_utilisation" in line.evidence and not line.todo


def test_budget_fails_without_its_alerts() -> None:
    rules = RULES.replace("alert: TectonicPoolEfficiencyLow", "alert: Renamed")
    line = d.check_budget(facts(cost=cost(pool_cost()), rules=rules, rules_source="r"))
    assert line.verdict is V.FAIL and "r lacks TectonicPoolEfficiencyLow" in line.evidence
    assert d.check_budget(facts(cost=cost(pool_cost()))).verdict is V.UNKNOWN  # no rules


def test_budget_over_fails_unless_a_lift_or_a_failover_allows_it() -> None:
    over = pool_cost(dollars=48.0)
    line = d.check_budget(facts(cost=cost(over), rules=RULES))
    assert (
        line.verdict is V.FAIL and "east: $48.00/h of $40.00/h (120%): over budget" in line.evidence
    )
    allowed = pool_cost(dollars=48.0, exempt="failover target from west, 60 s of 1800 s")
    assert d.check_budget(facts(cost=cost(allowed), rules=RULES)).verdict is V.PASS
    lift = BudgetLift(unit="east", reason="INC-1: launch", actor="ana", at=NOW - 60, until=NOW + 60)
    lifted = d.check_budget(facts(cost=cost(pool_cost(dollars=48.0, lift=lift)), rules=RULES))
    assert lifted.verdict is V.PASS and "budget lifted by ana" in lifted.evidence
    # a zone over its budget fails too, unless one of its pools is allowed past it
    zone = d.check_budget(facts(cost=cost(pool_cost(budget=None), zone=4.0), rules=RULES))
    assert zone.verdict is V.FAIL and "zone us" in zone.evidence
    ok = cost(pool_cost(budget=None, exempt="lifted"), zone=4.0)
    assert d.check_budget(facts(cost=ok, rules=RULES)).verdict is V.PASS


# ---- 9. readiness --------------------------------------------------------------------
def readiness(*rs: pb.RegionReadiness) -> pb.ReadinessResponse:
    return pb.ReadinessResponse(regions=list(rs))


def test_readiness_pass_fail_and_override() -> None:
    ok = pb.RegionReadiness(region="east", has_verdict=True, passed=True, drill="d1", at=NOW - 60)
    line = d.check_readiness(facts(readiness=readiness(ok)))
    assert line.verdict is V.PASS and "passed drill d1 (60s ago)" in line.evidence
    over = pb.RegionReadiness(
        region="east",
        has_verdict=True,
        passed=False,
        drill="d2",
        at=NOW - 3 * DAY,
        override_reason="INC-77: harness bug",
        override_actor="ana",
        override_at=NOW - DAY,
    )
    line = d.check_readiness(facts(readiness=readiness(over)))
    assert line.verdict is V.FAIL and "override in force by ana" in line.evidence
    barred = pb.RegionReadiness(region="east", has_verdict=True, drill="d3", barred=True)
    assert d.check_readiness(facts(readiness=readiness(barred))).verdict is V.FAIL
    never = pb.RegionReadiness(region="east")
    assert "never drilled" in d.check_readiness(facts(readiness=readiness(never))).evidence
    assert d.check_readiness(facts(readiness="UNAVAILABLE")).verdict is V.UNKNOWN


# ---- 10. engine versions -------------------------------------------------------------
def test_engine_versions_from_the_capacity_reason() -> None:
    assert d.check_engine(facts()).verdict is V.UNKNOWN
    mixed = "measured on engine '0.8.5', the region runs '0.8.5, 0.9.0'"
    line = d.check_engine(facts([unit(capacity=bearing(source="stale", reason=mixed))]))
    assert line.verdict is V.FAIL and "0.8.5, 0.9.0" in line.evidence
    one = "measured on engine '0.8.5', the region runs '0.9.0'"
    assert d.check_engine(facts([unit(capacity=bearing(reason=one))])).verdict is V.PASS


def test_engine_versions_from_the_agents_report() -> None:
    line = d.check_engine(facts([unit(engine_version="0.11.0")]))
    assert line.verdict is V.PASS and "every up replica runs 0.11.0" in line.evidence
    line = d.check_engine(facts([unit(engine_version="0.10.2, 0.11.0")]))
    assert line.verdict is V.FAIL and "0.10.2, 0.11.0" in line.evidence
    assert "rolling upgrade" in line.todo
    unknown = d.check_engine(facts([unit()]))
    assert unknown.verdict is V.UNKNOWN and "no engine version" in unknown.evidence


# ---- the whole -----------------------------------------------------------------------
def test_every_question_answers_once_in_order_with_evidence() -> None:
    lines = d.diagnose(facts())
    assert [x.id for x in lines] == list(range(1, 11))
    assert all(x.evidence for x in lines)
    assert all(x.todo for x in lines if x.verdict is not V.PASS)
    assert set(lines[0].as_dict()) == {"id", "question", "verdict", "evidence", "todo"}


def test_region_filter_keeps_a_region_and_its_pools() -> None:
    us = [unit("east"), unit("east.chat", pool_of="east"), unit("west")]
    f = facts(us, region="east")
    assert [u.name for u in d.units(f)] == ["east", "east.chat"]
    assert d.regions(f) == ["east"]
    line = d.check_capacity(f)
    assert "west" not in line.evidence


def test_exit_code() -> None:
    ok = d.Line(1, "q", V.PASS, "e")
    unknown = d.Line(2, "q", V.UNKNOWN, "e", "do")
    bad = d.Line(3, "q", V.FAIL, "e", "do")
    assert d.exit_code([ok]) == 0
    assert d.exit_code([ok, unknown]) == 1
    assert d.exit_code([ok, unknown], allow_unknown=True) == 0
    assert d.exit_code([ok, unknown, bad], allow_unknown=True) == 1


def test_age_text_uses_the_given_clock() -> None:
    assert d.age_text(NOW, NOW - 30) == "30s ago"
    assert d.age_text(NOW, NOW - 3 * DAY) == "3.0d ago"
    assert d.age_text(NOW, 0.0) == "at an unrecorded time"


# ---- the command, on a fake control plane --------------------------------------------
class FakeStub:
    """Answers doctor's reads; ListDrills fails, as an RPC a role may not read."""

    def GetStatus(self, req: object, timeout: float) -> pb.StatusResponse:
        return pb.StatusResponse(regions=[unit(engine_version="0.11.0")], generated_at=NOW)

    def GetCapacity(self, req: object, timeout: float) -> pb.CapacityResponse:
        return with_capacity(capacity_record())

    def GetScale(self, req: object, timeout: float) -> pb.ScaleResponse:
        return with_scale(scale_record())

    def GetCost(self, req: object, timeout: float) -> pb.CostResponse:
        return cost(pool_cost())

    def GetReadiness(self, req: object, timeout: float) -> pb.ReadinessResponse:
        return readiness(pb.RegionReadiness(region="east", has_verdict=True, passed=True))

    def ListDrills(self, req: object, timeout: float) -> pb.DrillsResponse:
        from controlplane.cli.client import EXIT_REFUSED, CliError

        raise CliError("permission denied: drills", EXIT_REFUSED)


class FakeClient:
    timeout_s = 1.0

    def __init__(self, *args: object, **kw: object) -> None:
        pass

    def call(self, fn: object) -> object:
        return fn(FakeStub())  # type: ignore[operator]


def test_the_command_prints_every_line_and_exits_by_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    from typer.testing import CliRunner

    from controlplane.cli import failoverctl

    monkeypatch.setattr(failoverctl, "Client", FakeClient)
    monkeypatch.chdir(REPO)
    runner = CliRunner()
    got = runner.invoke(failoverctl.app, ["doctor", "--json"])
    assert got.exit_code == 1, got.output
    body = json.loads(got.stdout)
    assert [c["id"] for c in body["checks"]] == list(range(1, 11)) and body["exit_code"] == 1
    by_id = {c["id"]: c for c in body["checks"]}
    assert by_id[5]["verdict"] == "UNKNOWN" and "permission denied" in by_id[5]["evidence"]
    assert by_id[7]["verdict"] == "PASS" and by_id[9]["verdict"] == "PASS"
    assert by_id[8]["verdict"] == "PASS", by_id[8]  # the checkout's rules, GetCost's report
    assert "runs in CI" in by_id[6]["evidence"]
    text = runner.invoke(failoverctl.app, ["doctor", "--region", "east"])
    assert text.exit_code == 1
    assert len([x for x in text.stdout.splitlines() if x[:7].strip() in set(V)]) == 10
    bad = runner.invoke(failoverctl.app, ["doctor", "--region", "nowhere"])
    assert bad.exit_code == 2


# ---- --prometheus: questions 2 and 8 over the history Prometheus holds ----------------
PROM = "http://prom:9090"


def prom(
    activation: dict[str, d.PromActivation] | str | None = None,
    budget: dict[tuple[str, str], d.PromBudget] | str | None = None,
) -> d.PromFacts:
    return d.PromFacts(
        url=PROM,
        activation={} if activation is None else activation,
        budget={} if budget is None else budget,
    )


@pytest.mark.parametrize(("p95", "verdict"), [(0.4, V.PASS), (0.6, V.FAIL)])
def test_wake_p95_over_the_days_prometheus_holds(p95: float, verdict: d.Verdict) -> None:
    """Prometheus's p95 decides, not the agent's last wakes (here the other way)."""
    u = unit(signals={"activation_p95_s": 1.0 - p95})
    seen = {"east": d.PromActivation(p95_s=p95, wakes=12, seen_s=3 * DAY)}
    line = d.check_activation(
        facts([u], capacity=with_capacity(capacity_record(ttft=1.5)), prom=prom(seen))
    )
    assert line.verdict is verdict, line.evidence
    assert f"east: wake p95 {p95:.2f} s" in line.evidence
    assert "over 12 wake(s) in the 3.0d Prometheus holds (of 90d asked)" in line.evidence
    assert f"from Prometheus at {PROM}" in line.evidence
    assert "last 32 wakes" not in line.evidence


def test_wake_p95_unknown_where_prometheus_holds_no_wake() -> None:
    cap = with_capacity(capacity_record(ttft=1.5))
    u = unit(signals={"activation_p95_s": 0.1})
    none = d.check_activation(facts([u], capacity=cap, prom=prom({})))
    assert none.verdict is V.UNKNOWN and "Prometheus holds no" in none.evidence
    assert "--prometheus" in none.todo
    idle = {"east": d.PromActivation(p95_s=None, wakes=0, seen_s=600)}
    line = d.check_activation(facts([u], capacity=cap, prom=prom(idle)))
    assert line.verdict is V.UNKNOWN
    assert "east: no wake in the 10m Prometheus holds (of 90d asked)" in line.evidence


def test_wake_p95_with_prometheus_unreachable_is_no_pass_and_keeps_a_fail() -> None:
    cap = with_capacity(capacity_record(ttft=1.5))
    down = prom("unreachable: connection refused", "unreachable: connection refused")
    ok = d.check_activation(
        facts([unit(signals={"activation_p95_s": 0.1})], capacity=cap, prom=down)
    )
    assert ok.verdict is V.UNKNOWN and "not 90 days" in ok.evidence
    assert f"Prometheus at {PROM} could not answer: unreachable" in ok.evidence
    slow = d.check_activation(
        facts([unit(signals={"activation_p95_s": 0.9})], capacity=cap, prom=down)
    )
    assert slow.verdict is V.FAIL  # the wakes measured are over the budget already


def test_budget_week_from_prometheus_fails_over_one() -> None:
    report = cost(pool_cost(), fleet=200.0)
    under = {
        ("pool", "east"): d.PromBudget(max_utilisation=0.8, seen_s=7 * DAY),
        ("zone", "us"): d.PromBudget(max_utilisation=0.3, seen_s=7 * DAY),
        ("fleet", "fleet"): d.PromBudget(max_utilisation=0.1, seen_s=45),
    }
    line = d.check_budget(facts(cost=report, rules=RULES, prom=prom(budget=under)))
    assert line.verdict is V.PASS, line.evidence
    assert "east: at most 80% of its budget in the 7.0d Prometheus holds (of 7d asked)" in (
        line.evidence
    )
    assert "fleet: at most 10% of its budget in the 45s Prometheus holds" in line.evidence
    assert "zone us: at most 30%" in line.evidence
    assert f"the week's from Prometheus at {PROM}" in line.evidence
    over = dict(under) | {("pool", "east"): d.PromBudget(max_utilisation=1.3, seen_s=DAY)}
    bad = d.check_budget(facts(cost=report, rules=RULES, prom=prom(budget=over)))
    assert bad.verdict is V.FAIL and "east: at most 130% of its budget" in bad.evidence
    assert "over budget" in bad.evidence and "audit" in bad.todo
    assert "not known" in bad.evidence  # no tectonic_budget_allowed: an older leader
    # the same peak while a lift or a failover's allowance let it: a pass that says so
    allowed = dict(under) | {
        ("pool", "east"): d.PromBudget(max_utilisation=1.3, seen_s=DAY, max_unallowed=0.9)
    }
    ok = d.check_budget(facts(cost=report, rules=RULES, prom=prom(budget=allowed)))
    assert ok.verdict is V.PASS, ok.evidence
    assert "east: at most 130% of its budget" in ok.evidence
    assert "only under a lift or a failover's allowance (at most 90% otherwise)" in ok.evidence
    # over it outside any allowance too: a fail that says how far
    both = dict(under) | {
        ("pool", "east"): d.PromBudget(max_utilisation=1.3, seen_s=DAY, max_unallowed=1.1)
    }
    no = d.check_budget(facts(cost=report, rules=RULES, prom=prom(budget=both)))
    assert no.verdict is V.FAIL and "110% with no lift or failover's allowance" in no.evidence
    # a budgeted scope Prometheus holds nothing of: not a pass
    missing = {k: v for k, v in under.items() if k != ("fleet", "fleet")}
    gap = d.check_budget(facts(cost=report, rules=RULES, prom=prom(budget=missing)))
    assert gap.verdict is V.UNKNOWN and "fleet: Prometheus holds no" in gap.evidence


def test_budget_week_unknown_when_prometheus_errs_and_now_still_judged() -> None:
    err = prom(budget="bad_data: parse error")
    line = d.check_budget(facts(cost=cost(pool_cost()), rules=RULES, prom=err))
    assert line.verdict is V.UNKNOWN
    assert f"Prometheus at {PROM} could not answer: bad_data: parse error" in line.evidence
    assert "east: $8.00/h of $40.00/h (20%)" in line.evidence and "--prometheus" in line.todo
    over = d.check_budget(facts(cost=cost(pool_cost(dollars=48.0)), rules=RULES, prom=err))
    assert over.verdict is V.FAIL  # over budget now fails, whatever the history


def test_span_text() -> None:
    assert [d.span_text(x) for x in (None, 5, 600, 3 * 3600, 90 * DAY)] == [
        "an unknown span",
        "5s",
        "10m",
        "3.0h",
        "90.0d",
    ]
