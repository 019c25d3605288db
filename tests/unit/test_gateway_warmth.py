"""The gateway's memory of warm prompts per region, and the warm-up request it sends."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from controlplane.kernel.model import Routing
from regions.gateway.prompt_memory import PromptMemory
from regions.gateway.warmth import RegionWarmth, warmup_body


def test_a_region_is_warm_for_what_it_answered_and_the_memory_is_bounded() -> None:
    w = RegionWarmth(max_keys=3)
    for key in (1, 2, 3):
        w.served("east", key)
    w.served("east", 1)  # already known: no reordering, no growth
    assert [w.is_warm("east", k) for k in (1, 2, 3)] == [True, True, True]
    assert not w.is_warm("west", 1)
    w.served("east", 4)  # over the bound: the oldest goes
    assert not w.is_warm("east", 1) and w.is_warm("east", 4) and w.count("east") == 3
    with pytest.raises(ValueError, match="max_keys"):
        RegionWarmth(max_keys=0)


def test_a_region_that_stops_serving_is_forgotten_and_others_are_kept() -> None:
    w = RegionWarmth()
    w.served("east", 1)
    w.served("west", 1)
    w.routing_changed({"east": Routing(targets={"east": 0.3, "west": 0.7})})
    assert w.is_warm("east", 1)  # still serving (recovering)
    w.routing_changed({"east": Routing(targets={"west": 1.0})})  # failed over
    assert not w.is_warm("east", 1) and w.count("east") == 0
    assert w.is_warm("west", 1)  # no routing/west: serves itself


def test_the_warm_up_asks_for_one_token_of_the_same_prompt_without_streaming() -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 50,
        "n": 2,
        "cache_salt": "tenant-a",
    }
    replay = json.loads(warmup_body(json.dumps(body).encode()) or b"")
    assert replay == {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "cache_salt": "tenant-a",
        "max_tokens": 1,
    }
    assert warmup_body(b"[1, 2]") is None and warmup_body(b"{nope") is None


def test_an_answer_to_a_request_sent_before_the_region_was_forgotten_is_ignored() -> None:
    w = RegionWarmth()
    before = w.generation("east")
    w.served("east", 1)
    w.routing_changed({"east": Routing(targets={"west": 1.0})})  # failed over
    w.served("east", 2, before)  # in flight across the failover: its cache may be gone
    assert not w.is_warm("east", 2) and w.generation("east") == before + 1
    w.served("east", 3, w.generation("east"))
    assert w.is_warm("east", 3)


HEADERS = [("x-tenant", "tenant-a")]  # no credential: replays never keep one


def test_prompt_memory_keeps_the_popular_prompts_within_its_bytes() -> None:
    body = b"x" * 100
    size = len(body) + len("/v1/completions") + len("x-tenant") + len("tenant-a")
    memory = PromptMemory(max_bytes=3 * size)
    for _ in range(5):
        memory.answered("east", 1, "/v1/completions", HEADERS, body)  # popular
    for key in (2, 3):
        memory.answered("east", key, "/v1/completions", HEADERS, body)
    assert memory.count("east") == 3 and memory.size("east") == 3 * size
    memory.answered("east", 4, "/v1/completions", HEADERS, body)  # over: a one-off goes
    assert memory.count("east") == 3 and memory.size("east") == 3 * size
    assert memory.knows(1) and not memory.knows(2) and memory.knows(4)
    ranked = memory.ranked("east", 2)
    assert ranked[0][0] == 1 and len(ranked) == 2
    assert ranked[0][1].headers == (("x-tenant", "tenant-a"),)
    assert memory.ranked("west", 5) == [] and not memory.knows(99)


def test_prompt_memory_keeps_the_first_answer_of_a_prompt_and_skips_a_huge_one() -> None:
    memory = PromptMemory(max_bytes=1000)
    memory.answered("east", 1, "/v1/completions", [("a", "1")], b"{}")
    for _ in range(2):  # the same prompt again: counted, the first copy kept
        memory.answered("east", 1, "/v1/completions", [("b", "2")], b"{ }")
    kept = memory.ranked("east", 1)[0][1]
    assert kept.hits == 3 and kept.headers == (("a", "1"),) and kept.body == b"{}"
    assert memory.size("east") == len("/v1/completions") + 2 + 2
    memory.answered("east", 2, "/v1/completions", [], b"y" * 2000)
    assert not memory.knows(2) and memory.count("east") == 1
    with pytest.raises(ValueError, match="max_bytes"):
        PromptMemory(max_bytes=0)


def test_each_outage_is_a_new_generation_even_when_nothing_was_answered_in_between() -> None:
    w = RegionWarmth()
    down = {"east": Routing(targets={"west": 1.0})}
    back = {"east": Routing(targets={"east": 1.0})}
    w.routing_changed(down)
    w.routing_changed(down)  # still down: the same outage
    assert w.generation("east") == 1
    w.routing_changed(back)  # back, and nothing answered there before it fails again
    w.routing_changed(down)
    assert w.generation("east") == 2 and w.generation("west") == 0


def test_only_the_regions_whose_routing_changed_are_looked_at_again() -> None:
    # The routing cache calls once per changed region with all of them: at 512
    # regions, looking at every one each time made start-up quadratic.
    w = RegionWarmth()
    routings = {f"r{i}": Routing(targets={f"r{i}": 1.0}) for i in range(512)}
    assert w.routing_changed(routings) == set(routings)
    assert w.routing_changed(routings) == set()  # nothing new
    routings = {**routings, "r7": Routing(targets={"r8": 1.0})}
    assert w.routing_changed(routings) == {"r7"}
    assert w.generation("r7") == 1
    routings = {r: routing for r, routing in routings.items() if r != "r7"}  # deleted
    assert w.routing_changed(routings) == {"r7"}  # it serves itself again
    routings = {**routings, "r7": Routing(targets={"r8": 1.0})}
    assert w.routing_changed(routings) == {"r7"}
    assert w.generation("r7") == 2  # a second outage


def test_the_calls_of_one_change_look_once() -> None:
    # The routing cache's first read: one call per region, each with the same mapping.
    w = RegionWarmth()
    routings = MappingProxyType({f"r{i}": Routing(targets={"r0": 1.0}) for i in range(512)})
    assert len(w.routing_changed(routings)) == 512
    assert w.routing_changed(routings) == set()
    assert w.generation("r1") == 1 and w.generation("r0") == 0
