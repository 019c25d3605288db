"""Labelled counters whose label sets are known at start exist from the start at 0.

A series that appears at its first event hides that event (and a burst inside one
scrape) from ``increase()`` and ``rate()``: a dashboard showed no transition in a
blackout, and 10 spills read 3.1 over a minute. So a fresh registry already exposes,
at 0, every transition of the state machine per region (read from ``machine.py``),
and per region every status, error kind, degradation action, spill within its zone
(while a zone's pairs stay few: ``SPILL_PAIRS_AT_ZERO``), notice and warm-up the
gateway counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controlplane.core.machine import ALLOWED_EDGES, TRANSITIONS
from controlplane.kernel.model import Decision, RegionState
from controlplane.metrics import ControlPlaneMetrics
from regions.dataplane.actuators import Action
from regions.dataplane.failures import (
    NO_REGION_KINDS,
    REGION_KINDS,
    UPSTREAM_KINDS,
    ErrorKind,
    UpstreamFailure,
)
from regions.dataplane.metrics import (
    NO_REGION,
    NO_REGION_CODES,
    REGION_CODES,
    SPILL_PAIRS_AT_ZERO,
    DataPlaneMetrics,
    spill_pairs_at_zero,
)
from regions.dataplane.replicas import ReplicaBalancer
from regions.gateway import app, proxy, resume
from regions.gateway.metrics import CONTINUATION_OUTCOMES, GatewayMetrics
from regions.gateway.upstream import UpstreamPool
from regions.gateway.warmth import WARMUP_OUTCOMES, RegionWarmth, WarmUps

REPO = Path(__file__).resolve().parents[2]
ZONES = {"east": "us", "west": "us", "central": "us", "eu": "eu"}


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``name``'s samples: sorted labels -> value."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == name
    }


def label_sets(registry: CollectorRegistry, name: str, *labels: str) -> set[tuple[str, ...]]:
    return {
        tuple(dict(k)[label] for label in labels)
        for k, v in samples(registry, name).items()
        if v == 0
    }


# ---- the control plane ------------------------------------------------------------------


def test_every_transition_of_every_region_starts_at_zero() -> None:
    m = ControlPlaneMetrics(ZONES)
    got = samples(m.registry, "tectonic_transitions_total")
    edges = {(s.value, d.value, t) for t, sources, d in TRANSITIONS for s in sources}
    assert {(s.value, d.value) for s, d in ALLOWED_EDGES} == {(s, d) for s, d, _ in edges}
    want = {
        (("from", s), ("region", r), ("to", d), ("trigger", t)) for r in ZONES for s, d, t in edges
    }
    assert got == dict.fromkeys(want, 0.0)


def test_a_transition_counts_on_its_series_from_zero() -> None:
    m = ControlPlaneMetrics(["east"])
    m.transitioned(
        Decision(
            region="east",
            from_state=RegionState.NORMAL,
            to_state=RegionState.FAILING_OVER,
            trigger="fail_over",
            reason="down",
            actor="cp",
            at=1.0,
            epoch=1,
        )
    )
    got = samples(m.registry, "tectonic_transitions_total")
    key = (("from", "NORMAL"), ("region", "east"), ("to", "FAILING_OVER"), ("trigger", "fail_over"))
    assert got[key] == 1.0
    assert sum(got.values()) == 1.0 and len(got) == len(ALLOWED_EDGES)  # no series new


def test_without_regions_nothing_is_made_up() -> None:
    assert samples(ControlPlaneMetrics().registry, "tectonic_transitions_total") == {}


# ---- the gateway ------------------------------------------------------------------------


def test_every_region_starts_with_its_statuses_errors_and_actions_at_zero() -> None:
    r = GatewayMetrics(ZONES).registry
    want_codes = {(g, str(c)) for g in ZONES for c in REGION_CODES}
    want_codes |= {(NO_REGION, str(c)) for c in NO_REGION_CODES}
    assert label_sets(r, "tectonic_gateway_requests_total", "region", "code") == want_codes
    want_kinds = {(g, k) for g in ZONES for k in REGION_KINDS}
    want_kinds |= {(NO_REGION, k) for k in NO_REGION_KINDS}
    assert label_sets(r, "tectonic_gateway_errors_total", "region", "kind") == want_kinds
    assert label_sets(r, "tectonic_gateway_degraded_total", "region", "action") == {
        (g, a.value) for g in ZONES for a in Action
    }
    for name in ("tectonic_gateway_retries_total", "tectonic_gateway_session_move_notices_total"):
        assert label_sets(r, name, "region") == {(g,) for g in ZONES}, name
    assert label_sets(r, "tectonic_gateway_first_token_seconds_count", "region") == {
        (g,) for g in ZONES
    }


def test_spills_start_at_zero_between_the_regions_of_a_zone_only() -> None:
    r = GatewayMetrics(ZONES).registry
    us = ("east", "west", "central")
    assert label_sets(r, "tectonic_gateway_spills_total", "from_region", "to_region") == {
        (a, b) for a in us for b in us if a != b
    }


def test_beyond_the_bound_a_spill_pair_is_born_at_its_first_spill() -> None:
    # 34 regions in one zone: 1,122 pairs, more than SPILL_PAIRS_AT_ZERO
    zones = {f"r{i}": "z" for i in range(34)}
    assert len(zones) * (len(zones) - 1) > SPILL_PAIRS_AT_ZERO
    m = GatewayMetrics(zones)
    name = "tectonic_gateway_spills_total"
    assert label_sets(m.registry, name, "from_region", "to_region") == set()
    assert label_sets(m.registry, "tectonic_gateway_retries_total", "region") == {
        (g,) for g in zones
    }  # the other series of every region still start at 0
    m.spill("r0", "r1")
    assert samples(m.registry, name) == {(("from_region", "r0"), ("to_region", "r1")): 1.0}


def test_the_bound_counts_pairs_within_each_zone() -> None:
    # 4 zones of 16: 960 pairs, at zero; 18 in one of them: 3 * 240 + 306 = 1,026
    zones = {f"r{i}": f"z{i % 4}" for i in range(64)}
    assert len(spill_pairs_at_zero(zones)) == 4 * 16 * 15
    zones["r64"] = zones["r65"] = "z0"
    assert spill_pairs_at_zero(zones) == []


def test_the_gateway_adds_its_continuations_to_the_data_planes_series() -> None:
    gateway, picker = GatewayMetrics(ZONES).registry, DataPlaneMetrics(ZONES).registry
    name = "tectonic_gateway_stream_continuations_total"
    assert label_sets(gateway, name, "region", "outcome") == {
        (g, o) for g in ZONES for o in CONTINUATION_OUTCOMES
    }
    assert samples(picker, name) == {}  # the picker forwards nothing: Envoy does
    shared = {s.name for f in picker.collect() for s in f.samples}
    assert shared <= {s.name for f in gateway.collect() for s in f.samples}


def test_counting_after_start_goes_on_the_series_made_at_zero() -> None:
    m = GatewayMetrics(ZONES)
    for _ in range(10):
        m.spill("east", "west")
    m.request("east", 503)
    m.error("east", ErrorKind.NO_REPLICA)
    m.degrade("west", Action.SHED)
    get = m.registry.get_sample_value
    spill = {"from_region": "east", "to_region": "west"}
    assert get("tectonic_gateway_spills_total", spill) == 10
    assert get("tectonic_gateway_requests_total", {"region": "east", "code": "503"}) == 1
    assert get("tectonic_gateway_errors_total", {"region": "east", "kind": "no_replica"}) == 1
    assert get("tectonic_gateway_degraded_total", {"region": "west", "action": "shed"}) == 1


def test_warm_ups_start_at_zero_for_every_region() -> None:
    m = GatewayMetrics(ZONES)
    balancers = {g: ReplicaBalancer([f"http://{g}:8000"]) for g in ZONES}
    WarmUps(RegionWarmth(), UpstreamPool(), balancers, m)
    r = m.registry
    assert label_sets(r, "tectonic_gateway_warm_first_steers_total", "region") == {
        (g,) for g in ZONES
    }
    assert label_sets(r, "tectonic_gateway_warmups_total", "region", "way", "outcome") == {
        (g, way, outcome) for g in ZONES for way, outcome in WARMUP_OUTCOMES
    }


def test_the_known_label_values_are_all_the_code_counts() -> None:
    """Every error kind the code may count is an ErrorKind (the type checker holds the
    gateway's and the picker's code to it), and each is started at zero where it is
    counted: per region, or for requests that never had one."""
    assert set(REGION_KINDS) | set(NO_REGION_KINDS) == set(ErrorKind)
    assert {ErrorKind.of(f) for f in UpstreamFailure} == set(UPSTREAM_KINDS)
    assert set(UPSTREAM_KINDS) <= set(REGION_KINDS)
    assert proxy.RETRYABLE_STATUS | {resume.STREAM_BROKEN_STATUS, 503} <= set(REGION_CODES)
    assert app.NO_REGION == NO_REGION


def test_the_picker_exports_the_same_series_under_its_own_prefix() -> None:
    def series(
        registry: CollectorRegistry, prefix: str
    ) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {
            (x.name.removeprefix(prefix), tuple(sorted(x.labels.items())))
            for f in registry.collect()
            for x in f.samples
            if x.name.startswith(prefix) and not x.name.endswith("_created")
        }

    gateway = DataPlaneMetrics(ZONES).registry
    picker = DataPlaneMetrics(ZONES, component="picker").registry
    shared = series(gateway, "tectonic_gateway_")
    assert ("requests_total", (("code", "200"), ("region", "east"))) in shared
    assert series(picker, "tectonic_picker_") == shared
    assert series(picker, "tectonic_gateway_") == set()
    with pytest.raises(ValueError, match="component must be one of"):
        DataPlaneMetrics(ZONES, component="envoy")
