"""The region machine and graduated recovery are edge tables with pure planners, in the
warm pool's style (docs/architecture.md §3, §5): these tests hold the planners to
their tables, so a move the table does not name fails here rather than in a region."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.machine import EDGES, IllegalTransition, fire
from controlplane.core.recovery import (
    EDGES as RECOVERY_EDGES,
)
from controlplane.core.recovery import (
    MoveKind,
    RecoveryMove,
    RecoveryPhase,
    next_recovery_move,
    phase_of,
)
from controlplane.kernel.config import RecoveryConfig
from controlplane.kernel.model import (
    Health,
    RecoveryProgress,
    RecoveryStep,
    RegionRecord,
    RegionState,
    Trigger,
)


@pytest.mark.parametrize(("state", "trigger"), list(itertools.product(RegionState, Trigger)))
def test_fire_follows_the_edge_table_and_refuses_the_rest(
    state: RegionState, trigger: Trigger
) -> None:
    record = RegionRecord(region="east", state=state, epoch=3)
    sources, dest = EDGES[trigger]
    if state in sources:
        d = fire(record, trigger, reason="r", actor="a", now=5.0)
        assert (d.from_state, d.to_state, d.trigger, d.epoch) == (state, dest, trigger.value, 3)
    else:
        with pytest.raises(IllegalTransition, match=f"not allowed from {state.value}"):
            fire(record, trigger, reason="r", actor="a", now=5.0)


CFG = RecoveryConfig(
    step_percent=25, step_interval_s=2, baseline_ttft_p99_s=0.5, guard_error_rate_over=0.02
)
times = st.floats(min_value=0, max_value=100, allow_nan=False)
progresses = st.builds(
    RecoveryProgress,
    step=st.integers(0, 3),
    steps=st.just(4),
    last_step_at=times,
    held=st.booleans(),
    planned=st.sampled_from([(), (RecoveryStep.PREWARM,)]),
    done=st.sampled_from([(), (RecoveryStep.PREWARM,)]),
    guard_at=st.none() | times,
    calm_since=st.none() | times,
)


def recovery_move(
    p: RecoveryProgress, verdict: Health, ttft: float, now: float, began_at: float
) -> RecoveryMove:
    """One tick of recovery with a first-token p99 of ``ttft`` (0.3: calm, 2.0: a breach)."""
    return next_recovery_move(
        p,
        CFG,
        region="east",
        verdict=verdict,
        signals={"ttft_p99_s": ttft},
        capacity_rps=100.0,
        now=now,
        began_at=began_at,
        prewarm_budget_s=10.0,
    )


@settings(max_examples=400, deadline=None)
@given(
    p=progresses,
    verdict=st.sampled_from(list(Health)),
    ttft=st.sampled_from([0.3, 2.0]),
    now=times,
    began_at=times,
)
def test_every_recovery_move_is_an_edge_of_its_phase(
    p: RecoveryProgress, verdict: Health, ttft: float, now: float, began_at: float
) -> None:
    phase = phase_of(p)
    move = recovery_move(p, verdict, ttft, now, began_at)
    assert (phase, move.kind) in RECOVERY_EDGES, (phase, move.kind)
    after = RECOVERY_EDGES[(phase, move.kind)]
    if after is not None:
        assert phase_of(move.progress) is after
    if move.kind is MoveKind.NONE:
        assert move.progress == p  # nothing to write means nothing changed


def test_every_edge_of_the_recovery_table_is_reachable() -> None:
    # The table names no move the planner never makes (each edge is taken by some
    # input); a dead row would document behaviour that does not exist.
    seen: set[tuple[RecoveryPhase, MoveKind]] = set()
    for step, held, planned, guard_at, calm_since, verdict, ttft, now in itertools.product(
        (0, 1, 3),
        (False, True),
        ((), (RecoveryStep.PREWARM,)),
        (None, 10.0),
        (None, 11.0),
        (Health.HEALTHY, Health.DEGRADED),
        (0.3, 2.0),
        (10.5, 11.5, 20.0, 40.0),
    ):
        p = RecoveryProgress(
            step=step,
            steps=4,
            last_step_at=10.0,
            held=held,
            planned=planned,
            guard_at=guard_at,
            calm_since=calm_since,
        )
        move = recovery_move(p, verdict, ttft, now, 0.0)
        seen.add((phase_of(p), move.kind))
    assert set(RECOVERY_EDGES) - seen == set()
