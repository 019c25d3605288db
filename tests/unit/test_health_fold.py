"""Quorum and hysteresis of the health fold (pure, fake clock)."""

from __future__ import annotations

from controlplane.core.health import fold_health, quorum_verdict
from controlplane.kernel.model import Health, HealthReport, ObserverKind, RegionHealth
from tests.unit.world import topology

T = topology().timing


def rep(obs: str, h: Health, at: float = 100.0, region: str = "us-east") -> HealthReport:
    return HealthReport(
        region=region, observer=obs, kind=ObserverKind(obs.split(":")[0]), health=h, received_at=at
    )


def test_one_observer_down_is_unknown_not_unhealthy() -> None:
    votes = [rep("agent:a", Health.HEALTHY), rep("probe:cp", Health.UNHEALTHY)]
    assert quorum_verdict(votes, quorum=2) is Health.UNKNOWN


def test_quorum_of_down_votes_is_unhealthy() -> None:
    votes = [
        rep("agent:a", Health.UNHEALTHY),
        rep("probe:cp", Health.UNHEALTHY),
        rep("gateway:g1", Health.HEALTHY),
    ]
    assert quorum_verdict(votes, quorum=2) is Health.UNHEALTHY


def test_down_votes_that_do_not_outnumber_up_votes_are_unknown() -> None:
    votes = [
        rep("gateway:g1", Health.UNHEALTHY),
        rep("gateway:g2", Health.UNHEALTHY),
        rep("agent:a", Health.HEALTHY),
        rep("probe:cp", Health.HEALTHY),
    ]
    assert quorum_verdict(votes, quorum=2) is Health.UNKNOWN


def test_no_votes_is_unknown_and_agent_alone_can_say_degraded() -> None:
    assert quorum_verdict([], quorum=2) is Health.UNKNOWN
    votes = [rep("agent:a", Health.DEGRADED), rep("probe:cp", Health.HEALTHY)]
    assert quorum_verdict(votes, quorum=2) is Health.DEGRADED
    votes = [
        rep("gateway:g", Health.DEGRADED),
        rep("probe:cp", Health.HEALTHY),
        rep("agent:a", Health.HEALTHY),
    ]
    assert quorum_verdict(votes, quorum=2) is Health.HEALTHY


def _run(seq: list[list[HealthReport]], start: RegionHealth | None = None) -> list[Health]:
    h = start or RegionHealth(region="us-east", verdict=Health.HEALTHY)
    out = []
    for i, reports in enumerate(seq):
        h = fold_health(h, reports, 100.0 + i, T)
        out.append(h.verdict)
    return out


def test_needs_failure_threshold_bad_evaluations_in_a_row() -> None:
    down = lambda t: [rep("agent:a", Health.UNHEALTHY, t), rep("probe:cp", Health.UNHEALTHY, t)]  # noqa: E731
    up = lambda t: [rep("agent:a", Health.HEALTHY, t), rep("probe:cp", Health.HEALTHY, t)]  # noqa: E731
    seq = [down(100), down(101), up(102), down(103), down(104), down(105)]
    verdicts = _run(seq)
    assert verdicts == [
        Health.HEALTHY,
        Health.HEALTHY,
        Health.HEALTHY,
        Health.HEALTHY,
        Health.HEALTHY,
        Health.UNHEALTHY,
    ]


def test_needs_success_threshold_good_evaluations_to_come_back() -> None:
    up = lambda t: [rep("agent:a", Health.HEALTHY, t), rep("probe:cp", Health.HEALTHY, t)]  # noqa: E731
    start = RegionHealth(region="us-east", verdict=Health.UNHEALTHY, bad_streak=5)
    assert _run([up(100), up(101), up(102)], start) == [
        Health.UNHEALTHY,
        Health.HEALTHY,
        Health.HEALTHY,
    ]  # success_threshold = 2


def test_stale_reports_do_not_vote() -> None:
    old = [rep("agent:a", Health.UNHEALTHY, 10.0), rep("probe:cp", Health.UNHEALTHY, 10.0)]
    h = fold_health(RegionHealth(region="us-east", verdict=Health.HEALTHY), old, 100.0, T)
    assert h.raw is Health.UNKNOWN and h.votes == {}


def test_the_region_runs_the_engine_its_agents_last_said() -> None:
    def agent(obs: str, version: str, at: float) -> HealthReport:
        return rep(obs, Health.HEALTHY, at).model_copy(update={"engine_version": version})

    prev = RegionHealth(region="us-east", verdict=Health.HEALTHY)
    reports = [
        agent("agent:a", "0.11.0", 99.0),
        agent("agent:b", "0.12.0", 99.5),  # the later word wins
        agent("agent:c", "", 99.8),  # one that does not know says nothing
        rep("gateway:g1", Health.HEALTHY, 99.9).model_copy(update={"engine_version": "x"}),
    ]
    assert fold_health(prev, reports, 100.0, T).engine_version == "0.12.0"
    # Stale votes do not count: nobody knows, "" (not judged).
    assert fold_health(prev, reports, 100.0 + T.report_stale_s + 1, T).engine_version == ""
