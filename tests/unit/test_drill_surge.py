"""The scaler's drills, without a lab: the ``surge`` fault as a scenario file says it
(and refuses it), the surge's shape, the traffic generator's open-loop arrivals against
a real HTTP server, and each criterion (pure functions over samples, requests and
audit entries), failing with what failed and by how much."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from chaos.drills.measure_scaling import (
    RequestLog,
    ScaleEvent,
    SurgeWindow,
    in_surges,
    scale_backs,
    slo_attainment,
    still_grown,
    surge_criteria,
    ttft_p99_s,
    unaudited_scale_changes,
)
from chaos.drills.result import RegionSample, Sample
from chaos.drills.scenario import (
    SCENARIO_DIR,
    FaultKind,
    Measurements,
    Scenario,
    describe_fault,
    load_scenario,
)
from chaos.drills.traffic import REGION_HEADER, Traffic, surge_rps

STEADY = {"probes": [{"probe": "leader"}]}
SURGE = {"action": "surge", "rate": 6, "ramp_s": 10, "duration_s": 20}


def scenario(**fields: Any) -> Scenario:
    data: dict[str, Any] = {
        "name": "s",
        "title": "t",
        "region": "us-east",
        "steady_state": STEADY,
        "faults": [SURGE],
        **fields,
    }
    return Scenario.model_validate(data)


# ---- the scenario files -------------------------------------------------------------------
def test_the_shipped_surge_scenarios_load_with_their_criteria() -> None:
    for name in ("traffic-surge", "surge-during-failover"):
        s = load_scenario(SCENARIO_DIR / f"{name}.yaml")
        assert s.name == name and len(s.surges) == 1
        m = s.measure
        assert m.max_ttft_p99_s and m.min_slo_attainment and m.scale_audited
        assert m.scaled_back_within_s


def test_a_surge_fault_is_parsed_and_described() -> None:
    s = scenario().bind()  # {region}: the drill's target
    (f,) = s.surges
    assert f.action is FaultKind.SURGE and f.rate == 6 and f.surge_s == 40
    assert describe_fault(f) == (
        "surge us-east's offered load to 6x over 10s, held 20s, down over 10s"
    )


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"action": "surge", "duration_s": 20}, "surge needs `rate`"),
        ({"action": "surge", "rate": 6}, "surge needs duration_s > 0"),
        ({"action": "surge", "rate": 1, "duration_s": 20}, "greater than 1"),
        ({"action": "surge", "rate": 6, "duration_s": 20, "ramp_s": -1}, "greater than or equal"),
        ({"action": "stop_region", "rate": 2}, "only for surge, not stop_region"),
    ],
)
def test_a_bad_surge_is_refused_with_a_clear_error(fault: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        scenario(faults=[fault], rollbacks=[{"action": "start_region"}])


def test_a_surge_is_no_rollback_and_surge_criteria_need_a_surge() -> None:
    with pytest.raises(ValidationError, match="surge is a fault, not a rollback"):
        scenario(rollbacks=[SURGE])
    with pytest.raises(ValidationError, match="the scenario needs a surge fault"):
        scenario(
            faults=[{"action": "kill_leader"}],
            rollbacks=[{"action": "start_controlplanes"}],
            measure={"scaled_back_within_s": 30},
        )
    # the audit criterion needs no surge: any drill may ask every size audited
    assert scenario(measure={"scale_audited": True}).measure.scale_audited


# ---- the surge's shape and its traffic ----------------------------------------------------
def test_the_surge_rises_holds_and_falls_back_to_its_base() -> None:
    shape = [surge_rps(2.0, 6.0, 10.0, 20.0, t) for t in (-1, 0, 5, 10, 25, 30, 35, 40, 50)]
    assert shape == [2.0, 2.0, 7.0, 12.0, 12.0, 12.0, 7.0, 2.0, 2.0]
    assert surge_rps(2.0, 6.0, 0.0, 5.0, 1.0) == 12.0  # no ramp: a step


async def test_a_surge_sends_seeded_open_loop_arrivals_into_its_region() -> None:
    """Against a real HTTP server: a base of 10 req/s (5 sessions every 0.5 s) surged
    to 3x for 1 s with 0.5 s ramps: about 20 extra arrivals/s held, 10/s averaged on the
    ramps, ~40 in all; the same seed sends the same count."""
    seen: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers["x-session-id"])
        return web.json_response({"choices": []}, headers={REGION_HEADER: "us-east"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    counts = []
    async with TestServer(app) as server:
        for _ in range(2):
            traffic = Traffic({"us-east": str(server.make_url(""))}, interval_s=0.5, seed=3)
            traffic.add(5, ["us-east"])
            assert traffic.base_rps("us-east") == 10.0
            await traffic.start()
            seen.clear()
            counts.append(await traffic.surge("us-east", 3.0, 0.5, 1.0))
            await traffic.stop()
            surged = [sid for sid in seen if sid.startswith("surge-")]
            assert len(surged) == counts[-1]  # the sessions' own requests beside them
            assert len(traffic.requests) == len(seen)
            assert all(r.home == "us-east" and r.first_byte_s is not None for r in traffic.requests)
    assert counts[0] == counts[1] and 15 <= counts[0] <= 80


# ---- the criteria -------------------------------------------------------------------------
def sample(t: float, **units: tuple[int | None, int | None, int | None]) -> Sample:
    """Per unit: (ACTIVE published, desired ACTIVE, desired WARM)."""
    return Sample(
        t=t,
        regions={
            u: RegionSample(
                state="NORMAL", health="HEALTHY", active=a, desired_active=d, desired_warm=w
            )
            for u, (a, d, w) in units.items()
        },
    )


WINDOW = SurgeWindow("us-east", 10.0, 40.0)


def test_p99_and_attainment_are_over_the_surged_regions_requests_in_the_window() -> None:
    requests = [RequestLog(float(t), "us-east", 0.1) for t in range(10, 40)]
    requests += [RequestLog(20.0, "us-east", 3.0), RequestLog(21.0, "us-east", None)]
    requests += [RequestLog(5.0, "us-east", 9.0), RequestLog(20.0, "us-west", 9.0)]  # outside
    during = in_surges(requests, [WINDOW])
    assert len(during) == 32
    assert ttft_p99_s(during) == 3.0  # the failed one is no latency, the slow one is the p99
    assert slo_attainment(during, 1.5) == 30 / 32  # ... but both missed the SLO
    assert ttft_p99_s([]) is None and slo_attainment([], 1.5) is None
    # a region names its pools
    assert in_surges([RequestLog(20.0, "us-east.chat", 0.1)], [WINDOW])


def test_a_size_change_without_its_audit_entry_is_named() -> None:
    samples = [
        sample(0, **{"us-east": (2, 2, 1)}),
        sample(1, **{"us-east": (2, 4, 1)}),
        sample(2, **{"us-east": (4, 4, 1)}),
        sample(30, **{"us-east": (4, 2, 1)}),
    ]
    audited = [ScaleEvent(0.6, "us-east", 4, 1), ScaleEvent(29.5, "us-east", 2, 1)]
    assert unaudited_scale_changes(samples, audited) == []
    missing = unaudited_scale_changes(samples, audited[:1])
    assert missing == ["us-east 4+1 -> 2+1 (t=2.0-30.0s)"]
    # an entry of other sizes, or another unit's, audits nothing
    assert len(unaudited_scale_changes(samples, [ScaleEvent(0.6, "us-west", 4, 1)])) == 2


def test_a_pool_that_grew_must_be_back_at_its_pre_surge_count_in_time() -> None:
    samples = [
        sample(5, **{"us-east": (2, 2, 1), "us-west": (2, 2, 1)}),
        sample(20, **{"us-east": (5, 5, 1), "us-west": (2, 2, 1)}),
        sample(45, **{"us-east": (5, 5, 1), "us-west": (2, 2, 1)}),
        sample(70, **{"us-east": (2, 2, 1), "us-west": (2, 2, 1)}),
    ]
    (back,) = scale_backs(samples, WINDOW)  # us-west never grew: not judged
    assert (back.unit, back.before, back.peak, back.back_after_s) == ("us-east", 2, 5, 30.0)
    assert still_grown(samples[:3], [WINDOW]) == ["us-east"]
    assert still_grown(samples, [WINDOW]) == []

    def judged(within_s: float, upto: int = 4) -> tuple[bool, str, str]:
        m = Measurements(scaled_back_within_s=within_s)
        (c,) = surge_criteria(m, samples[:upto], [], [WINDOW], [])
        return c.passed, c.measured, c.detail

    assert judged(45) == (True, "us-east 2 -> 5 -> 2 30s after", "")
    assert judged(20) == (False, "us-east 2 -> 5 -> 2 30s after", "us-east over by 10.0s")
    assert judged(45, upto=3) == (
        False,
        "us-east 2 -> 5 -> not back",
        "us-east still above 2 ACTIVE at the end",
    )


def test_the_verdict_says_which_surge_criterion_failed_and_by_how_much() -> None:
    m = Measurements(max_ttft_p99_s=1.5, min_slo_attainment=0.95, scale_audited=True)
    fast = [RequestLog(float(t), "us-east", 0.2) for t in range(10, 40)]
    slow = [RequestLog(float(t), "us-east", 2.5) for t in range(10, 20)]
    ok = {c.name: c for c in surge_criteria(m, [], fast, [WINDOW], [])}
    assert all(c.passed for c in ok.values())
    assert set(ok) == {"surge_ttft_p99", "slo_attainment", "scale_audited"}
    bad = {c.name: c for c in surge_criteria(m, [], fast + slow, [WINDOW], [])}
    assert not bad["surge_ttft_p99"].passed and bad["surge_ttft_p99"].measured == "2.500s"
    assert bad["surge_ttft_p99"].detail.startswith("over by 1.000s;")
    assert not bad["slo_attainment"].passed
    assert bad["slo_attainment"].measured == "75.0% (30 of 40)"
    assert bad["slo_attainment"].detail.startswith("short by 20.0%;")
    # no request in the window: nothing measured is no pass
    empty = {c.name: c for c in surge_criteria(m, [], [], [WINDOW], [])}
    assert not empty["surge_ttft_p99"].passed and not empty["slo_attainment"].passed
