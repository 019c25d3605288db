"""Pure sticky-session resolution: move once, never bounce back, agree across gateways."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.resolve import (
    NoRegionServing,
    PinAction,
    SessionPin,
    WarmCheck,
    pick_region,
    placement,
    repinned,
    resolve,
    self_routed,
    warm_first,
)

NORMAL = {r: Routing(targets={r: 1.0}) for r in ("east", "west", "central")}
EAST_DOWN = {**NORMAL, "east": Routing(targets={"west": 0.6, "central": 0.4}, epoch=1)}
EAST_RECOVERING = {
    **NORMAL,
    "east": Routing(targets={"east": 0.5, "west": 0.3, "central": 0.2}, epoch=3),
}
EAST_BACK = {**NORMAL, "east": Routing(targets={"east": 1.0}, epoch=4)}


def test_new_session_is_created_on_its_home_region() -> None:
    r = resolve(None, "s1", "east", NORMAL, now=1.0)
    assert (r.region, r.action, r.pin.home, r.pin.epoch) == ("east", PinAction.CREATE, "east", 0)


@given(st.text(min_size=1, max_size=40))
def test_moves_once_then_stays_through_recovery(session_id: str) -> None:
    pin = resolve(None, session_id, "east", NORMAL, now=1.0).pin
    assert resolve(pin, session_id, "east", NORMAL, now=2.0).action is PinAction.KEEP
    moved = resolve(pin, session_id, "east", EAST_DOWN, now=3.0)
    assert moved.action is PinAction.REPIN and moved.region in ("west", "central")
    assert moved.pin.moves == 1 and moved.pin.epoch == 1 and moved.pin.home == "east"
    for routings in (EAST_DOWN, EAST_RECOVERING, EAST_BACK):  # never bounces back
        again = resolve(moved.pin, session_id, "east", routings, now=9.0)
        assert again.action is PinAction.KEEP and again.region == moved.region


def test_two_gateways_pick_the_same_region_and_weights_are_honoured() -> None:
    picks = [resolve(None, f"s{i}", "east", EAST_DOWN, now=1.0).region for i in range(4000)]
    again = [resolve(None, f"s{i}", "east", EAST_DOWN, now=5.0).region for i in range(4000)]
    assert picks == again
    share = picks.count("west") / len(picks)
    assert 0.55 < share < 0.65  # weight 0.6


def test_a_chain_of_failovers_follows_only_serving_regions() -> None:
    both_down = {**EAST_DOWN, "west": Routing(targets={"central": 1.0}, epoch=2)}
    assert {resolve(None, f"s{i}", "east", both_down, 1.0).region for i in range(50)} == {"central"}
    pin = SessionPin(home="east", region="west", epoch=1, pinned_at=0.0, moves=1)
    r = resolve(pin, "x", "east", both_down, 2.0)
    assert r.region == "central" and r.pin.moves == 2


def test_nothing_serving_raises() -> None:
    dead = {"east": Routing(targets={"west": 1.0}), "west": Routing(targets={"east": 1.0})}
    with pytest.raises(NoRegionServing):
        resolve(None, "s", "east", dead, 1.0)


# ---- a re-pin is the placement's pick: one decision for every path that re-pins ------
NAMES = ("east", "west", "central", "eu")
weights = st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=10.0))
routing_maps = st.dictionaries(
    st.sampled_from(NAMES),
    st.builds(
        Routing,
        targets=st.dictionaries(st.sampled_from(NAMES), weights, max_size=4),
        epoch=st.integers(0, 50),
    ),
)
pins = st.builds(
    SessionPin,
    home=st.sampled_from(NAMES),
    region=st.sampled_from(NAMES),
    epoch=st.integers(0, 50),
    pinned_at=st.floats(0, 1e10),
    moves=st.integers(0, 5),
)


@given(routing_maps, pins, st.text(min_size=1, max_size=40), st.floats(0, 1e10))
def test_a_repin_is_the_placement_pick_and_repinned(
    routings: dict[str, Routing], pin: SessionPin, session_id: str, now: float
) -> None:
    """``resolve``'s REPIN is ``placement(...).pick`` and ``repinned``, and
    ``pick_region`` (for a sessionless request) picks the same region."""
    where = placement(routings, pin.home)
    try:
        lazy = resolve(pin, session_id, pin.home, routings, now)
    except NoRegionServing:
        assert not self_routed(routings, pin.region)
        with pytest.raises(NoRegionServing):
            where.pick(session_id)
        return
    if self_routed(routings, pin.region):
        assert lazy.action is PinAction.KEEP and lazy.pin == pin
        return
    region = where.pick(session_id)
    assert region == pick_region(routings, pin.home, session_id)
    assert lazy.action is PinAction.REPIN and lazy.region == region
    assert lazy.pin == repinned(pin, region, where.epoch, now)


def test_a_placement_lists_only_serving_targets_by_name() -> None:
    both_down = {**EAST_DOWN, "west": Routing(targets={"central": 1.0}, epoch=2)}
    where = placement(both_down, "east")
    assert (where.home, where.epoch, where.targets, where.total) == (
        "east",
        1,
        (("central", 0.4),),
        0.4,
    )
    assert placement(NORMAL, "nowhere").targets == (("nowhere", 1.0),)  # no routing yet


def test_spill_goes_to_a_serving_region_of_the_same_zone_chosen_by_the_session() -> None:
    from controlplane.kernel.model import Routing
    from controlplane.kernel.sessions.resolve import spill_region

    zones = {"east": "us", "west": "us", "central": "us", "eu": "eu"}
    routings = {"central": Routing(targets={"west": 1.0}, epoch=2)}  # central failed over
    picks = {spill_region(routings, zones, "east", f"s{i}") for i in range(50)}
    assert picks == {"west"}  # not itself, not a failed-over region, not another zone
    both = {spill_region({}, zones, "east", f"s{i}") for i in range(50)}
    assert both == {"west", "central"}  # spread over the candidates ...
    assert spill_region({}, zones, "east", "s7") == spill_region(
        {}, zones, "east", "s7"
    )  # ... stably
    assert spill_region({}, zones, "eu", "s1") is None  # no other region in its zone


# ---- warm first ---------------------------------------------------------------------------


def warm_in(*regions: str) -> WarmCheck:
    return lambda region: region in regions


def test_warm_first_places_a_new_session_away_from_a_cold_home() -> None:
    where = placement(EAST_RECOVERING, "east")
    ids = [f"s{i}" for i in range(400)]
    homed = [s for s in ids if where.pick(s) == "east"]
    assert len(homed) > 100  # weight 0.5
    # east cold: the other targets by their weights (west 0.3 : central 0.2), the same
    # choice every time
    spread = [warm_first(where, s, "east", warm_in()) for s in homed]
    assert set(spread) == {"west", "central"}
    assert spread == [warm_first(where, s, "east", warm_in("west")) for s in homed]
    assert 0.5 < spread.count("west") / len(spread) < 0.7
    for s in homed:  # east warm: the weights decide
        assert warm_first(where, s, "east", warm_in("east")) == "east"
    # a pick that is not home is never steered, warm or not
    away = [s for s in ids if where.pick(s) != "east"]
    assert all(warm_first(where, s, where.pick(s), warm_in()) == where.pick(s) for s in away)


def test_warm_first_changes_nothing_without_a_choice_or_for_a_pinned_session() -> None:
    cold_home = warm_in("west", "central")
    for routings in (NORMAL, EAST_BACK):  # one target: steady state, all at once
        assert resolve(None, "s1", "east", routings, 1.0, cold_home).region == "east"
    pin = SessionPin(home="east", region="east", epoch=3, pinned_at=0.0)
    kept = resolve(pin, "s1", "east", EAST_RECOVERING, 2.0, cold_home)
    assert kept.action is PinAction.KEEP and kept.region == "east"


def test_resolve_creates_the_warm_pin_and_keeps_home_and_epoch() -> None:
    where = placement(EAST_RECOVERING, "east")
    s = next(f"s{i}" for i in range(100) if where.pick(f"s{i}") == "east")
    r = resolve(None, s, "east", EAST_RECOVERING, 1.0, warm_in("west"))
    assert (r.region, r.action) == ("west", PinAction.CREATE)
    assert (r.pin.home, r.pin.region, r.pin.epoch, r.pin.moves) == ("east", "west", 3, 0)
