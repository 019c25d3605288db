"""The gateway's degradation actuators as pure functions: shedding, the context cap
(reject, truncate, completions) and ``parallel_tool_calls`` off; a request nothing
applies to is forwarded as the client's own bytes. Plus the ``degradation/`` cache on
the in-memory store."""

from __future__ import annotations

import json

import pytest

from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import DegradationRecord, FeatureFlags
from controlplane.kernel.store.memory import MemoryStore
from regions.dataplane.actuators import (
    Action,
    Actuated,
    ActuatorConfig,
    Refusal,
    actuate,
    estimate_tokens,
    priority,
)
from regions.dataplane.degradation_cache import DegradationCache
from regions.dataplane.requests import Endpoint, ProxyRequest, parse

CFG = ActuatorConfig(chars_per_token=4.0, message_overhead_tokens=4)
WORD = "abcd "  # 5 characters: about 1.25 estimated tokens


def chat(messages: list[dict[str, object]], **extra: object) -> ProxyRequest:
    body = json.dumps({"model": "tiny", "messages": messages, **extra}).encode()
    return parse(Endpoint.CHAT, body, 64)


def completion(prompt: object) -> ProxyRequest:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 4}).encode()
    return parse(Endpoint.COMPLETIONS, body, 64)


def text(tokens: int) -> str:
    """About ``tokens`` estimated tokens (at 4 characters per token)."""
    return "x" * (tokens * 4)


def sent(acted: Actuated | Refusal) -> dict[str, object]:
    assert isinstance(acted, Actuated), acted
    data = json.loads(acted.body)
    assert isinstance(data, dict)
    return data


def estimate(messages: list[dict[str, object]]) -> int:
    return sum(estimate_tokens(len(str(m["content"])), 4.0) + 4 for m in messages)


# ---- nothing applies: the client's bytes ------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        FeatureFlags(),
        FeatureFlags(speculative_decoding=False),  # the agent's actuator, not the gateway's
        FeatureFlags(max_context_tokens=16384, parallel_tool_calls=False, shed_priority_below=0),
    ],
)
def test_a_request_no_actuator_acts_on_is_forwarded_byte_for_byte(flags: FeatureFlags) -> None:
    # Odd spacing and key order: a re-serialization would show.
    body = b'{ "messages": [{"role": "user", "content": "hi \\u00e9"}],  "model":"tiny" }'
    req = parse(Endpoint.CHAT, body, 64)
    acted = actuate(req, "east", flags, 0, CFG)
    assert isinstance(acted, Actuated)
    assert acted.body is body and acted.actions == ()


# ---- shedding ---------------------------------------------------------------------------


def test_a_lower_priority_is_shed_with_503_and_retry_after() -> None:
    flags = FeatureFlags(shed_priority_below=5)
    req = chat([{"role": "user", "content": "hi"}])
    acted = actuate(req, "east", flags, 4, CFG)
    assert isinstance(acted, Refusal)
    assert acted.status == 503 and acted.action is Action.SHED
    assert acted.retry_after_s == CFG.shed_retry_after_s
    assert "east" in acted.message and "below 5" in acted.message and "priority 4" in acted.message
    assert isinstance(actuate(req, "east", flags, 5, CFG), Actuated)  # not lower: served


def test_nothing_is_shed_without_the_flag() -> None:
    req = chat([{"role": "user", "content": "hi"}])
    acted = actuate(req, "east", FeatureFlags(max_context_tokens=100), -(10**9), CFG)
    assert isinstance(acted, Actuated) and acted.body is req.body


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, 7), ("3", 3), (" -2 ", -2), ("high", 7), ("", 7), ("batch", -1), ("Low", -1)],
)
def test_priority_comes_from_the_header_else_the_default(header: str | None, expected: int) -> None:
    assert priority(header, 7) == expected


def test_the_ladders_last_step_sheds_batch_and_nothing_unmarked() -> None:
    # shed-batch in runbooks/degradation.yaml: below_priority 0.
    flags = FeatureFlags(shed_priority_below=0)
    req = chat([{"role": "user", "content": "hi"}])
    assert isinstance(actuate(req, "east", flags, priority("batch", 0), CFG), Refusal)
    assert isinstance(actuate(req, "east", flags, priority(None, 0), CFG), Actuated)
    assert isinstance(actuate(req, "east", flags, priority("interactive", 0), CFG), Actuated)


# ---- context cap ------------------------------------------------------------------------


def test_over_the_cap_in_reject_mode_is_a_400_saying_why_and_what_to_do() -> None:
    req = chat([{"role": "user", "content": text(20_000)}])
    acted = actuate(req, "east", FeatureFlags(max_context_tokens=16384), 0, CFG)
    assert isinstance(acted, Refusal)
    assert acted.status == 400 and acted.action is Action.CONTEXT_REJECTED
    assert acted.param == "messages" and acted.retry_after_s is None
    msg = acted.message
    assert "east is degraded" in msg and "16384 tokens" in msg and "20004 tokens" in msg
    assert "estimated" in msg and "Shorten the conversation" in msg and "retry later" in msg


def test_under_the_cap_is_forwarded_unchanged() -> None:
    req = chat([{"role": "user", "content": text(1000)}])
    acted = actuate(req, "east", FeatureFlags(max_context_tokens=1004), 0, CFG)
    assert isinstance(acted, Actuated) and acted.body is req.body


def test_truncate_drops_the_oldest_whole_turns_and_keeps_system_and_the_last_turn() -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "t1 " + text(500)},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1 " + text(500)},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "t2 " + text(500)},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "t3 " + text(500)},
        {"role": "assistant", "content": "a3"},
        {"role": "user", "content": "last " + text(500)},
    ]
    flags = FeatureFlags(max_context_tokens=1100, context_cap_mode="truncate")
    acted = actuate(chat(messages, temperature=0.5), "east", flags, 0, CFG)
    assert isinstance(acted, Actuated) and acted.actions == (Action.CONTEXT_TRUNCATED,)
    data = sent(acted)
    kept = data["messages"]
    assert isinstance(kept, list)
    # Turn 1 (with its tool call and result, never split) and turn 2 are dropped.
    assert kept == [messages[0], *messages[7:]]
    assert estimate(kept) <= 1100 < estimate(messages)
    assert data["temperature"] == 0.5 and data["model"] == "tiny"  # the rest untouched


def test_truncate_that_cannot_fit_rejects() -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": text(100)},
        {"role": "user", "content": text(100)},
        {"role": "user", "content": text(2000)},  # the last turn alone is over the cap
    ]
    flags = FeatureFlags(max_context_tokens=1000, context_cap_mode="truncate")
    acted = actuate(chat(messages), "east", flags, 0, CFG)
    assert isinstance(acted, Refusal) and acted.status == 400
    assert "even with the older turns dropped" in acted.message
    assert "2108 tokens" in acted.message  # the system prompt and the last turn


def test_truncate_keeps_a_conversation_without_a_user_message_or_rejects() -> None:
    messages: list[dict[str, object]] = [{"role": "system", "content": text(2000)}]
    flags = FeatureFlags(max_context_tokens=1000, context_cap_mode="truncate")
    acted = actuate(chat(messages), "east", flags, 0, CFG)
    assert isinstance(acted, Refusal) and acted.status == 400


@pytest.mark.parametrize("mode", ["reject", "truncate"])
def test_a_long_completion_prompt_is_rejected_never_truncated(mode: str) -> None:
    flags = FeatureFlags.model_validate({"max_context_tokens": 1000, "context_cap_mode": mode})
    acted = actuate(completion(text(2000)), "east", flags, 0, CFG)
    assert isinstance(acted, Refusal) and acted.status == 400 and acted.param == "prompt"
    assert ("cannot be cut safely" in acted.message) == (mode == "truncate")


def test_completion_token_ids_count_exactly_and_a_batch_by_its_longest_prompt() -> None:
    flags = FeatureFlags(max_context_tokens=100)
    assert isinstance(actuate(completion(list(range(100))), "e", flags, 0, CFG), Actuated)
    assert isinstance(actuate(completion(list(range(101))), "e", flags, 0, CFG), Refusal)
    batch = ["short", text(101)]  # the first prompt fits, the second does not
    assert isinstance(actuate(completion(batch), "e", flags, 0, CFG), Refusal)


# ---- parallel tool calls ----------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


@pytest.mark.parametrize("client_value", [True, None, "absent"])
def test_parallel_tool_calls_is_forced_off_for_requests_with_tools(client_value: object) -> None:
    extra: dict[str, object] = {"tools": TOOLS}
    if client_value != "absent":
        extra["parallel_tool_calls"] = client_value
    req = chat([{"role": "user", "content": "héllo"}], **extra)
    acted = actuate(req, "east", FeatureFlags(parallel_tool_calls=False), 0, CFG)
    data = sent(acted)
    assert data["parallel_tool_calls"] is False and data["tools"] == TOOLS
    assert isinstance(acted, Actuated) and acted.actions == (Action.PARALLEL_TOOL_CALLS_OFF,)
    assert "héllo".encode() in acted.body  # not re-escaped


@pytest.mark.parametrize(
    "extra",
    [{}, {"tools": []}, {"tools": TOOLS, "parallel_tool_calls": False}],
    ids=["no-tools", "empty-tools", "already-off"],
)
def test_tool_flag_leaves_other_chat_requests_byte_for_byte(extra: dict[str, object]) -> None:
    req = chat([{"role": "user", "content": "hi"}], **extra)
    acted = actuate(req, "east", FeatureFlags(parallel_tool_calls=False), 0, CFG)
    assert isinstance(acted, Actuated) and acted.body is req.body and acted.actions == ()


def test_truncation_and_the_tool_flag_apply_together() -> None:
    messages: list[dict[str, object]] = [
        {"role": "user", "content": text(800)},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": text(300)},
    ]
    flags = FeatureFlags(
        max_context_tokens=500, context_cap_mode="truncate", parallel_tool_calls=False
    )
    acted = actuate(chat(messages, tools=TOOLS), "east", flags, 0, CFG)
    data = sent(acted)
    assert data["messages"] == messages[2:] and data["parallel_tool_calls"] is False
    assert isinstance(acted, Actuated)
    assert acted.actions == (Action.CONTEXT_TRUNCATED, Action.PARALLEL_TOOL_CALLS_OFF)


# ---- the degradation/ cache -------------------------------------------------------------


async def test_cache_serves_each_regions_flags_and_defaults_without_a_record(
    memory_store: MemoryStore,
) -> None:
    keys = Keys("unit")
    flags = FeatureFlags(max_context_tokens=16384, parallel_tool_calls=False)
    record = DegradationRecord(region="east", applied=("context_cap",), flags=flags, epoch=2)
    await memory_store.put(keys.degradation("east"), encode(record))
    cache = DegradationCache(memory_store, keys)
    await cache.load()
    assert cache.flags("east") == flags and cache.flags("west") == FeatureFlags()
    assert cache.records["east"] == record
    await memory_store.delete(keys.degradation("east"))
    await cache.load()
    assert cache.flags("east") == FeatureFlags()  # record gone: nothing degraded
