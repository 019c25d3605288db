"""The metrics the alert rules added, as the leader exports them: routing weights,
readiness (a region barred, its last drill), automation paused, and capacity
utilisation against the planner's bearing (allowed rps, staleness, age); a follower
exports none of them.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from controlplane.kernel.model import (
    Cause,
    ControlFlags,
    Decision,
    Readiness,
    RegionHealth,
    RegionHold,
    RegionRecord,
    RegionState,
    Routing,
)
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.metrics import ControlPlaneMetrics
from tests.unit.alert_promql import capacity_record, capacity_topology

DAY = 86400.0


# ---- the metrics the alerts added -----------------------------------------------------


def test_leader_exports_what_started_each_state_and_each_hold() -> None:
    m = ControlPlaneMetrics()
    get = m.registry.get_sample_value
    drilled = Decision(
        region="east",
        from_state=RegionState.NORMAL,
        to_state=RegionState.FAILING_OVER,
        trigger="fail_over",
        reason="UNHEALTHY",
        actor="cp-1",
        at=10.0,
        epoch=1,
        cause=Cause.DRILL,
    )
    east = RegionView(
        name="east",
        record=RegionRecord(
            region="east", state=RegionState.FAILING_OVER, epoch=1, last_decision=drilled
        ),
        health=RegionHealth(region="east"),
        hold=RegionHold(unit="east", reason="INC-1", actor="op", at=5.0, until=50.0),
    )
    west = RegionView(
        name="west", record=RegionRecord(region="west"), health=RegionHealth(region="west")
    )
    m.tick_done(leader=True, snapshot=Snapshot(now=20.0, regions={"east": east, "west": west}))
    assert get("tectonic_region_state_cause", {"region": "east", "cause": "drill"}) == 1
    assert get("tectonic_region_state_cause", {"region": "east", "cause": "automatic"}) == 0
    assert get("tectonic_region_state_cause", {"region": "west", "cause": "automatic"}) == 1
    assert get("tectonic_region_held", {"region": "east"}) == 1
    assert get("tectonic_region_held", {"region": "west"}) == 0
    # an operator's recovery is its own cause; the hold's end passes
    manual = drilled.model_copy(
        update={
            "from_state": RegionState.FAILING_OVER,
            "to_state": RegionState.RECOVERED,
            "epoch": 2,
            "cause": Cause.MANUAL,
        }
    )
    m.transitioned(manual)
    assert get("tectonic_region_state_cause", {"region": "east", "cause": "manual"}) == 1
    assert get("tectonic_region_state_cause", {"region": "east", "cause": "drill"}) == 0
    later = east.model_copy(
        update={
            "record": east.record.model_copy(
                update={"state": RegionState.RECOVERED, "epoch": 2, "last_decision": manual}
            )
        }
    )
    m.tick_done(leader=True, snapshot=Snapshot(now=60.0, regions={"east": later, "west": west}))
    assert get("tectonic_region_held", {"region": "east"}) == 0
    assert get("tectonic_region_state_cause", {"region": "east", "cause": "manual"}) == 1


def test_leader_exports_routing_readiness_and_pause() -> None:
    m = ControlPlaneMetrics()
    get = m.registry.get_sample_value

    def view(name: str, **kw: Any) -> RegionView:
        return RegionView(
            name=name, record=RegionRecord(region=name), health=RegionHealth(region=name), **kw
        )

    east = view(
        "east",
        readiness=Readiness(passed=False, drill="blackout", at=1000.0),
        routing=Routing(targets={"west": 0.25, "north": 0.75}, epoch=2),
    )
    west = view("west", readiness=Readiness(passed=False, at=900.0, override_reason="INC-1"))
    snap = Snapshot(
        now=2000.0, regions={"east": east, "west": west}, control=ControlFlags(paused=True)
    )
    m.tick_done(leader=True, snapshot=snap)
    assert get("tectonic_routing_weight", {"region": "east", "target": "north"}) == 0.75
    assert get("tectonic_routing_weight", {"region": "west", "target": "west"}) == 1.0
    assert get("tectonic_region_barred", {"region": "east"}) == 1
    assert get("tectonic_region_barred", {"region": "west"}) == 0  # overridden
    assert get("tectonic_region_drill_timestamp_seconds", {"region": "east"}) == 1000.0
    assert get("tectonic_automation_paused") == 1

    # Routing home again: the targets it no longer names go; readiness gone too.
    east = east.model_copy(update={"routing": Routing(targets={"east": 1.0}), "readiness": None})
    snap = Snapshot(now=2001.0, regions={"east": east, "west": west})
    m.tick_done(leader=True, snapshot=snap)
    assert get("tectonic_routing_weight", {"region": "east", "target": "north"}) is None
    assert get("tectonic_routing_weight", {"region": "east", "target": "east"}) == 1.0
    assert get("tectonic_region_barred", {"region": "east"}) == 0
    assert get("tectonic_region_drill_timestamp_seconds", {"region": "east"}) is None
    assert get("tectonic_automation_paused") == 0

    m.tick_done(
        leader=True, snapshot=snap.model_copy(update={"control": ControlFlags(paused=True)})
    )
    m.tick_done(leader=False, snapshot=None)  # a follower: no region gauges, not paused
    assert get("tectonic_routing_weight", {"region": "east", "target": "east"}) is None
    assert get("tectonic_region_barred", {"region": "west"}) is None
    assert get("tectonic_region_drill_timestamp_seconds", {"region": "west"}) is None
    assert get("tectonic_automation_paused") == 0


def test_leader_exports_capacity_utilisation_against_the_planners_bearing() -> None:
    topo = capacity_topology()
    m = ControlPlaneMetrics(topo.names, topo)
    get = m.registry.get_sample_value
    now = 100 * DAY

    def view(name: str, load: float, hit: float = 0.0, **kw: Any) -> RegionView:
        signals = {"load_rps": load, "prefix_hit_rate": hit}
        return RegionView(
            name=name,
            record=RegionRecord(region=name),
            health=RegionHealth(region=name, signals=signals),
            **kw,
        )

    # east: probed an hour ago, 2 ACTIVE replicas of R_base 10, beta 0.5, FOS 2: at hit
    # rate 0.5 it bears 2 x 10 / (1 - 0.25) / 2 = 13.33 rps, and serves 9.
    east = view("east", 9.0, 0.5, capacity=capacity_record("east", now - 3600), active_replicas=2)
    # west: probed 30 days ago (max 14): stale, the typed 50 rps used; it serves 60.
    west = view("west", 60.0, capacity=capacity_record("west", now - 30 * DAY))
    north = view("north", 0.0)  # never probed: typed, not stale, no age
    regions = {"east": east, "west": west, "north": north}
    m.tick_done(leader=True, snapshot=Snapshot(now=now, regions=regions))
    assert get("tectonic_region_allowed_rps", {"region": "east"}) == pytest.approx(40 / 3)
    assert get("tectonic_region_capacity_utilization", {"region": "east"}) == pytest.approx(0.675)
    assert get("tectonic_region_capacity_stale", {"region": "east"}) == 0
    assert get("tectonic_region_capacity_age_seconds", {"region": "east"}) == 3600
    assert get("tectonic_region_allowed_rps", {"region": "west"}) == 50
    assert get("tectonic_region_capacity_utilization", {"region": "west"}) == pytest.approx(1.2)
    assert get("tectonic_region_capacity_stale", {"region": "west"}) == 1
    assert get("tectonic_region_capacity_age_seconds", {"region": "west"}) == 30 * DAY
    assert get("tectonic_region_capacity_utilization", {"region": "north"}) == 0
    assert get("tectonic_region_capacity_stale", {"region": "north"}) == 0
    assert get("tectonic_region_capacity_age_seconds", {"region": "north"}) is None
    # The hit rate under which each bears less than its load, by its probe's beta even
    # when stale: east bears 2 x 10 / 2 = 10 rps cold, over its 9 (under 0: no drop takes
    # it below); west, 1 replica as probed, 5 rps cold for 60: (1 - 5/60) / 0.5. North
    # has no probe: no critical hit rate; the hit rate served is exported as reported.
    assert get("tectonic_region_critical_hit_rate", {"region": "east"}) == pytest.approx(
        (1 - 10 / 9) / 0.5
    )
    assert get("tectonic_region_critical_hit_rate", {"region": "west"}) == pytest.approx(
        (1 - 5 / 60) / 0.5
    )
    assert get("tectonic_region_critical_hit_rate", {"region": "north"}) is None
    assert get("tectonic_region_hit_rate", {"region": "east"}) == 0.5
    assert get("tectonic_region_hit_rate", {"region": "north"}) == 0.0

    # No ACTIVE replica left in east while it still serves: it bears nothing (+Inf, which
    # the page alert's "> 1.0" catches); west's record deleted: its age goes.
    regions["east"] = east.model_copy(update={"active_replicas": 0})
    regions["west"] = west.model_copy(update={"capacity": None})
    m.tick_done(leader=True, snapshot=Snapshot(now=now + 1, regions=regions))
    assert math.isinf(get("tectonic_region_capacity_utilization", {"region": "east"}) or 0)
    assert get("tectonic_region_allowed_rps", {"region": "east"}) == 0
    assert get("tectonic_region_capacity_stale", {"region": "west"}) == 0
    assert get("tectonic_region_capacity_age_seconds", {"region": "west"}) is None
    assert get("tectonic_region_critical_hit_rate", {"region": "west"}) is None

    m.tick_done(leader=False, snapshot=None)  # a follower exports none of them
    for name in ("utilization", "stale"):
        assert get(f"tectonic_region_capacity_{name}", {"region": "east"}) is None
    assert get("tectonic_region_allowed_rps", {"region": "east"}) is None
    assert get("tectonic_region_capacity_age_seconds", {"region": "east"}) is None
    # Without a topology (nothing to judge by) no capacity gauge is exported at all.
    bare = ControlPlaneMetrics(topo.names)
    bare.tick_done(leader=True, snapshot=Snapshot(now=now, regions=regions))
    assert (
        bare.registry.get_sample_value("tectonic_region_capacity_utilization", {"region": "west"})
        is None
    )
