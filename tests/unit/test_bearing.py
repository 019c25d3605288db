"""Splitting a failover's load by measured, prefix-aware capacity (controlplane.core.bearing)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.core.bearing import Target, moved_hit_rate, split
from controlplane.kernel.capacity.bearing import HitEffect

BETA = 0.85


def target(name: str, r_base: float, load: float, hit: float = 0.6) -> Target:
    return Target(name, HitEffect(r_base, BETA), 2.0, load, hit)


def test_what_a_typed_capacity_would_overload_is_split_by_what_each_bears() -> None:
    """Two targets typed alike (capacity_rps 120) bear differently: `big` serves
    cached prefixes on more hardware. The moved load arrives cold."""
    big, small = target("big", 100, 40), target("small", 40, 20)
    assert big.cbu(36, 0.0) > 1.0  # the whole load on the bigger one overloads it
    s = split(36, 0.0, [big, small])
    assert s.fits
    assert s.moved_rps["big"] > s.moved_rps["small"]
    assert max(s.cbu_after.values()) <= 1.0 + 1e-9
    assert sum(s.moved_rps.values()) == pytest.approx(36)


def test_when_the_targets_together_are_too_small_the_shortfall_is_said() -> None:
    s = split(500, 0.0, [target("a", 100, 40), target("b", 40, 20)])
    assert not s.fits and s.shortfall_rps > 0
    assert all(c == pytest.approx(1.0) for c in s.cbu_after.values())  # full, not past


def test_prewarmed_traffic_weighs_less() -> None:
    t = [target("a", 100, 40)]
    cold, warm = split(80, 0.0, t), split(80, moved_hit_rate(0.8, 1.0), t)
    assert warm.shortfall_rps < cold.shortfall_rps
    assert moved_hit_rate(0.8, None) == 0.0 and moved_hit_rate(0.8, 0.5) == 0.4


def test_a_target_already_past_its_capacity_takes_nothing() -> None:
    s = split(10, 0.0, [target("full", 10, 100), target("free", 100, 0)])
    assert s.moved_rps["full"] == 0.0 and s.moved_rps["free"] == pytest.approx(10)


@given(
    moved=st.floats(0, 1000),
    bases=st.lists(st.floats(1, 500), min_size=1, max_size=4),
    loads=st.lists(st.floats(0, 300), min_size=4, max_size=4),
    hit=st.floats(0, 1),
)
def test_no_target_passes_cbu_one_and_nothing_is_lost(
    moved: float, bases: list[float], loads: list[float], hit: float
) -> None:
    ts = [target(f"t{i}", b, loads[i]) for i, b in enumerate(bases)]
    s = split(moved, hit, ts)
    for t in ts:
        assert s.cbu_after[t.name] <= max(1.0, t.cbu()) + 1e-9
    assert sum(s.moved_rps.values()) + s.shortfall_rps == pytest.approx(moved, abs=1e-6)
    assert all(v >= 0 for v in s.moved_rps.values())
