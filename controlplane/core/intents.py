"""Operator intents' outcomes: pending, done or refused, and why. Pure.

The API stores an intent (``intents/<id>``) and hands its id back; the leader's tick
carries it out or refuses it, and records the outcome (``intent-outcomes/<id>``) in
the same transaction that deletes the intent, so an intent is always either pending
or has an outcome (until that expires). The event of the outcome carries the intent's
id in its details (``intent``, ``outcome``).
"""

from __future__ import annotations

from enum import StrEnum

from controlplane.kernel.model import Decision, Frozen, Intent, IntentKind


class IntentStatus(StrEnum):
    PENDING = "pending"
    DONE = "done"
    REFUSED = "refused"


class IntentOutcome(Frozen):
    """What became of one operator intent (value of ``intent-outcomes/<id>``)."""

    id: str
    kind: IntentKind
    region: str
    status: IntentStatus
    detail: str = ""  # refused: why; done: the transition it made
    reason: str = ""  # the operator's reason
    actor: str = ""
    targets: tuple[str, ...] = ()
    requested_at: float
    decided_at: float = 0.0
    decided_by: str = ""  # the leader that carried it out or refused it
    epoch: int = 0  # done: the region's epoch after its transition


def _outcome(intent: Intent, status: IntentStatus, **fields: object) -> IntentOutcome:
    return IntentOutcome.model_validate(
        {
            "id": intent.id,
            "kind": intent.kind,
            "region": intent.region,
            "status": status,
            "reason": intent.reason,
            "actor": intent.actor,
            "targets": intent.targets,
            "requested_at": intent.created_at,
            **fields,
        }
    )


def pending(intent: Intent) -> IntentOutcome:
    return _outcome(intent, IntentStatus.PENDING)


def done(intent: Intent, decision: Decision, decided_by: str) -> IntentOutcome:
    what = f"{decision.from_state.value} -> {decision.to_state.value} ({decision.trigger})"
    return _outcome(
        intent,
        IntentStatus.DONE,
        detail=what,
        decided_at=decision.at,
        decided_by=decided_by,
        epoch=decision.epoch,
    )


def refused(intent: Intent, why: str, now: float, decided_by: str) -> IntentOutcome:
    return _outcome(intent, IntentStatus.REFUSED, detail=why, decided_at=now, decided_by=decided_by)


def outcome_details(intent_id: str, status: IntentStatus) -> dict[str, str]:
    """The details that tie an event to an intent's outcome."""
    return {"intent": intent_id, "outcome": status.value}
