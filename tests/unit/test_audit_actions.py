"""Typed audit actions: the same strings in etcd, kinds read without prefix matching, and
an entry another version wrote with an unknown action skipped by every reader."""

from __future__ import annotations

import json
import logging

import pytest

from chaos.drills.observe import audit_since
from controlplane.api.reads import Reads
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import (
    AuditAction,
    AuditEntry,
    Decision,
    IntentKind,
    LadderChange,
    RecoveryStep,
    RegionState,
)
from controlplane.kernel.store.memory import MemoryStore
from tests.unit.world import topology

KEYS = Keys("test")


def test_the_stored_strings_are_the_ones_written_before() -> None:
    entry = AuditEntry(at=1.0, actor="cp", action=AuditAction.ROUTING_SWITCH, region="a")
    assert json.loads(encode(entry))["action"] == "routing_switch"
    assert decode(AuditEntry, encode(entry)).action is AuditAction.ROUTING_SWITCH
    assert AuditAction.of_intent(IntentKind.FAILOVER) == "intent_failover"
    assert AuditAction.of_intent(IntentKind.RECOVER) is AuditAction.INTENT_RECOVER
    assert AuditAction.of_recovery(RecoveryStep.PREWARM) is AuditAction.RECOVERY_PREWARM
    assert AuditAction.of_ladder(LadderChange.REAPPLY) is AuditAction.LADDER_REAPPLY


def test_kinds_are_read_back_typed() -> None:
    assert [a.ladder_change for a in AuditAction if a.ladder_change] == [
        "apply",
        "reapply",
        "restore",
    ]
    assert AuditAction.TRANSITION.ladder_change is None
    assert AuditAction.INTENT_FAILOVER.intent_kind is IntentKind.FAILOVER
    assert AuditAction.PAUSE.intent_kind is None
    assert AuditAction.RECOVERY_STEP.ladder_change is None  # not a prefix match on "re"


def test_the_recovery_step_is_a_detail_not_parsed_from_the_reason() -> None:
    def entry(**details: str) -> AuditEntry:
        return AuditEntry(
            at=1.0, actor="cp", action=AuditAction.RECOVERY_STEP, reason="x", details=details
        )

    assert entry(recovery_step="3").recovery_step == 3
    assert entry().recovery_step is None
    assert entry(recovery_step="three").recovery_step is None


def test_an_unknown_action_does_not_decode() -> None:
    raw = json.dumps({"at": 1.0, "actor": "cp", "action": "from_the_future"}).encode()
    with pytest.raises(CorruptValue):
        decode(AuditEntry, raw, "audit/x")


async def _store_with_an_unknown_action() -> MemoryStore:
    store = MemoryStore()
    log = AuditLog(KEYS, "test")
    decision = Decision(
        region="us-east",
        from_state=RegionState.NORMAL,
        to_state=RegionState.DEGRADED,
        trigger="health",
        reason="slow",
        actor="cp",
        at=2.0,
        epoch=1,
    )
    known = AuditEntry(
        at=2.0, actor="cp", action=AuditAction.TRANSITION, region="us-east", decision=decision
    )
    ladder = AuditEntry(
        at=3.0,
        actor="cp",
        action=AuditAction.LADDER_APPLY,
        region="us-east",
        details={"step": "speculative_decoding"},
    )
    for e in (known, ladder):
        op = log.op(e)
        await store.put(op.key, op.value)
    unknown = json.dumps({"at": 2.5, "actor": "cp", "action": "from_the_future"}).encode()
    await store.put(KEYS.audit("00000000002500000-other-000000"), unknown)
    return store


async def test_the_drills_skip_an_entry_with_an_unknown_action(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = await _store_with_an_unknown_action()
    with caplog.at_level(logging.WARNING):
        transitions, ladder, entries = await audit_since(store, KEYS, 0.0)
    assert [e.action for e in entries] == [AuditAction.TRANSITION, AuditAction.LADDER_APPLY]
    assert [t.to_state for t in transitions] == ["DEGRADED"]
    assert [(e.action, e.step) for e in ladder] == [("apply", "speculative_decoding")]
    assert "does not decode" in caplog.text


async def test_the_history_read_skips_an_entry_with_an_unknown_action() -> None:
    store = await _store_with_an_unknown_action()
    reads = Reads(store, KEYS, topology(), FakeClock(), "cp-1", lambda: True)
    history = await reads.history()
    assert [r.entry.action for r in history] == [AuditAction.TRANSITION, AuditAction.LADDER_APPLY]
