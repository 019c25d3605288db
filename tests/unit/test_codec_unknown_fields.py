"""A stored value with fields this version does not know reads back (a newer Tectonic
wrote it: a rolling upgrade, or a rollback reading what the newer one wrote), with
everything else checked as strictly as before.

Before, such a value was corrupt: an older leader dropped every health report a newer
replica stored, and after a rollback every probed region read as never probed. Commands
(intents, drill requests) stay refused whole; fields added later are written only while
they hold something.
"""

from __future__ import annotations

import json

import pytest

from controlplane.kernel.capacity.record import CapacityRecord
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.drills import DrillRequest
from controlplane.kernel.model import (
    Decision,
    Health,
    HealthReport,
    Intent,
    IntentKind,
    ObserverKind,
    RegionRecord,
    RegionState,
    Trigger,
)
from tests.unit.test_capacity_report import record


def report() -> HealthReport:
    return HealthReport(
        region="us-east",
        observer="agent:us-east",
        kind=ObserverKind.AGENT,
        health=Health.HEALTHY,
        signals={"load_rps": 3.0},
        received_at=10.0,
    )


def test_fields_a_newer_version_added_are_dropped_at_any_depth() -> None:
    data = json.loads(encode(record()))
    data["pool_shape"] = {"gpus": 8}  # top level
    data["probes"][1]["steps"][0]["kv_usage"] = 0.4  # in a list of nested models
    data["slo"]["tpot_p99_s"] = 0.05
    assert decode(CapacityRecord, json.dumps(data).encode(), "capacity/eu-west") == record()


def test_a_field_on_every_element_of_a_list_is_dropped_too() -> None:
    """A newer writer adds its field to every step: every probe then fails, and pydantic
    adds a min_length error on ``probes`` beside the unknown fields."""
    data = json.loads(encode(record()))
    for p in data["probes"]:
        for step in p["steps"]:
            step["kv_usage"] = 0.4
    assert decode(CapacityRecord, json.dumps(data).encode(), "capacity/eu-west") == record()
    data["probes"][0]["hit_rate"] = 5  # ... and a wrong value among them is still wrong
    with pytest.raises(CorruptValue, match=r"(?s)probes\.0\.hit_rate"):
        decode(CapacityRecord, json.dumps(data).encode(), "capacity/eu-west")


def test_a_command_with_a_field_this_version_does_not_know_is_refused_whole() -> None:
    """Carried out without a newer version's field (a safety flag, say), an intent or a
    drill request would do something else than was asked."""
    intent = Intent(
        id="i1",
        kind=IntentKind.FAILOVER,
        region="us-east",
        reason="r",
        actor="me",
        created_at=1.0,
    )
    data = {**json.loads(encode(intent)), "only_if_drained": True}
    with pytest.raises(CorruptValue, match="only_if_drained"):
        decode(Intent, json.dumps(data).encode(), "intents/i1")
    drill = DrillRequest(
        id="d1", scenario="region-blackout", reason="r", actor="me", requested_at=1
    )
    data = {**json.loads(encode(drill)), "max_loss": 0}
    with pytest.raises(CorruptValue, match="max_loss"):
        decode(DrillRequest, json.dumps(data).encode(), "drills/requests/d1")


def test_fields_added_later_are_written_only_while_they_hold_something() -> None:
    """So that an older reader meets them only when they are in use."""
    assert "engine_version" not in json.loads(encode(report()))
    versioned = report().model_copy(update={"engine_version": "0.32.0"})
    assert json.loads(encode(versioned))["engine_version"] == "0.32.0"
    assert decode(HealthReport, encode(versioned)) == versioned
    stored = json.loads(encode(record()))
    assert "scaling_unmeasured" not in stored
    assert all("mean_inflight" not in s for p in stored["probes"] for s in p["steps"])


def test_an_unknown_field_beside_a_wrong_one_is_still_corrupt() -> None:
    data = json.loads(encode(report()))
    data["future"] = 1
    data["health"] = "SO-SO"
    with pytest.raises(CorruptValue, match=r"(?s)reports/x.*health"):
        decode(HealthReport, json.dumps(data).encode(), "reports/x")


def test_a_missing_field_is_still_corrupt() -> None:
    data = json.loads(encode(report()))
    data["future"] = 1
    del data["observer"]
    with pytest.raises(CorruptValue, match="observer"):
        decode(HealthReport, json.dumps(data).encode(), "reports/x")


def test_the_models_still_refuse_unknown_fields_where_they_are_built() -> None:
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        HealthReport.model_validate({**report().model_dump(), "future": 1})


def test_a_trigger_a_newer_version_added_reads_as_its_text_and_known_ones_typed() -> None:
    """A decision sits in ``regions/<r>/state``: an enum value a newer leader adds must
    not make an older reader take the region's record for corrupt."""
    decision = Decision(
        region="us-east",
        from_state=RegionState.NORMAL,
        to_state=RegionState.FAILING_OVER,
        trigger=Trigger.FAIL_OVER,
        reason="x",
        actor="cp",
        at=1.0,
        epoch=1,
    )
    rec = RegionRecord(region="us-east", since=1.0, last_decision=decision)
    back = decode(RegionRecord, encode(rec), "regions/us-east/state")
    assert back == rec and back.last_decision is not None
    assert back.last_decision.trigger is Trigger.FAIL_OVER  # typed, not a bare string
    data = json.loads(encode(rec))
    data["last_decision"]["trigger"] = "drain_for_upgrade"  # a later version's trigger
    newer = decode(RegionRecord, json.dumps(data).encode(), "regions/us-east/state")
    assert newer.last_decision is not None
    assert newer.last_decision.trigger == "drain_for_upgrade"
    assert not isinstance(newer.last_decision.trigger, Trigger)
    assert encode(newer) == json.dumps(data, separators=(",", ":")).encode()  # kept as read
