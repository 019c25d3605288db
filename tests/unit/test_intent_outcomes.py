"""Every operator intent gets an outcome the leader records: done or refused, and why."""

from __future__ import annotations

from controlplane.core.intents import IntentStatus
from controlplane.kernel.model import Health, Intent, IntentKind
from tests.unit.world import World

REGIONS = ("us-east", "us-west", "us-central", "eu-west")


def run(w: World, ticks: int) -> None:
    for _ in range(ticks):
        for r in REGIONS:
            w.all_report(r, Health.HEALTHY)
        w.tick()


def intent(w: World, iid: str, region: str, **kw: object) -> Intent:
    fields: dict[str, object] = {"kind": IntentKind.FAILOVER, "reason": "INC-9", "actor": "alice"}
    fields.update(kw)
    i = Intent.model_validate({"id": iid, "region": region, "created_at": w.now, **fields})
    w.intents[iid] = i
    return i


def test_a_carried_out_intent_records_done_with_the_transition() -> None:
    w = World()
    run(w, 2)
    intent(w, "f1", "us-west", targets=("us-central",))
    run(w, 1)
    out = w.outcomes["f1"]
    rec = w.records["us-west"][0]
    assert out.status is IntentStatus.DONE and "f1" not in w.intents
    assert out.epoch == rec.epoch and out.decided_by == "cp-test" and out.decided_at == w.now
    assert out.detail == "NORMAL -> FAILING_OVER (fail_over)"
    assert (out.region, out.actor, out.reason, out.targets) == (
        "us-west",
        "alice",
        "INC-9",
        ("us-central",),
    )
    [transition] = [a for a in w.audit if a.action == "transition"]
    assert transition.details["intent"] == "f1" and transition.details["outcome"] == "done"


def test_a_refused_intent_records_why_and_says_so_on_the_event() -> None:
    w = World()
    run(w, 2)
    intent(w, "f2", "us-east", targets=("eu-west",))  # another residency zone
    run(w, 1)
    out = w.outcomes["f2"]
    assert out.status is IntentStatus.REFUSED and "zone" in out.detail
    assert out.decided_by == "cp-test" and out.epoch == 0
    [event] = [a for a in w.audit if a.details.get("intent") == "f2"]
    assert event.action == "intent_failover" and event.result == f"refused: {out.detail}"
    assert event.details["outcome"] == "refused"


def test_the_second_of_two_intents_for_one_region_is_refused_with_a_reason() -> None:
    """The API refuses a second intent while one is pending; intents stored anyway (an
    older API, a race lost elsewhere) still each get an outcome."""
    w = World()
    run(w, 2)
    intent(w, "a", "us-east")
    intent(w, "b", "us-east")
    run(w, 1)
    assert w.outcomes["a"].status is IntentStatus.DONE
    # One change per region per tick: the tick that carried out "a" left "b" to the next.
    [tick_a] = [
        r for r in w.results for x in r.writes if x.intent_outcome and x.intent_outcome.id == "a"
    ]
    assert not any(d.intent_id == "b" for d in tick_a.dropped)
    run(w, 1)
    assert w.outcomes["b"].status is IntentStatus.REFUSED
    assert w.outcomes["b"].detail == "us-east is already failed over"


def test_a_recovery_intent_records_done() -> None:
    w = World()
    run(w, 2)
    intent(w, "f", "us-east")
    run(w, 1)
    intent(w, "r", "us-east", kind=IntentKind.RECOVER, reason="fixed")
    run(w, 1)
    out = w.outcomes["r"]
    assert out.status is IntentStatus.DONE and out.kind is IntentKind.RECOVER
    assert out.detail == "FAILING_OVER -> RECOVERED (recover)"
