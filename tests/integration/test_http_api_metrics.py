"""What the control plane's /metrics exports (ControlPlaneMetrics, driven directly):
region states and failover durations follow the decisions and steps, never stepping
back; the prewarm attainment is a fraction only when there was something to warm; a
follower exports no region gauges. Scraped from a real replica: test_http_api.py."""

from __future__ import annotations

import pytest

from controlplane.kernel.model import (
    Decision,
    FailoverPlan,
    FailoverProgress,
    FailoverStep,
    PrewarmFigures,
    RegionHealth,
    RegionRecord,
    RegionState,
)
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.metrics import ControlPlaneMetrics, prewarm_fraction


def test_metrics_follow_decisions_and_prewarm() -> None:
    m = ControlPlaneMetrics()
    get = m.registry.get_sample_value
    plan = FailoverPlan(source="east", targets={"west": 1.0}, reason="down", actor="cp")
    view = RegionView(
        name="east",
        record=RegionRecord(region="east", epoch=0),
        health=RegionHealth(region="east"),
    )
    snap = Snapshot(now=100.0, regions={"east": view})
    m.transitioned(
        Decision(
            region="east",
            from_state=RegionState.NORMAL,
            to_state=RegionState.FAILING_OVER,
            trigger="fail_over",
            reason="down",
            actor="cp",
            at=100.0,
            epoch=1,
        )
    )
    m.tick_done(leader=True, snapshot=snap)  # read before the write: must not step back
    assert get("tectonic_region_state", {"region": "east", "state": "FAILING_OVER"}) == 1
    assert get("tectonic_region_state", {"region": "east", "state": "NORMAL"}) == 0

    progress = FailoverProgress(
        plan=plan,
        started_at=100.0,
        done=(FailoverStep.SWITCH,),
        prewarm_result=PrewarmFigures(prefixes_total=40, prefixes_warmed=30),
    )
    m.failover_step_done("east", FailoverStep.SWITCH, progress, at=101.5)
    m.failover_step_done("east", FailoverStep.PREWARM, progress, at=120.0)
    assert get("tectonic_failover_duration_seconds_sum") == pytest.approx(1.5)
    assert get("tectonic_prewarm_attained_fraction", {"region": "east"}) == pytest.approx(0.75)
    assert prewarm_fraction(PrewarmFigures(prefixes_total=0, prefixes_warmed=0)) is None
    assert prewarm_fraction(PrewarmFigures(attained_fraction=1.2)) == 1.0

    m.tick_done(leader=False, snapshot=None)  # a follower exports no region gauges
    assert get("tectonic_region_state", {"region": "east", "state": "FAILING_OVER"}) is None
    assert get("tectonic_prewarm_attained_fraction", {"region": "east"}) is None
    assert get("tectonic_leader") == 0 and get("tectonic_loop_ticks_total") == 2
