"""The cold-start budget (issue 32, item 3; docs/scaling.md "Cold-start budget") on a
fake clock: the pure figures (``core/cold_start.py``), a pool's measured activation p95
against a third of its first-token SLO and its WARM standby against the sizing formula
with measured inputs where measured, and the leader's gauges of them."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.core.actions import TickResult
from controlplane.core.cold_start import ColdStart, cold_starts, pool_cold_start
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.model import RegionHealth, RegionRecord
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.metrics import ControlPlaneMetrics

NOW = 1_000_000.0  # the fake clock: every figure is of one tick at this time


def topo(scaling: dict[str, Any] | None = None) -> Topology:
    """east: SLO 3 s (budget 1 s); west: the default SLO 2 s (budget 0.667 s)."""
    spec: dict[str, Any] = {
        "cluster": "cold",
        "regions": [
            {
                "name": "east",
                "zone": "us",
                "agent": "127.0.0.1:1",
                "capacity_rps": 50,
                "slo": {"ttft_p99_s": 3.0},
            },
            {"name": "west", "zone": "us", "agent": "127.0.0.1:2", "capacity_rps": 50},
        ],
    }
    if scaling is not None:
        spec["scaling"] = scaling
    return parse_topology(spec)


def view(name: str, **kw: Any) -> RegionView:
    return RegionView(
        name=name, record=RegionRecord(region=name), health=RegionHealth(region=name), **kw
    )


def record(unit: str, **kw: Any) -> ScaleRecord:
    base: dict[str, Any] = {
        "unit": unit,
        "active": 2,
        "warm": 1,
        "decided_at": NOW,
        "changed_at": NOW - 60,
        "per_replica_rps": 10.0,
        "capacity": "measured",
        "upper_rps": 18.0,
    }
    return ScaleRecord(**{**base, **kw})


def test_activation_p95_against_a_third_of_the_first_token_slo() -> None:
    t = topo()
    east = pool_cold_start(view("east", activation_p95_s=1.4), t, None)
    assert east.budget_s == pytest.approx(1.0) and east.over_budget
    west = pool_cold_start(view("west", activation_p95_s=0.5), t, None)
    assert west.budget_s == pytest.approx(2 / 3) and not west.over_budget
    unmeasured = pool_cold_start(view("west"), t, None)
    assert unmeasured.activation_p95_s is None and not unmeasured.over_budget
    # without scaling: no WARM comparison (nothing sized), the budget still stands
    assert east.warm_needed is None and east.short == 0


def test_warm_needed_on_the_configured_burst_with_measured_inputs() -> None:
    # standby_rps 50 beyond 2 ACTIVE x 10 rps: 30 rps, 3 WARM; 1 standing by: 2 short.
    t = topo({"standby_rps": 50.0, "horizon_s": 30})
    v = view("east", activation_p95_s=2.0, active_replicas=2, warm_replicas=1)
    c = pool_cold_start(v, t, record("east"))
    assert c.burst_rps == pytest.approx(30.0)
    assert (c.warm_now, c.warm_needed, c.short) == (1, 3, 2)
    assert c.feasible is True
    assert c.measured == {"activation_s": True, "activation_rate": False, "replica_rps": True}


def test_the_forecast_band_when_larger_and_typed_inputs_say_so() -> None:
    # No standby_rps: the forecast's band, 45 rps, beyond 2 ACTIVE x 10: 3 WARM needed.
    # No wake measured (the typed activation_s stands in), capacity typed.
    t = topo({"horizon_s": 30})
    v = view("east", active_replicas=2, warm_replicas=3)
    c = pool_cold_start(v, t, record("east", upper_rps=45.0, capacity="typed"))
    assert (c.warm_needed, c.short) == (3, 0)
    assert c.measured == {"activation_s": False, "activation_rate": False, "replica_rps": False}
    # A band under what ACTIVE serves needs no standby.
    calm = pool_cold_start(v, t, record("east", upper_rps=15.0))
    assert (calm.burst_rps, calm.warm_needed) == (0.0, 0)


def test_the_measured_activation_rate_stands_in_for_the_typed_one() -> None:
    # Typed: 0.05 wakes/s; within the 30 s horizon after a 2 s wake only
    # floor(28 x 0.05) + 1 = 2 wakes finish, and the burst (30 rps beyond 2 ACTIVE x 10)
    # needs 3: infeasible. The pool measured 1 replica/s (its batches of wakes): 29
    # finish, feasible, and the input says it was measured.
    t = topo({"standby_rps": 50.0, "horizon_s": 30, "activation_rate": 0.05})
    typed = view("east", activation_p95_s=2.0, active_replicas=2, warm_replicas=3)
    c = pool_cold_start(typed, t, record("east"))
    assert (c.warm_needed, c.feasible, c.activation_rate) == (3, False, 0.05)
    assert c.measured["activation_rate"] is False
    measured = typed.model_copy(update={"activation_rate": 1.0})
    c = pool_cold_start(measured, t, record("east"))
    assert (c.warm_needed, c.feasible, c.activation_rate) == (3, True, 1.0)
    assert c.measured == {"activation_s": True, "activation_rate": True, "replica_rps": True}

    m = ControlPlaneMetrics(t.names, t)
    m.tick_done(
        leader=True,
        snapshot=Snapshot(now=NOW, regions={"east": measured, "west": view("west")}),
        result=TickResult(now=NOW, sizes={"east": record("east")}),
    )
    got = m.registry.get_sample_value(
        "tectonic_pool_warm_needed_inputs_measured", {"pool": "east", "input": "activation_rate"}
    )
    assert got == 1


def test_a_wake_slower_than_the_horizon_is_infeasible() -> None:
    # The measured wake (40 s) is longer than the horizon (30 s): no WARM pool absorbs
    # the burst in time; still 3 needed, and feasible False says why more will not do.
    t = topo({"standby_rps": 50.0, "horizon_s": 30, "activation_s": 5})
    v = view("east", activation_p95_s=40.0, active_replicas=2, warm_replicas=3)
    c = pool_cold_start(v, t, record("east"))
    assert (c.warm_needed, c.feasible) == (3, False)


def test_no_record_or_no_capacity_sizes_nothing() -> None:
    t = topo({"standby_rps": 50.0})
    v = view("east", active_replicas=2, warm_replicas=1)
    assert pool_cold_start(v, t, None).warm_needed is None
    assert pool_cold_start(v, t, record("east", per_replica_rps=None)).warm_needed is None
    snap = Snapshot(now=NOW, regions={"east": v, "west": view("west")})
    got = cold_starts(snap, t, {"east": record("east")})
    assert [c.unit for c in got] == ["east", "west"]
    assert isinstance(got[1], ColdStart) and got[1].warm_needed is None


def test_the_leader_exports_both_comparisons_and_drops_them_as_a_follower() -> None:
    t = topo({"standby_rps": 50.0, "horizon_s": 30})
    m = ControlPlaneMetrics(t.names, t)
    get = m.registry.get_sample_value
    east = view("east", activation_p95_s=1.4, active_replicas=2, warm_replicas=1)
    regions = {"east": east, "west": view("west")}
    sizes = {"east": record("east")}
    m.tick_done(
        leader=True,
        snapshot=Snapshot(now=NOW, regions=regions),
        result=TickResult(now=NOW, sizes=sizes),
    )
    assert get("tectonic_pool_activation_p95_seconds", {"pool": "east"}) == 1.4
    assert get("tectonic_pool_cold_start_budget_seconds", {"pool": "east"}) == pytest.approx(1.0)
    assert get("tectonic_pool_activation_p95_seconds", {"pool": "west"}) is None
    assert get("tectonic_pool_cold_start_budget_seconds", {"pool": "west"}) == pytest.approx(2 / 3)
    assert get("tectonic_pool_warm_standby", {"pool": "east"}) == 1
    assert get("tectonic_pool_warm_needed", {"pool": "east"}) == 3
    inputs = "tectonic_pool_warm_needed_inputs_measured"
    assert get(inputs, {"pool": "east", "input": "activation_s"}) == 1
    assert get(inputs, {"pool": "east", "input": "activation_rate"}) == 0
    assert get(inputs, {"pool": "east", "input": "replica_rps"}) == 1
    assert get("tectonic_pool_warm_needed", {"pool": "west"}) is None  # not sized

    # A tick later the scaler no longer sizes east: its WARM comparison goes, no stale
    # series; the activation comparison stays.
    m.tick_done(
        leader=True,
        snapshot=Snapshot(now=NOW + 1, regions=regions),
        result=TickResult(now=NOW + 1, sizes={}),
    )
    assert get("tectonic_pool_warm_needed", {"pool": "east"}) is None
    assert get("tectonic_pool_warm_standby", {"pool": "east"}) is None
    assert get("tectonic_pool_activation_p95_seconds", {"pool": "east"}) == 1.4

    m.tick_done(leader=False, snapshot=None)  # a follower exports none of them
    assert get("tectonic_pool_activation_p95_seconds", {"pool": "east"}) is None
    assert get("tectonic_pool_cold_start_budget_seconds", {"pool": "east"}) is None
