"""The steady-state hypothesis's probes, and where a drill starts judging sessions."""

from __future__ import annotations

from chaos.drills.measure import probes_hold
from chaos.drills.result import RegionSample, Sample
from chaos.drills.scenario import Probe, SteadyState, find_scenario
from chaos.drills.traffic import Traffic
from chaos.drills.verdict import session_logs


def sample(**states: str) -> Sample:
    return Sample(
        t=1.0,
        leader="cp-1",
        regions={r: RegionSample(state=st, health="HEALTHY") for r, st in states.items()},
    )


def test_regions_state_holds_only_when_every_region_is_in_the_state() -> None:
    hyp = SteadyState(probes=(Probe(probe="regions_state", state="NORMAL"),))
    assert probes_hold(hyp, sample(east="NORMAL", west="NORMAL")) == (True, "")
    ok, why = probes_hold(hyp, sample(east="NORMAL", west="RECOVERED"))
    assert not ok and why == "not every region NORMAL: west RECOVERED"
    assert probes_hold(hyp, sample()) == (False, "not every region NORMAL: no state")


def test_the_blackout_waits_for_every_region_not_only_its_target() -> None:
    """A region still failing over when the drill begins moves sessions the blackout
    did not: the shipped blackout's steady state holds only with every region NORMAL."""
    hyp = find_scenario("region-blackout").bind("us-east").steady_state
    ok, why = probes_hold(hyp, sample(**{"us-east": "NORMAL", "us-central": "FAILING_OVER"}))
    assert not ok and "us-central FAILING_OVER" in why


def test_a_session_is_judged_from_its_mark_on() -> None:
    """The drill marks each session's request count once the steady state held; a
    move before the mark (a region settling) is not in the logs the verdict judges."""
    traffic = Traffic({"east": "http://127.0.0.1:9"}, interval_s=1.0)
    (s,) = traffic.add(1, ["east"])
    s.log.extend([(10.0, "west"), (11.0, "east"), (12.0, "east")])
    (log,) = session_logs(traffic, {s.conversation: 1}, mono0=10.0)
    assert log.answers == ((1.0, "east"), (2.0, "east"))
