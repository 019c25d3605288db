"""Pure sticky-session resolution: move once, never bounce back, agree across gateways."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.core.model import Routing
from controlplane.core.sessions import NoRegionServing, PinAction, SessionPin, resolve

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
