"""The per-region state machine (docs/architecture.md §3), built on ``transitions``.

The machine only validates a transition and records it as a ``Decision``; it does no
I/O. The orchestrator persists the decision and carries out the side effects.
"""

from __future__ import annotations

from typing import Any

from transitions import Machine, MachineError

from controlplane.kernel.model import Decision, RegionRecord, RegionState, Signals

S = RegionState

# The whole graph: anything not listed here is refused.
TRANSITIONS: tuple[tuple[str, tuple[RegionState, ...], RegionState], ...] = (
    ("degrade", (S.NORMAL,), S.DEGRADED),
    ("restore", (S.DEGRADED,), S.NORMAL),
    ("fail_over", (S.NORMAL, S.DEGRADED), S.FAILING_OVER),
    ("recover", (S.FAILING_OVER,), S.RECOVERED),
    ("complete", (S.RECOVERED,), S.NORMAL),
    ("relapse", (S.RECOVERED,), S.FAILING_OVER),
)

ALLOWED_EDGES: frozenset[tuple[RegionState, RegionState]] = frozenset(
    (src, dest) for _, sources, dest in TRANSITIONS for src in sources
)


class IllegalTransition(ValueError):
    """The trigger does not apply to the region's current state."""


class _Region:
    """The model ``transitions`` drives; its callback only records."""

    state: str

    def __init__(self, state: RegionState) -> None:
        self.state = state.value
        self.recorded: list[tuple[str, str, str]] = []

    def record(self, event: Any) -> None:
        self.recorded.append((event.transition.source, event.transition.dest, event.event.name))


def _machine(model: _Region) -> Machine:
    return Machine(
        model=model,
        states=[s.value for s in RegionState],
        transitions=[
            {"trigger": t, "source": [s.value for s in src], "dest": d.value}
            for t, src, d in TRANSITIONS
        ],
        initial=model.state,
        auto_transitions=False,
        send_event=True,
        after_state_change="record",
    )


def fire(
    record: RegionRecord,
    trigger: str,
    *,
    reason: str,
    actor: str,
    now: float,
    signals: Signals | None = None,
    epoch: int | None = None,
) -> Decision:
    """Validate ``trigger`` from the record's state and return the decision it makes."""
    model = _Region(record.state)
    _machine(model)
    try:
        model.trigger(trigger)  # type: ignore[attr-defined]
    except (MachineError, AttributeError) as e:
        raise IllegalTransition(
            f"{record.region}: {trigger!r} is not allowed from {record.state.value}"
        ) from e
    (src, dest, name) = model.recorded[-1]
    return Decision(
        region=record.region,
        from_state=RegionState(src),
        to_state=RegionState(dest),
        trigger=name,
        reason=reason,
        actor=actor,
        at=now,
        epoch=record.epoch if epoch is None else epoch,
        signals=dict(signals or {}),
    )
