"""The per-region state machine (docs/architecture.md §3): an edge table and a lookup.

Like the warm pool's (regions/pool/states.py), the machine is data: ``EDGES`` names each
trigger, the states it may fire from and the state it leads to; anything not listed is
refused. ``fire`` only validates a trigger and words the ``Decision``; when a trigger
fires (the guards: health verdicts, dwell times, drills, intents) is the tick's
planner's (controlplane/core/decide.py), and the orchestrator persists the decision.
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.kernel.model import Decision, RegionRecord, RegionState, Signals, Trigger

S = RegionState


# The whole graph: trigger -> (the states it fires from, the state it leads to).
EDGES: Mapping[Trigger, tuple[frozenset[RegionState], RegionState]] = {
    Trigger.DEGRADE: (frozenset({S.NORMAL}), S.DEGRADED),
    Trigger.RESTORE: (frozenset({S.DEGRADED}), S.NORMAL),
    Trigger.FAIL_OVER: (frozenset({S.NORMAL, S.DEGRADED}), S.FAILING_OVER),
    Trigger.RECOVER: (frozenset({S.FAILING_OVER}), S.RECOVERED),
    Trigger.COMPLETE: (frozenset({S.RECOVERED}), S.NORMAL),
    Trigger.RELAPSE: (frozenset({S.RECOVERED}), S.FAILING_OVER),
}

# The same graph as rows (trigger, sources in state order, dest), for metrics and docs.
TRANSITIONS: tuple[tuple[Trigger, tuple[RegionState, ...], RegionState], ...] = tuple(
    (t, tuple(s for s in RegionState if s in sources), dest) for t, (sources, dest) in EDGES.items()
)

ALLOWED_EDGES: frozenset[tuple[RegionState, RegionState]] = frozenset(
    (src, dest) for sources, dest in EDGES.values() for src in sources
)


class IllegalTransition(ValueError):
    """The trigger does not apply to the region's current state."""


def fire(
    record: RegionRecord,
    trigger: Trigger,
    *,
    reason: str,
    actor: str,
    now: float,
    signals: Signals | None = None,
    epoch: int | None = None,
) -> Decision:
    """Validate ``trigger`` from the record's state and return the decision it makes."""
    sources, dest = EDGES[trigger]
    if record.state not in sources:
        raise IllegalTransition(
            f"{record.region}: {trigger.value!r} is not allowed from {record.state.value}"
        )
    return Decision(
        region=record.region,
        from_state=record.state,
        to_state=dest,
        trigger=trigger,
        reason=reason,
        actor=actor,
        at=now,
        epoch=record.epoch if epoch is None else epoch,
        signals=dict(signals or {}),
    )
