"""Admission control's bound from the measured capacity: Little's law over the probe's
recorded in-flight (regions/dataplane/admission_bound.py), the staleness rule and the
flag that overrides it (regions/dataplane/capacity_bounds.py), the limiter following a
new bound, and both command lines' admission flags."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaos.capacity.results import Outcome, RequestResult, mean_inflight
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import (
    CapacityRecord,
    HitProbe,
    ProbeStep,
    WorkloadProfile,
)
from controlplane.kernel.codec import encode
from controlplane.kernel.config import load_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import RegionHealth
from controlplane.kernel.store.memory import MemoryStore
from regions.dataplane.admission_bound import BoundAt, InflightBound, inflight_at, inflight_bound
from regions.dataplane.admission_gate import AdmissionGates, AdmissionOptions
from regions.dataplane.admission_limit import AdmissionLimiter, Grant, LimitConfig, Priority
from regions.dataplane.capacity_bounds import CapacityBounds, region_bound
from regions.dataplane.metrics import DataPlaneMetrics
from regions.gateway.__main__ import parse_args as gateway_args
from regions.picker.__main__ import parse_args as picker_args

TOPOLOGY = "examples/topology.yaml"
NOW = 1_790_000_000.0


def step(rps: float, inflight: float | None) -> ProbeStep:
    return ProbeStep(
        offered_rps=rps,
        p99_ttft_s=0.1,
        error_rate=0.0,
        throughput_rps=rps,
        duration_s=5.0,
        mean_inflight=inflight,
    )


def probe(hit_rate: float, ultimate: float, steps: list[ProbeStep]) -> HitProbe:
    return HitProbe(
        hit_rate=hit_rate,
        baseline_p99_s=0.1,
        ultimate_rps=ultimate,
        ultimate_bounded=True,
        steps=tuple(steps),
    )


def record(
    probes: tuple[HitProbe, ...], *, r_base: float = 10.0, beta: float = 0.8, fos: float = 2.0
) -> CapacityRecord:
    return CapacityRecord(
        region="us-east",
        measured_at=NOW - 3600,
        engine_version="0.32.0",
        replica="http://127.0.0.1:9001",
        slo=CapacitySLO(ttft_p99_s=1.0),
        factor_of_safety=fos,
        probes=probes,
        r_base_rps=r_base,
        beta=beta,
        profile=WorkloadProfile(
            prompt_tokens_p50=100, prompt_tokens_p90=200, output_tokens=16, shared_prefix_share=0.5
        ),
    )


# cold: 10 rps ultimate, 0.8 s per request there (8 in flight); warm (h 0.5): 16.7 rps,
# 0.6 s (10 in flight)
COLD = probe(0.0, 10.0, [step(2.5, 1.5), step(5.0, 3.5), step(10.0, 8.0), step(15.0, 30.0)])
WARM = probe(0.5, 50 / 3, [step(5.0, 2.5), step(50 / 3, 10.0), step(25.0, 40.0)])


def test_the_bound_is_the_rate_times_the_hold_time_at_the_cold_probe_by_default() -> None:
    bound = inflight_bound(record((COLD, WARM)))
    assert isinstance(bound, InflightBound)
    assert bound.hit_rate == 0.0 and bound.rate_rps == pytest.approx(10.0)
    assert bound.hold_s == pytest.approx(0.8) and bound.limit == 8


def test_at_a_hit_rate_between_the_probes_the_hold_time_is_interpolated() -> None:
    bound = inflight_bound(record((COLD, WARM)), hit_rate=0.25)
    assert isinstance(bound, InflightBound)
    # R(0.25) = 10 / (1 - 0.2) = 12.5 rps; hold halfway between 0.8 and 0.6 s
    assert bound.rate_rps == pytest.approx(12.5) and bound.hold_s == pytest.approx(0.7)
    assert bound.limit == math.ceil(12.5 * 0.7)
    # past the warmest probe the hold time is the warmest's
    high = inflight_bound(record((COLD, WARM)), hit_rate=0.9)
    assert isinstance(high, InflightBound) and high.hold_s == pytest.approx(0.6)


def test_at_the_allowed_rate_the_in_flight_there_counts() -> None:
    bound = inflight_bound(record((COLD, WARM)), at=BoundAt.ALLOWED)
    assert isinstance(bound, InflightBound)
    # allowed 5 rps, where 3.5 were in flight: 0.7 s each
    assert bound.rate_rps == pytest.approx(5.0) and bound.hold_s == pytest.approx(0.7)
    assert bound.limit == 4


def test_a_record_without_in_flight_figures_gives_no_bound_and_says_why() -> None:
    old = probe(0.0, 10.0, [step(5.0, None), step(10.0, None)])
    why = inflight_bound(record((old,)))
    assert isinstance(why, str) and "no in-flight figures" in why
    # a probe whose steps stop below its ultimate cannot say the in-flight there
    short = probe(0.0, 10.0, [step(5.0, 3.0)])
    why = inflight_bound(record((short,)))
    assert isinstance(why, str) and "ultimate rate" in why


def test_the_bound_is_at_least_one() -> None:
    tiny = probe(0.0, 1.0, [step(1.0, 0.05)])
    bound = inflight_bound(record((tiny,), r_base=1.0, beta=0.0))
    assert isinstance(bound, InflightBound) and bound.limit == 1


@given(
    st.lists(
        st.tuples(st.floats(0.1, 100.0), st.floats(0.0, 100.0)),
        min_size=1,
        max_size=8,
        unique_by=lambda p: round(p[0], 3),
    ),
    st.floats(0.01, 100.0),
)
def test_the_in_flight_between_steps_lies_between_theirs(
    points: list[tuple[float, float]], rate: float
) -> None:
    steps = [step(r, i) for r, i in points]
    got = inflight_at(steps, rate)
    rates = sorted(r for r, _ in points)
    if rate > rates[-1] * (1 + 1e-9):
        assert got is None
        return
    assert got is not None
    lower = [i for r, i in points if r <= rate]
    upper = [i for r, i in points if r >= rate]
    if not lower:  # below the lowest step: scaled down from it
        assert 0 <= got <= max(upper) + 1e-9
    else:
        near = sorted(points)
        lo = max(p for p in near if p[0] <= rate)
        # a rate within rounding above the top step is the top step's
        hi = min((p for p in near if p[0] >= rate), default=near[-1])
        assert min(lo[1], hi[1]) - 1e-9 <= got <= max(lo[1], hi[1]) + 1e-9


def test_the_probes_mean_in_flight_is_littles_law_over_the_step() -> None:
    def result(sent: float, done: float) -> RequestResult:
        return RequestResult(
            planned_s=sent,
            sent_s=sent,
            first_token_s=sent + 0.1,
            done_s=done,
            outcome=Outcome.OK,
            status=200,
            detail="",
            prompt_tokens=1,
            generated_tokens=1,
            cached_tokens=None,
            url="http://r",
        )

    # 4 requests over 2 s, each held 1 s: 2 at once on average
    results = [result(0.0, 1.0), result(0.5, 1.5), result(1.0, 2.0), result(1.5, 2.5)]
    assert mean_inflight(results, 2.0) == pytest.approx(2.0)
    assert mean_inflight([], 2.0) == 0.0
    with pytest.raises(ValueError):
        mean_inflight(results, 0.0)


def test_a_fresh_record_bounds_a_stale_one_does_not_and_no_record_says_so() -> None:
    topo = load_topology(TOPOLOGY)
    fresh = record((COLD, WARM))
    bound = region_bound("us-east", fresh, topo, NOW)
    assert isinstance(bound, InflightBound) and bound.limit == 8
    late = NOW + topo.capacity.max_age_s + 1
    stale = region_bound("us-east", fresh, topo, late)
    assert isinstance(stale, str) and "stale" in stale and "days ago" in stale
    assert region_bound("us-east", None, topo, NOW) == "no capacity record"


def test_a_record_of_another_engine_than_the_region_runs_does_not_bound() -> None:
    topo = load_topology(TOPOLOGY)
    fresh = record((COLD, WARM))  # probed on 0.32.0
    same = region_bound("us-east", fresh, topo, NOW, engine_version="0.32.0")
    assert isinstance(same, InflightBound)
    assert isinstance(region_bound("us-east", fresh, topo, NOW, engine_version=""), InflightBound)
    other = region_bound("us-east", fresh, topo, NOW, engine_version="0.33.0")
    assert isinstance(other, str) and "stale" in other and "'0.33.0'" in other


async def test_the_gateway_reads_each_regions_engine_from_its_health_and_unbounds() -> None:
    """The leader's regions/<r>/health says which engine the region runs; at a recheck
    the gateway reads it, and a probe of another engine no longer bounds (before, only
    age made a record stale here, while the planner already called it stale)."""
    topo = load_topology(TOPOLOGY)
    store, keys = MemoryStore(), Keys(topo.cluster)
    zones = {r.name: r.zone for r in topo.regions}
    gates = AdmissionGates(AdmissionOptions(enabled=True), topo, DataPlaneMetrics(zones))
    bounds = CapacityBounds(store, keys, topo, gates, wall=lambda: NOW)
    gate = gates.gate("us-east")
    assert gate is not None
    bounds.apply_bound("us-east", record((COLD, WARM)))
    assert gate.limiter.config.max_limit == 8
    health = RegionHealth(region="us-east", engine_version="0.33.0")
    await store.put(keys.region_health("us-east"), encode(health))
    await store.put(keys.region_health("eu-west"), b"not json")  # kept as unknown, logged
    await bounds.read_engines()
    assert bounds.engines == {"us-east": "0.33.0"}
    bounds.apply_bound("us-east", record((COLD, WARM)))
    assert gate.limiter.config.max_limit is None
    await store.close()
    await bounds.read_engines()  # etcd away: the last read stands
    assert bounds.engines == {"us-east": "0.33.0"}


def test_the_limiter_follows_a_new_bound_down_at_once_and_up_by_answers() -> None:
    lim = AdmissionLimiter(LimitConfig(target_s=1.0), ["a"])
    assert lim.limits() == {"a": 16.0}
    lim.set_max_limit(4, 0.0)
    assert lim.limits() == {"a": 4.0}
    grants = [lim.acquire(Priority.INTERACTIVE, ["a"], 0.0)[0] for _ in range(5)]
    assert [type(g).__name__ for g in grants].count("Grant") == 4
    lim.set_max_limit(8, 0.0)
    assert lim.limits() == {"a": 4.0}  # not a jump: answers grow it
    first = grants[0]
    assert isinstance(first, Grant)
    lim.observe(first, 0.1, 0.1)
    assert 4.0 < lim.limits()["a"] <= 8.0
    lim.set_max_limit(None, 0.2)
    assert lim.config.max_limit is None
    with pytest.raises(ValueError):
        lim.set_max_limit(0, 0.3)


def test_both_command_lines_read_the_admission_flags_alike() -> None:
    flags = ["--topology", TOPOLOGY, "--region", "us-east", "--admission"]
    picker, _ = picker_args([*flags, "--admission-bound-at", "allowed"])
    gateway, _ = gateway_args([*flags, "--admission-max-inflight", "6"])
    p, g = picker.routing.admission, gateway.admission
    assert p.enabled and p.bound_at is BoundAt.ALLOWED and p.max_inflight is None
    assert p.max_queue_wait_s == 0.5  # under Envoy's 1 s ext_proc message_timeout
    assert g.enabled and g.bound_at is BoundAt.ULTIMATE and g.max_inflight == 6
    assert g.max_queue_wait_s == 1.0
    off, _ = picker_args(flags[:-1])
    assert not off.routing.admission.enabled


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--admission-max-inflight", "0"], "--admission-max-inflight must be positive"),
        (["--admission-bound-at", "knee"], "invalid choice: 'knee'"),
        (["--admission-interactive-share", "1"], "--admission-interactive-share must be"),
    ],
)
def test_bad_admission_flags_are_refused_naming_the_flag(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        picker_args(["--topology", TOPOLOGY, "--region", "us-east", *flags])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_the_operators_max_inflight_wins_over_the_measured_bound() -> None:
    topo = load_topology(TOPOLOGY)
    zones = {r.name: r.zone for r in topo.regions}
    flagged = AdmissionGates(
        AdmissionOptions(enabled=True, max_inflight=6), topo, DataPlaneMetrics(zones)
    )
    flagged.set_max_inflight("us-east", 3)
    gate = flagged.gate("us-east")
    assert gate is not None and gate.limiter.config.max_limit == 6
    measured = AdmissionGates(AdmissionOptions(enabled=True), topo, DataPlaneMetrics(zones))
    measured.set_max_inflight("us-east", 3)
    measured.set_max_inflight("nowhere", 3)  # not a region of the topology: ignored
    gate = measured.gate("us-east")
    assert gate is not None and gate.limiter.config.max_limit == 3
