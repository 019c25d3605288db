"""Graduated recovery's traffic guard and its pre-warm step, on the pure world with a
fake clock (``controlplane.core.recovery``; docs/architecture.md §3, §5).

The world's recovery: 25 % steps every 2 s; ticks of 1 s. The guard here: first-token
p99 over 1.5 x a 0.5 s baseline (0.75 s), or an error rate over 2 %.
"""

from __future__ import annotations

from controlplane.core.actions import JobKind
from controlplane.core.recovery import (
    PREWARM_GRACE_S,
    MoveKind,
    guard_breaches,
    next_recovery_move,
)
from controlplane.core.steps import recovery_pending
from controlplane.kernel.config import RecoveryConfig
from controlplane.kernel.ladder.file import load_ladder, recovery_config
from controlplane.kernel.model import (
    AuditAction,
    Health,
    PrewarmFigures,
    RecoveryProgress,
    RecoveryStep,
)
from tests.unit.world import World, topology

REGIONS = ("us-east", "us-west", "us-central", "eu-west")
HOME = "us-east"
SPIKE = {"ttft_p99_s": 2.0}
CALM = {"ttft_p99_s": 0.3}


def guarded_world(**recovery: object) -> World:
    cfg = {"step_percent": 25, "step_interval_s": 2, "baseline_ttft_p99_s": 0.5, **recovery}
    topo = topology()
    return World(topo=topo.model_copy(update={"recovery": RecoveryConfig.model_validate(cfg)}))


def tick(w: World, n: int = 1, health: Health = Health.HEALTHY, **signals: float) -> None:
    """``n`` ticks of 1 s; the home region's agent reports ``signals``."""
    for _ in range(n):
        for r in REGIONS:
            if r == HOME:
                w.all_report(r, health, load_rps=10.0, **signals)
            else:
                w.all_report(r, Health.HEALTHY, load_rps=10.0)
        w.tick()


def home(w: World) -> float:
    return w.targets(HOME).get(HOME, 0.0)


def recovered(w: World) -> None:
    tick(w, 3)
    tick(w, 3, Health.UNHEALTHY)
    assert w.state(HOME) == "FAILING_OVER"
    tick(w, 7)
    assert w.state(HOME) == "RECOVERED" and home(w) == 0.0


def actions(w: World, name: str) -> list[str]:
    return [a.reason for a in w.audit if a.action == name]


def test_spike_steps_back_once_holds_then_calm_resumes_forward() -> None:
    w = guarded_world()
    recovered(w)
    tick(w, 4, **CALM)
    assert home(w) == 0.5  # two steps home
    tick(w, 1, **SPIKE)
    assert home(w) == 0.25  # the last step re-applied: one increment back
    [guard] = [a for a in w.audit if a.action == "recovery_guard"]
    assert guard.details["ttft_p99_s"] == "2" and guard.details["ttft_p99_s_threshold"] == "0.75"
    assert "1.5 x baseline 0.5s" in guard.reason and "stepped back to step 1/4" in guard.reason
    rec = w.records[HOME][0]
    assert rec.recovery is not None and rec.recovery.held and rec.recovery.guard_at == w.now
    tick(w, 1, **SPIKE)  # still spiking within the interval: held, not stepped back again
    assert home(w) == 0.25 and len(actions(w, "recovery_guard")) == 1
    tick(w, 2, **CALM)  # calm for 1 s then 2 s: calm since the first calm tick
    assert home(w) == 0.25
    tick(w, 1, **CALM)  # calm for one interval (2 s): the next step forward
    assert home(w) == 0.5
    rec = w.records[HOME][0]
    assert rec.recovery is not None and not rec.recovery.held and rec.recovery.guard_at is None
    assert actions(w, "recovery_step")[-1].endswith("resumed after 2s calm")
    tick(w, 4, **CALM)
    assert w.state(HOME) == "NORMAL" and w.targets(HOME) == {HOME: 1.0}


def test_a_lasting_spike_steps_back_at_most_once_per_interval() -> None:
    w = guarded_world()
    recovered(w)
    tick(w, 6, **CALM)
    assert home(w) == 0.75
    weights = []
    for _ in range(5):
        tick(w, 1, **SPIKE)
        weights.append(home(w))
    # t+0 back to 0.5; t+1 held; t+2 (one interval later, still breaching) 0.25; ...
    assert weights == [0.5, 0.5, 0.25, 0.25, 0.0]
    assert len(actions(w, "recovery_guard")) == 3


def test_spikes_that_come_and_go_within_the_interval_step_back_only_once() -> None:
    w = guarded_world(step_interval_s=4)
    recovered(w)
    tick(w, 8, **CALM)
    assert home(w) == 0.5
    for signals in (SPIKE, CALM, SPIKE, CALM):
        tick(w, 1, **signals)
    assert home(w) == 0.25 and len(actions(w, "recovery_guard")) == 2  # a step back + a spike
    rec = w.records[HOME][0].recovery
    assert rec is not None and rec.calm_since == w.now  # calm counts from the last spike
    tick(w, 3, **CALM)
    assert home(w) == 0.25
    tick(w, 1, **CALM)
    assert home(w) == 0.5


def test_the_guard_never_steps_below_zero_nor_fails_the_region_over() -> None:
    w = guarded_world()
    recovered(w)
    tick(w, 2, **CALM)
    assert home(w) == 0.25
    tick(w, 8, error_rate=0.2)
    assert home(w) == 0.0 and w.state(HOME) == "RECOVERED"
    assert set(w.targets(HOME)) == {"us-west", "us-central"}  # the failed-over routing
    assert sum(w.targets(HOME).values()) == 1.0
    reasons = actions(w, "recovery_guard")
    assert "error rate 20.00% > 2.00%" in reasons[0]
    assert all("paused at 0 %" in r for r in reasons[1:])
    tick(w, 3, **CALM)
    assert home(w) == 0.25  # calm for one interval: forward from 0 again


def test_an_unhealthy_verdict_still_relapses_while_the_guard_holds() -> None:
    w = guarded_world()
    recovered(w)
    tick(w, 4, **CALM)
    tick(w, 1, **SPIKE)
    assert w.state(HOME) == "RECOVERED" and home(w) == 0.25
    tick(w, 3, Health.UNHEALTHY, **SPIKE)
    assert w.state(HOME) == "FAILING_OVER" and home(w) == 0.0


def test_signals_before_the_first_step_are_the_prewarms_and_not_guarded() -> None:
    w = guarded_world()
    recovered(w)
    tick(w, 2, **SPIKE)  # replays' cold prefills at home, no user traffic there yet
    assert home(w) == 0.25 and not actions(w, "recovery_guard")


def test_without_a_baseline_first_token_latency_is_not_guarded() -> None:
    w = guarded_world(baseline_ttft_p99_s=None)
    recovered(w)
    tick(w, 2, **CALM)
    tick(w, 2, **SPIKE)
    assert home(w) == 0.5 and not actions(w, "recovery_guard")
    tick(w, 1, error_rate=0.05)  # the error guard is on by default
    assert home(w) == 0.25


def test_recovery_prewarm_runs_before_the_first_step_and_is_recorded() -> None:
    w = guarded_world()
    w.recovery_result = PrewarmFigures(prefixes_total=12.0, prefixes_warmed=12.0)
    recovered(w)
    rec = w.records[HOME][0]
    assert rec.recovery is not None and rec.recovery.planned == (RecoveryStep.PREWARM,)
    assert rec.recovery.done == (RecoveryStep.PREWARM,)
    assert rec.recovery.prewarm_result.prefixes_warmed == 12.0
    [entry] = [a for a in w.audit if a.action == "recovery_prewarm"]
    assert entry.result == "ok" and entry.details["prefixes_warmed"] == "12"
    assert any(j.kind is JobKind.RECOVERY_PREWARM for r in w.results for j in r.jobs)
    tick(w, 2)
    assert home(w) == 0.25


def test_a_failed_prewarm_is_recorded_and_recovery_goes_on() -> None:
    w = guarded_world()
    w.recovery_result = PrewarmFigures(prefixes_total=12.0, targets_unreachable=1.0)
    recovered(w)
    [entry] = [a for a in w.audit if a.action == "recovery_prewarm"]
    assert entry.result.startswith("failed")
    tick(w, 2)
    assert home(w) == 0.25


def test_a_prewarm_that_never_reports_is_given_up_after_its_budget() -> None:
    w = guarded_world()
    w.run_recovery_steps = False  # the leader's pre-warm task is stuck
    recovered(w)
    rec = w.records[HOME][0]
    assert recovery_pending(rec) == (RecoveryStep.PREWARM,)
    budget = w.topo.prewarm.budget_s + PREWARM_GRACE_S
    tick(w, int(budget) - 2)
    assert home(w) == 0.0  # waiting for the pre-warm, never stepping without it
    tick(w, 3)
    [entry] = [a for a in w.audit if a.action == "recovery_prewarm"]
    assert entry.result == "abandoned" and entry.details["abandoned"] == "1"
    assert recovery_pending(w.records[HOME][0]) == ()
    tick(w, 1)  # the interval since recovery began is long over: the first step at once
    assert home(w) == 0.25


def test_no_prewarm_step_when_switched_off() -> None:
    w = guarded_world(prewarm=False)
    recovered(w)
    rec = w.records[HOME][0]
    assert rec.recovery is not None and rec.recovery.planned == ()
    assert not any(j.kind is JobKind.RECOVERY_PREWARM for r in w.results for j in r.jobs)


def test_move_is_pure_and_headroom_is_relative_to_capacity() -> None:
    cfg = RecoveryConfig(guard_headroom_under=0.2, guard_error_rate_over=None)
    [b] = guard_breaches(cfg, HOME, {"load_rps": 90.0}, capacity_rps=100.0)
    assert b.signal == "headroom_fraction" and b.threshold == 0.2
    assert guard_breaches(cfg, HOME, {"load_rps": 50.0}, capacity_rps=100.0) == ()
    prog = RecoveryProgress(step=2, steps=4, last_step_at=0.0)
    move = next_recovery_move(
        prog,
        cfg,
        region=HOME,
        verdict=Health.HEALTHY,
        signals={"load_rps": 95.0},
        capacity_rps=100.0,
        now=10.0,
        began_at=0.0,
        prewarm_budget_s=30.0,
    )
    assert move.kind is MoveKind.GUARD and move.fraction_home == 0.25
    assert prog.step == 2  # the input is untouched


def test_the_ladder_files_guard_and_baseline_set_the_traffic_guard() -> None:
    ladder = load_ladder()
    base = RecoveryConfig(prewarm=False, prewarm_top_fraction=0.5, step_percent=50)
    cfg = recovery_config(ladder, base)
    g = ladder.recovery.guard
    assert cfg.step_percent == ladder.recovery.step_percent
    assert cfg.guard_ttft_p99_over_baseline == g.ttft_p99_over_baseline == 1.5
    assert cfg.guard_error_rate_over == g.error_rate_over == 0.02
    assert cfg.baseline_for("anywhere") == ladder.baseline.ttft_p99_s
    assert not cfg.prewarm and cfg.prewarm_top_fraction == 0.5  # not in the file: kept


def test_each_recovery_step_names_its_step_in_the_details() -> None:
    w = guarded_world()
    recovered(w)
    tick(w, 4, **CALM)
    steps = [a for a in w.audit if a.action is AuditAction.RECOVERY_STEP]
    assert [a.recovery_step for a in steps] == [1, 2]  # readers need not parse the reason
    assert [a.reason.split(":")[0] for a in steps] == ["step 1/4", "step 2/4"]
