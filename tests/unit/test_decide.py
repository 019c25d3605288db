"""The reconcile tick end to end on the pure world with a fake clock."""

from __future__ import annotations

import pytest

from controlplane.core.steps import pending_steps
from controlplane.kernel.drills import DrillLock
from controlplane.kernel.model import (
    PAUSE_DEFAULT_S,
    PAUSE_MAX_S,
    AuditAction,
    Cause,
    ControlFlags,
    FailoverStep,
    Health,
    Intent,
    IntentKind,
    Readiness,
    RegionHold,
    RegionState,
    pause_length,
)
from tests.unit.world import World

REGIONS = ("us-east", "us-west", "us-central", "eu-west")


def run(w: World, ticks: int, health: dict[str, Health] | None = None) -> None:
    for _ in range(ticks):
        for r in REGIONS:
            w.all_report(r, (health or {}).get(r, Health.HEALTHY))
        w.tick()


def test_confirmed_down_region_fails_over_and_routing_moves_in_one_write() -> None:
    w = World()
    run(w, 3)
    assert all(w.state(r) == "NORMAL" for r in REGIONS)
    run(w, 2, {"us-east": Health.UNHEALTHY})
    assert w.state("us-east") == "NORMAL"  # 2 bad evaluations < failure_threshold 3
    run(w, 1, {"us-east": Health.UNHEALTHY})
    assert w.state("us-east") == "FAILING_OVER"
    assert set(w.targets("us-east")) == {"us-west", "us-central"}
    # Hard down: the switch goes in the very transaction of the transition, and the
    # pre-warm of the targets starts as a job, recorded by the tick its end wakes.
    [write] = [x for r in w.results for x in r.writes if x.region == "us-east" and x.decision]
    assert write.failover_steps == (FailoverStep.SWITCH,)
    [tick] = [r for r in w.results if write in r.writes]
    assert [j.kind.value for j in tick.jobs] == ["failover_prewarm"]
    rec = w.records["us-east"][0]
    assert rec.failover is not None and rec.failover.done == (
        FailoverStep.SWITCH,
        FailoverStep.PREWARM,
    )
    actions = [a.action for a in w.audit]
    assert actions.count("transition") == 1 and actions.count("routing_switch") == 1
    d = rec.last_decision
    assert d is not None and (d.from_state, d.to_state, d.trigger) == (
        RegionState.NORMAL,
        RegionState.FAILING_OVER,
        "fail_over",
    )


def test_one_unreachable_observer_never_fails_a_region_over() -> None:
    w = World()
    for _ in range(10):
        for r in REGIONS:
            w.report(r, "agent:" + r, Health.HEALTHY)
            w.report(
                r, "probe:controlplane", Health.UNHEALTHY if r == "us-east" else Health.HEALTHY
            )
        w.tick()
    assert w.state("us-east") == "NORMAL"
    assert w.health["us-east"].verdict is Health.UNKNOWN


def test_recovery_is_graduated_and_completes_to_normal() -> None:
    w = World()
    run(w, 3)
    run(w, 3, {"us-east": Health.UNHEALTHY})
    assert w.state("us-east") == "FAILING_OVER"
    run(w, 3)  # healthy again, but recovery_dwell_s = 5 not yet reached
    assert w.state("us-east") == "FAILING_OVER"
    run(w, 4)
    assert w.state("us-east") == "RECOVERED"
    homes = []
    for _ in range(12):
        run(w, 1)
        homes.append(w.targets("us-east").get("us-east", 0.0))
    assert w.state("us-east") == "NORMAL" and w.targets("us-east") == {"us-east": 1.0}
    steps = sorted(set(homes))
    assert steps[:4] == [0.0, 0.25, 0.5, 0.75] and steps[-1] == 1.0  # 25 % steps every 2 s


def test_relapse_during_recovery_fails_over_again_without_cooldown() -> None:
    w = World()
    run(w, 3)
    run(w, 3, {"us-east": Health.UNHEALTHY})
    run(w, 8)
    assert w.state("us-east") == "RECOVERED"
    run(w, 3, {"us-east": Health.UNHEALTHY})
    assert w.state("us-east") == "FAILING_OVER"
    assert w.targets("us-east").get("us-east", 0.0) == 0.0


def test_degraded_then_restored_after_dwell() -> None:
    w = World()
    run(w, 2)
    run(w, 1, {"us-west": Health.DEGRADED})
    assert w.state("us-west") == "DEGRADED"
    run(w, 3)
    assert w.state("us-west") == "DEGRADED"  # dwell 5 s
    run(w, 4)
    assert w.state("us-west") == "NORMAL"


def test_pause_stops_automation_but_not_operator_intents() -> None:
    w = World()
    run(w, 2)
    w.control = ControlFlags(paused=True, reason="maintenance")
    run(w, 5, {"us-east": Health.UNHEALTHY})
    assert w.state("us-east") == "NORMAL"
    w.intents["i1"] = Intent(
        id="i1",
        kind=IntentKind.FAILOVER,
        region="us-west",
        targets=("us-central",),
        reason="drain",
        actor="alice",
        created_at=w.now,
    )
    run(w, 1, {"us-east": Health.UNHEALTHY})
    assert w.state("us-west") == "FAILING_OVER" and w.targets("us-west") == {"us-central": 1.0}
    assert "i1" not in w.intents
    rec = w.records["us-west"][0]
    assert rec.failover is not None and rec.failover.plan.warm_first  # manual: warm first
    assert rec.failover.done == (FailoverStep.PREWARM, FailoverStep.SWITCH)


def test_a_pause_ends_at_its_until_audited_and_automation_acts_again() -> None:
    w = World()
    run(w, 2)
    w.control = ControlFlags(paused=True, reason="INC-9", actor="alice", at=w.now, until=w.now + 10)
    run(w, 9, {"us-east": Health.UNHEALTHY})
    assert w.state("us-east") == "NORMAL" and w.control.paused  # held while in force
    assert not any(r.control for r in w.results)
    run(w, 1, {"us-east": Health.UNHEALTHY})  # now at until: it ends, and the tick acts
    [tick] = [r for r in w.results if r.control is not None]
    assert w.state("us-east") == "FAILING_OVER" and not w.control.paused
    assert tick.control is not None and "alice" in tick.control.audit.reason
    assert "INC-9" in tick.control.audit.reason and "automation resumed" in tick.summary()
    resumes = [e for e in w.audit if e.action is AuditAction.RESUME]
    assert len(resumes) == 1 and resumes[0].actor == "cp-test"
    run(w, 3, {"us-east": Health.UNHEALTHY})
    assert len([e for e in w.audit if e.action is AuditAction.RESUME]) == 1  # said once


def test_a_pause_without_an_until_holds_until_a_resume() -> None:
    """Written before pauses expired (no ``until``): it keeps its meaning."""
    w = World()
    run(w, 2)
    w.control = ControlFlags(paused=True, reason="old", at=w.now - 10 * 86400)
    run(w, 5, {"us-east": Health.UNHEALTHY})
    assert w.state("us-east") == "NORMAL" and w.control.paused
    assert not any(r.control for r in w.results)


def test_a_hold_keeps_one_unit_as_it_is_while_the_others_carry_on() -> None:
    w = World()
    run(w, 2)
    w.holds["us-east"] = RegionHold(
        unit="us-east", reason="INC-7", actor="alice", at=w.now, until=w.now + 10
    )
    bad = {"us-east": Health.UNHEALTHY, "us-west": Health.UNHEALTHY}
    run(w, 5, bad)
    assert w.state("us-east") == "NORMAL" and w.state("us-west") == "FAILING_OVER"
    said = [n for r in w.results for n in r.notes if n.startswith("us-east kept")]
    assert said and "held by alice: INC-7" in said[-1]  # a held-back move is said
    assert "us-east" in w.holds and not any(r.releases for r in w.results)
    run(w, 5, bad)  # the hold's end passes: released, audited, and automation acts
    assert "us-east" not in w.holds and w.state("us-east") == "FAILING_OVER"
    [release] = [e for e in w.audit if e.action is AuditAction.RELEASE]
    assert release.region == "us-east" and release.actor == "cp-test"
    assert "alice" in release.reason and "INC-7" in release.reason
    assert any("hold released" in r.summary() for r in w.results)


def test_a_hold_on_a_unit_at_rest_says_nothing_each_tick() -> None:
    w = World()
    w.holds["eu-west"] = RegionHold(unit="eu-west", reason="r", actor="a", at=0, until=9e9)
    run(w, 4)
    assert not any(n.startswith("eu-west") for r in w.results for n in r.notes)
    assert w.results[-1].summary() == "no change" and "eu-west" in w.holds


def test_each_transition_names_its_cause_in_the_record_and_the_audit() -> None:
    """A drill's lock on a region makes the leader's moves of it the drill's; an
    operator's intent is manual; the rest is automatic (docs: runbooks/README.md)."""
    w = World()
    run(w, 2)
    w.intents["i1"] = Intent(
        id="i1",
        kind=IntentKind.FAILOVER,
        region="us-central",
        targets=("us-west",),
        reason="drain",
        actor="alice",
        created_at=w.now,
    )
    run(w, 1)
    w.drill = DrillLock(
        holder="drills-1",
        scenario="region-blackout",
        region="us-east",
        trigger="scheduled",
        started_at=w.now,
        lease=7,
    )
    run(w, 3, {"us-east": Health.UNHEALTHY, "eu-west": Health.DEGRADED})
    causes = {
        e.region: e.decision.cause
        for e in w.audit
        if e.action is AuditAction.TRANSITION and e.decision is not None
    }
    assert causes == {
        "us-central": Cause.MANUAL,
        "us-east": Cause.DRILL,
        "eu-west": Cause.AUTOMATIC,
    }
    for region, cause in causes.items():
        last = w.records[region][0].last_decision
        assert last is not None and last.cause == cause
    w.drill = None  # the drill is over: its region's next move is the leader's own
    run(w, 12)
    last = w.records["us-east"][0].last_decision
    assert last is not None and last.to_state is not RegionState.FAILING_OVER
    assert last.cause == Cause.AUTOMATIC


def test_pause_lengths_are_bounded() -> None:
    assert pause_length(0) == PAUSE_DEFAULT_S and pause_length(60) == 60
    for bad in (-1.0, PAUSE_MAX_S + 1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="7 days"):
            pause_length(bad)


def test_refused_intent_is_dropped_and_audited_with_the_reason() -> None:
    w = World()
    run(w, 2)
    w.intents["i2"] = Intent(
        id="i2",
        kind=IntentKind.FAILOVER,
        region="us-east",
        targets=("eu-west",),
        reason="try",
        actor="bob",
        created_at=w.now,
    )
    run(w, 1)
    assert "i2" not in w.intents and w.state("us-east") == "NORMAL"
    assert w.audit[-1].result.startswith("refused:") and "zone" in w.audit[-1].result


def test_manual_recovery_intent() -> None:
    w = World()
    run(w, 2)
    w.intents["f"] = Intent(
        id="f", kind=IntentKind.FAILOVER, region="us-east", reason="x", actor="a", created_at=w.now
    )
    run(w, 1)
    w.intents["r"] = Intent(
        id="r",
        kind=IntentKind.RECOVER,
        region="us-east",
        reason="fixed",
        actor="a",
        created_at=w.now,
    )
    run(w, 1)
    assert w.state("us-east") == "RECOVERED"


def test_a_half_done_failover_resumes_at_the_missing_step() -> None:
    w = World()
    run(w, 2)
    w.intents["f"] = Intent(
        id="f", kind=IntentKind.FAILOVER, region="us-east", reason="x", actor="a", created_at=w.now
    )
    # Decide but apply only the transition, as if the leader died before any step.
    w.now += 1
    from controlplane.core.decide import decide

    res = decide(w.snapshot(), w.topo, "old-leader")
    assert w.apply(res.writes[0])
    rec = w.records["us-east"][0]
    assert pending_steps(rec) == (FailoverStep.PREWARM, FailoverStep.SWITCH)
    run(w, 1)  # a new leader's tick
    rec = w.records["us-east"][0]
    assert pending_steps(rec) == ()
    assert [a.action for a in w.audit].count("routing_switch") == 1
    assert [a.action for a in w.audit].count("transition") == 1


def test_cooldown_blocks_a_second_automatic_failover() -> None:
    w = World()
    run(w, 2)
    run(w, 3, {"us-east": Health.UNHEALTHY})
    run(w, 8)
    for _ in range(12):
        run(w, 1)
    assert w.state("us-east") == "NORMAL"
    run(w, 4, {"us-east": Health.UNHEALTHY})  # within the 60 s cooldown
    assert w.state("us-east") == "NORMAL"
    assert any("cooldown" in n for res in w.results[-3:] for n in res.notes)


def test_intents_for_every_region_in_one_tick_leave_one_serving() -> None:
    """Found by the property test: plans made in one tick must see each other."""
    w = World()
    run(w, 2)
    for r in REGIONS:
        w.intents[r] = Intent(
            id=r,
            kind=IntentKind.FAILOVER,
            region=r,
            reason="x",
            actor="a",
            force=r == "eu-west",
            targets=("us-east",) if r == "eu-west" else (),
            created_at=w.now,
        )
    run(w, 1)
    assert any(w.state(r) != "FAILING_OVER" for r in REGIONS)
    refused = [a for a in w.audit if a.result.startswith("refused")]
    assert refused and all("last healthy" in a.result or "no eligible" in a.result for a in refused)


def test_a_manual_failover_is_not_undone_by_automation() -> None:
    w = World()
    run(w, 10)  # long healthy: the verdict's "since" is far in the past
    w.intents["d"] = Intent(
        id="d",
        kind=IntentKind.FAILOVER,
        region="us-west",
        reason="drain",
        actor="a",
        created_at=w.now,
    )
    run(w, 30)
    assert w.state("us-west") == "FAILING_OVER"  # stays drained until an operator recovers it
    w.intents["r"] = Intent(
        id="r",
        kind=IntentKind.RECOVER,
        region="us-west",
        reason="done",
        actor="a",
        created_at=w.now,
    )
    run(w, 1)
    assert w.state("us-west") == "RECOVERED"


def test_recovery_dwell_counts_from_the_failover_not_from_an_old_verdict() -> None:
    w = World()
    run(w, 3)
    run(w, 3, {"us-east": Health.UNHEALTHY})
    failed_at = w.now
    # Healthy again at once; the dwell (5 s) must run from the failover onwards.
    run(w, 4)
    assert w.state("us-east") == "FAILING_OVER"
    run(w, 3)
    assert w.state("us-east") == "RECOVERED" and w.now - failed_at >= 5


def test_a_failed_drill_drains_the_region_and_holds_it_until_a_pass_or_override() -> None:
    w = World()
    run(w, 3)
    w.readiness["us-east"] = Readiness(passed=False, drill="d-1", at=w.now)
    run(w, 1)
    assert w.state("us-east") == "FAILING_OVER"  # barred: its traffic moves away
    rec = w.records["us-east"][0]
    assert rec.failover is not None and rec.failover.plan.warm_first  # like a drain
    assert "barred" in rec.reason and "d-1" in rec.reason
    assert "us-east" not in w.targets("us-east")
    run(w, 20)  # healthy all along, yet no recovery while barred
    assert w.state("us-east") == "FAILING_OVER"
    w.readiness["us-east"] = Readiness(
        passed=False, drill="d-1", at=w.now, override_reason="fixed the auth proxy"
    )
    run(w, 20)
    assert w.state("us-east") == "NORMAL" and w.targets("us-east") == {"us-east": 1.0}


def test_a_barred_region_keeps_its_traffic_when_no_target_may_take_it() -> None:
    w = World()
    run(w, 3)
    for r in REGIONS:
        w.readiness[r] = Readiness(passed=False, drill="d-2", at=w.now)
    result = w.tick()
    assert all(w.state(r) == "NORMAL" for r in REGIONS)  # never route into barred regions
    assert any("barred" in n and "keeps its traffic" in n for n in result.notes)
