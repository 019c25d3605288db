"""A stored value with fields this version does not know reads back (a newer Tectonic
wrote it: a rolling upgrade, or a rollback reading what the newer one wrote), with
everything else checked as strictly as before.

Before, such a value was corrupt: an older leader dropped every health report a newer
replica stored, and after a rollback every probed region read as never probed.
"""

from __future__ import annotations

import json

import pytest

from controlplane.kernel.capacity_record import CapacityRecord
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.model import Health, HealthReport, ObserverKind
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
