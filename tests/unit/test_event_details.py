"""Audit and event details are JSON a non-Python client parses, or plain scalars."""

from __future__ import annotations

import json
import math

from controlplane.kernel.details import flag, json_list, json_text
from controlplane.kernel.model import AuditEntry, Health
from tests.unit.world import World

REGIONS = ("us-east", "us-west", "us-central", "eu-west")


def run(w: World, ticks: int, down: str = "") -> None:
    for _ in range(ticks):
        for r in REGIONS:
            w.all_report(r, Health.UNHEALTHY if r == down else Health.HEALTHY)
        w.tick()


def routing_of(text: str) -> dict[str, dict[str, float]]:
    value = json.loads(text)
    assert all(isinstance(t, dict) for t in value.values()), text
    return {r: {k: float(v) for k, v in t.items()} for r, t in value.items()}


def entries(w: World, action: str) -> list[AuditEntry]:
    return [a for a in w.audit if a.action == action]


def test_routing_details_decode_to_region_target_weight() -> None:
    w = World()
    run(w, 3)
    run(w, 3, down="us-east")
    run(w, 8)  # healthy again: recovery begins
    for _ in range(12):
        run(w, 1)
    assert w.state("us-east") == "NORMAL"

    [switch] = entries(w, "routing_switch")
    routes = {r: json.loads(v) for r, v in switch.details.items()}
    assert set(routes["us-east"]) == {"us-west", "us-central"}
    assert math.isclose(sum(routes["us-east"].values()), 1.0)

    steps = entries(w, "recovery_step")
    assert steps and all(set(routing_of(s.details["routing"])) == {"us-east"} for s in steps)
    [complete] = [a for a in entries(w, "transition") if a.details["trigger"] == "complete"]
    assert routing_of(complete.details["routing"]) == {"us-east": {"us-east": 1.0}}
    for a in w.audit:
        for v in a.details.values():
            assert "'" not in v, (a.action, v)  # no Python repr anywhere


def test_json_text_is_strict_json_with_sorted_keys() -> None:
    assert json_text({"b": 1.0, "a": [2, "x"]}) == '{"a":[2,"x"],"b":1.0}'
    # JSON has no infinities; the strings stored records use instead of Python's Infinity
    text = json_text({"p99": math.inf, "x": math.nan, "y": -math.inf})
    assert text == '{"p99":"Infinity","x":"NaN","y":"-Infinity"}'
    assert json_list(("a", "b")) == '["a","b"]' and json_list([]) == "[]"
    assert (flag(True), flag(False)) == ("true", "false")
