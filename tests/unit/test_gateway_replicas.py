"""Prefix-aware bounded-load consistent hashing (regions.dataplane.replicas): pure."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.ring import HashRing, prefix_key

REPLICAS = [f"http://10.0.0.{i}:8000" for i in range(1, 6)]
prompts = st.text(min_size=1, max_size=600)


@given(prompts)
def test_the_same_prefix_always_lands_on_the_same_replica(prompt: str) -> None:
    a, b = ReplicaBalancer(REPLICAS), ReplicaBalancer(list(reversed(REPLICAS)))
    key = prefix_key(prompt)
    assert a.choose(key) == b.choose(key) == a.ring.owner(key)  # order of listing is irrelevant


@given(st.text(min_size=256, max_size=256), st.text(max_size=200), st.text(max_size=200))
def test_only_the_first_characters_pick_the_replica(head: str, tail1: str, tail2: str) -> None:
    assert prefix_key(head + tail1) == prefix_key(head + tail2)


def test_keys_spread_over_every_replica_within_a_few_tens_of_percent() -> None:
    ring = HashRing.build(REPLICAS)
    counts = dict.fromkeys(REPLICAS, 0)
    for i in range(20_000):
        owner = ring.owner(prefix_key(f"conversation {i}"))
        assert owner is not None
        counts[owner] += 1
    mean = 20_000 / len(REPLICAS)
    assert all(0.7 * mean < c < 1.3 * mean for c in counts.values()), counts


@settings(max_examples=25)
@given(st.integers(min_value=2, max_value=12))
def test_adding_a_replica_moves_about_one_in_n_keys_and_only_to_it(n: int) -> None:
    before = HashRing.build([f"r{i}" for i in range(n)])
    after = HashRing.build([f"r{i}" for i in range(n + 1)])
    keys = [prefix_key(f"p{i}") for i in range(4000)]
    moved = [(before.owner(k), after.owner(k)) for k in keys if before.owner(k) != after.owner(k)]
    assert all(new == f"r{n}" for _, new in moved)  # keys move only to the newcomer
    share = len(moved) / len(keys)
    assert share < 2.0 / (n + 1), share  # expected 1/(n+1), allow vnode variance


def test_a_busy_replica_spills_to_the_next_in_ring_order_and_back() -> None:
    b = ReplicaBalancer(REPLICAS)
    key = prefix_key("you are a helpful assistant")
    order = list(b.ring.walk(key))
    first = b.choose(key)
    assert first == order[0]
    b.acquire(first)  # 1 in flight on it: capacity for one more is ceil(1.25*2/5) = 1
    assert b.choose(key) == order[1]
    b.release(first)
    assert b.choose(key) == order[0]


@given(st.lists(prompts, min_size=1, max_size=300))
def test_no_replica_exceeds_the_load_bound(prompts_: list[str]) -> None:
    b = ReplicaBalancer(REPLICAS, load_factor=1.25)
    for p in prompts_:
        bound = math.ceil(1.25 * (sum(b.inflight.values()) + 1) / len(REPLICAS))
        chosen = b.choose(prefix_key(p))
        assert chosen is not None
        assert b.inflight[chosen] < bound
        b.acquire(chosen)


def test_one_hot_prefix_is_spread_but_stays_on_a_stable_few() -> None:
    b = ReplicaBalancer(REPLICAS)
    key = prefix_key("the same system prompt for everyone")
    picks = []
    for _ in range(40):
        r = b.choose(key)
        assert r is not None
        b.acquire(r)
        picks.append(r)
    assert max(b.inflight.values()) <= math.ceil(1.25 * 40 / 5)
    assert picks[0] == b.ring.owner(key)


def test_excluded_and_ejected_replicas_are_skipped() -> None:
    b = ReplicaBalancer(REPLICAS)
    key = prefix_key("retry me")
    order = list(b.ring.walk(key))
    assert b.choose(key, exclude={order[0]}) == order[1]
    b.eject(order[0], until=10.0)
    assert b.choose(key, now=5.0) == order[1]
    assert b.choose(key, now=10.0) == order[0]  # ejection over
    b.eject(order[0], until=10.0)
    b.readmit(order[0])
    assert b.choose(key, now=5.0) == order[0]


def test_all_ejected_still_yields_a_replica_and_all_excluded_yields_none() -> None:
    b = ReplicaBalancer(REPLICAS[:2])
    for r in REPLICAS[:2]:
        b.eject(r, until=100.0)
    assert b.choose(1, now=0.0) in REPLICAS[:2]
    assert b.choose(1, exclude=set(REPLICAS[:2])) is None
    assert ReplicaBalancer([]).choose(1) is None


def test_release_never_goes_negative_and_bad_parameters_are_refused() -> None:
    b = ReplicaBalancer(REPLICAS[:1])
    b.release(REPLICAS[0])
    assert b.inflight[REPLICAS[0]] == 0
    with pytest.raises(ValueError):
        ReplicaBalancer(REPLICAS, load_factor=0.9)
    with pytest.raises(ValueError):
        HashRing.build(REPLICAS, vnodes=0)


def test_duplicate_replica_urls_count_once() -> None:
    ring = HashRing.build([REPLICAS[0], REPLICAS[0], REPLICAS[1]])
    assert ring.replicas == (REPLICAS[0], REPLICAS[1])
    assert sorted(ring.walk(12345)) == sorted(REPLICAS[:2])
