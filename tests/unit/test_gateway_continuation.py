"""The pure half of stream continuation: which requests may be continued, what the
client had when the stream broke, the request that goes on from there, and the
continuation's events spliced into the client's stream."""

from __future__ import annotations

import json

import pytest

from regions.dataplane.requests import Endpoint
from regions.gateway.continuation import (
    FOLD_BYTES,
    Broken,
    Partial,
    Splice,
    Transcript,
    continuation_body,
    refusal,
    split_events,
)

CHAT = Endpoint.CHAT
COMPLETIONS = Endpoint.COMPLETIONS
ID = "chatcmpl-abc"


def sse(event: object) -> bytes:
    return b"data: " + (event if isinstance(event, bytes) else json.dumps(event).encode()) + b"\n\n"


def chat_chunk(content: str | None = None, role: bool = False, finish: str | None = None) -> bytes:
    delta: dict[str, object] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse({"id": ID, "object": "chat.completion.chunk", "created": 7, "choices": [choice]})


def recorded(*chunks: bytes, endpoint: Endpoint = CHAT) -> Partial:
    t = Transcript(endpoint)
    for c in chunks:
        t.add(c)
    return t.partial()


@pytest.mark.parametrize(
    ("endpoint", "body", "why"),
    [
        (CHAT, {"messages": [], "n": 2}, "more than one choice"),
        (CHAT, {"messages": [], "tools": [{"type": "function"}]}, "tool calls"),
        (CHAT, {"messages": [], "response_format": {"type": "json_schema"}}, "structured"),
        (CHAT, {"messages": [], "guided_regex": "a+"}, "structured output"),
        (CHAT, {"messages": [], "continue_final_message": True}, "continues a message"),
        (COMPLETIONS, {"prompt": "x", "echo": True}, "echo"),
        (COMPLETIONS, {"prompt": [1, 2, 3]}, "single text prompt"),
        (COMPLETIONS, {"prompt": ["a", "b"]}, "single text prompt"),
    ],
)
def test_requests_that_cannot_be_continued_exactly_are_named(
    endpoint: Endpoint, body: dict[str, object], why: str
) -> None:
    reason = refusal(endpoint, body)
    assert reason is not None and why in reason


def test_plain_chat_and_text_completions_may_be_continued() -> None:
    assert refusal(CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 1}) is None
    assert refusal(CHAT, {"messages": [], "response_format": {"type": "text"}}) is None
    assert refusal(COMPLETIONS, {"prompt": "once"}) is None
    assert refusal(COMPLETIONS, {"prompt": ["once"]}) is None


def test_events_split_across_chunks_and_crlf_are_read_whole() -> None:
    events, rest = split_events(b'data: {"a": 1}\r\n\r\ndata: [DONE]\n\ndata: {"b"')
    assert events == [b'{"a": 1}', b"[DONE]"] and rest == b'data: {"b"'
    whole = chat_chunk("hel") + chat_chunk("lo")
    p = recorded(chat_chunk(role=True, content=""), whole[:10], whole[10:])
    assert "".join(p.text) == "hello" and p.tokens == 2 and p.role_sent and p.id == ID
    assert not p.finished and not p.done and p.refusal() is None


def test_a_long_stream_is_folded_in_batches_and_keeps_every_piece() -> None:
    t = Transcript(CHAT)
    pieces = [f"w{i} " for i in range(3000)]  # ~350 KB of events: several folds
    for piece in pieces:
        t.add(chat_chunk(piece))
    assert sum(len(c) for c in t._raw) <= FOLD_BYTES + 200  # never the whole stream
    p = t.partial()
    assert "".join(p.text) == "".join(pieces) and p.tokens == 3000


def test_what_was_sent_can_make_a_stream_unsafe_or_already_whole() -> None:
    tool = sse({"id": ID, "choices": [{"index": 0, "delta": {"tool_calls": [{"id": "t"}]}}]})
    assert "tool calls" in (recorded(chat_chunk(role=True), tool).refusal() or "")
    assert "an error event" in (recorded(chat_chunk("a"), sse({"error": {}})).refusal() or "")
    assert recorded(b"data: not json\n\n").refusal() == "no event reached the client"
    half = chat_chunk("b")[:30]
    assert "half an event" in (recorded(chat_chunk("a"), half).refusal() or "")
    two = sse({"id": ID, "choices": [{"index": 1, "delta": {"content": "b"}}]})
    assert "more than one choice" in (recorded(chat_chunk("a"), two).refusal() or "")
    empty_tools = sse({"id": ID, "choices": [{"index": 0, "delta": {"tool_calls": []}}]})
    assert recorded(chat_chunk("a"), empty_tools).refusal() is None
    assert recorded().refusal() == "no event reached the client"
    assert recorded(chat_chunk("a"), chat_chunk(finish="stop")).finished
    assert recorded(chat_chunk("a"), sse(b"[DONE]")).done


def test_text_with_quotes_and_keys_in_it_is_read_as_text() -> None:
    tricky = 'say "content": "x" and \\ then \u00e9'
    p = recorded(chat_chunk(tricky), chat_chunk('"text": "y"'))
    assert "".join(p.text) == tricky + '"text": "y"' and p.tokens == 2 and p.refusal() is None
    done = sse({"id": "cmpl-9", "created": 5, "choices": [{"index": 0, "text": "ab"}]})
    c = recorded(
        done, sse({"id": "cmpl-9", "choices": [{"index": 0, "text": "c"}]}), endpoint=COMPLETIONS
    )
    assert "".join(c.text) == "abc" and c.id == "cmpl-9" and c.created == 5


def test_a_chat_continuation_asks_to_continue_the_partial_assistant_message() -> None:
    data = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 10,
        "temperature": 0,
        "seed": 3,
        "cache_salt": "s",
        "stream": True,
    }
    p = recorded(chat_chunk(role=True, content=""), chat_chunk("Hel"), chat_chunk("lo"))
    body = json.loads(continuation_body(CHAT, data, p, generated=2))
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert body["messages"][:-1] == data["messages"]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 8 and body["stream_options"] == {"include_usage": True}
    assert {k: body[k] for k in ("model", "temperature", "seed", "cache_salt")} == {
        "model": "m",
        "temperature": 0,
        "seed": 3,
        "cache_salt": "s",
    }


def test_a_completion_continuation_sends_the_prompt_and_the_text_so_far() -> None:
    p = Partial(id="cmpl-1", text=["one", " two"], tokens=2)
    body = json.loads(continuation_body(COMPLETIONS, {"prompt": ["Count:"], "min_tokens": 5}, p, 2))
    assert body["prompt"] == "Count:one two"
    assert body["max_tokens"] == 14  # of vLLM's default 16
    assert body["min_tokens"] == 3
    spent = Partial(id="c", text=["x"] * 20, tokens=20)
    assert (
        json.loads(continuation_body(COMPLETIONS, {"prompt": "p", "max_tokens": 4}, spent, 20))[
            "max_tokens"
        ]
        == 1
    )


def test_the_splice_keeps_one_stream_id_drops_the_second_role_and_sums_usage() -> None:
    p = recorded(chat_chunk(role=True, content=""), chat_chunk("Hel"), chat_chunk("lo"))
    splice = Splice(p, want_usage=True, generated=2)
    other = {"id": "chatcmpl-other", "object": "chat.completion.chunk", "created": 99}
    upstream = (
        sse({**other, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        + sse({**other, "choices": [{"index": 0, "delta": {"role": "assistant", "content": " w"}}]})
        + sse({**other, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        + sse(
            {
                **other,
                "choices": [],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
            }
        )
        + sse(b"[DONE]")
    )
    out = b"".join(b"".join(splice.feed(upstream[i : i + 7])) for i in range(0, len(upstream), 7))
    events, rest = split_events(out)
    assert rest == b"" and events[-1] == b"[DONE]" and splice.done
    parsed = [json.loads(e) for e in events[:-1]]
    assert all(e["id"] == ID and e["created"] == 7 for e in parsed)
    assert parsed[0]["choices"][0]["delta"] == {"content": " w"}  # the role chunk is gone
    assert parsed[1]["choices"][0]["finish_reason"] == "stop"
    # the text already generated was the continuation's prompt: it counts as completion
    assert parsed[2]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def test_usage_the_client_did_not_ask_for_is_dropped_and_an_error_event_breaks() -> None:
    p = recorded(chat_chunk(role=True, content=""), chat_chunk("a"))
    splice = Splice(p, want_usage=False, generated=1)
    usage_only = sse({"id": "x", "choices": [], "usage": {"prompt_tokens": 1}})
    assert list(splice.feed(usage_only)) == []
    with pytest.raises(Broken):
        list(
            Splice(p, want_usage=False, generated=1).feed(
                sse({"error": {"message": "engine dead"}})
            )
        )
