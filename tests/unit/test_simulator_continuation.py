"""The simulator continues a cut generation as a greedy vLLM does: a stream cut after k
tokens and re-sent with its text so far (chat: ``continue_final_message``; completions:
prompt + text) ends exactly as the uncut one. Also vLLM's refusal of that flag with
``add_generation_prompt``, and the ``stream_error_after`` fault (vLLM's in-band error)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from regions.simulator.engine import EngineConfig
from regions.simulator.server import SimConfig, serve
from regions.simulator.tokenizer import BOTH_GENERATION_FLAGS, Tokenizer, render_chat

JsonObj = dict[str, Any]  # decoded JSON, checked by the asserts
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MESSAGES: list[JsonObj] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "Which region is warm?"},
]
PAIRS = [(m["role"], m["content"]) for m in MESSAGES]
BOTH_SENT = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
STREAM_ERROR = (
    b'data: {"error": {"message": "Internal server error (injected)", '
    b'"type": "InternalServerError", "param": null, "code": 500}}'
)


# -- the model, no server --------------------------------------------------------------------
@given(
    context=st.text(max_size=400),
    n=st.integers(1, 40),
    k=st.integers(0, 40),
    seed=st.integers(0, 3),
)
def test_generation_resumed_from_its_own_text_goes_on_unchanged(
    context: str, n: int, k: int, seed: int
) -> None:
    k = min(k, n)
    tok = Tokenizer()
    whole = tok.generate(context, n, seed=seed)
    head = tok.generate(context, k, seed=seed)
    rest = tok.generate(context + "".join(head), n - k, seed=seed)
    assert head + rest == whole


def test_generation_depends_on_the_text_and_the_seed() -> None:
    tok = Tokenizer()
    outputs = {"".join(tok.generate(f"prompt {i}", 8)) for i in range(20)}
    assert len(outputs) > 15  # different prompts, (nearly always) different text
    assert tok.generate("same", 8, seed=0) != tok.generate("same", 8, seed=1)


def test_an_open_final_message_renders_as_the_prompt_plus_the_partial_reply() -> None:
    partial = " the region"
    continued = render_chat(
        [*PAIRS, ("assistant", partial)], add_generation_prompt=False, continue_final_message=True
    )
    assert continued == render_chat(PAIRS) + partial
    with pytest.raises(ValueError, match="not compatible"):
        render_chat(PAIRS, continue_final_message=True)  # add_generation_prompt defaults true


# -- over HTTP, in process ------------------------------------------------------------------
@dataclass
class Sim:
    url: str
    http: aiohttp.ClientSession


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[Sim]:
    engine = EngineConfig(prefill_tokens_per_s=1e9, decode_tokens_per_s=1e5)
    runner, _, port = await serve(SimConfig(engine=engine), "127.0.0.1", 0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        yield Sim(f"http://127.0.0.1:{port}", http)
    await runner.cleanup()


async def post(sim: Sim, path: str, payload: JsonObj, status: int = 200) -> JsonObj:
    async with sim.http.post(sim.url + path, json=payload) as r:
        text = await r.text()
        assert r.status == status, text
        body = json.loads(text)
        assert isinstance(body, dict), text
        return body


async def stream_events(sim: Sim, path: str, payload: JsonObj) -> list[bytes]:
    """The SSE events of a streamed request, each ``data: ...`` without its blank line."""
    async with sim.http.post(sim.url + path, json={**payload, "stream": True}) as r:
        assert r.status == 200, await r.text()
        body = await r.read()
    assert body.endswith(b"\n\n"), body
    return body.removesuffix(b"\n\n").split(b"\n\n")


def stream_pieces(events: list[bytes], path: str) -> tuple[list[str], str | None]:
    """A streamed answer's text pieces (one per token) and its finish_reason."""
    assert events[-1] == b"data: [DONE]"
    pieces: list[str] = []
    finish = None
    for event in events[:-1]:
        chunk = json.loads(event.removeprefix(b"data: "))
        for choice in chunk["choices"]:
            piece = choice["text"] if path == COMPLETIONS else choice["delta"]["content"]
            if piece:
                pieces.append(piece)
            finish = choice["finish_reason"] or finish
    return pieces, finish


async def streamed(sim: Sim, path: str, payload: JsonObj) -> tuple[list[str], str | None]:
    return stream_pieces(await stream_events(sim, path, payload), path)


def continued_chat(pieces: list[str], **kw: object) -> JsonObj:
    """The request that continues a chat reply cut after ``pieces``."""
    partial = {"role": "assistant", "content": "".join(pieces)}
    return {
        "messages": [*MESSAGES, partial],
        "continue_final_message": True,
        "add_generation_prompt": False,
        **kw,
    }


@pytest.mark.parametrize("cut", [1, 5, 11])
async def test_a_cut_chat_reply_continued_ends_as_the_uncut_one(sim: Sim, cut: int) -> None:
    whole, finish = await streamed(sim, CHAT, {"messages": MESSAGES, "max_tokens": 12})
    assert len(whole) == 12 and finish == "length"
    rest, rest_finish = await streamed(sim, CHAT, continued_chat(whole[:cut], max_tokens=12 - cut))
    assert whole[:cut] + rest == whole and rest_finish == finish


async def test_a_continued_chat_reply_without_a_limit_stops_where_the_uncut_one_does(
    sim: Sim,
) -> None:
    whole, finish = await streamed(sim, CHAT, {"messages": MESSAGES})
    assert (len(whole), finish) == (16, "stop")  # the simulated model's own length
    rest, rest_finish = await streamed(sim, CHAT, continued_chat(whole[:6]))
    assert (whole[:6] + rest, rest_finish) == (whole, "stop")
    body = await post(sim, CHAT, continued_chat(whole[:6]))  # not streamed: the same
    assert body["choices"][0]["message"]["content"] == "".join(rest)


@pytest.mark.parametrize("cut", [1, 4, 9])
async def test_a_cut_completion_continued_from_prompt_plus_text_ends_as_the_uncut_one(
    sim: Sim, cut: int
) -> None:
    prompt = "The region is healthy and"
    whole, _ = await streamed(sim, COMPLETIONS, {"prompt": prompt, "max_tokens": 10})
    assert len(whole) == 10
    resumed = {"prompt": prompt + "".join(whole[:cut]), "max_tokens": 10 - cut}
    rest, finish = await streamed(sim, COMPLETIONS, resumed)
    assert whole[:cut] + rest == whole and finish == "length"


async def test_a_token_id_prompt_is_continued_as_its_decoded_text(sim: Sim) -> None:
    prompt = "Prefix caches stay hot"
    ids = (await post(sim, "/tokenize", {"prompt": prompt}))["tokens"]  # a BOS first
    by_text = await post(sim, COMPLETIONS, {"prompt": prompt, "max_tokens": 6})
    by_ids = await post(sim, COMPLETIONS, {"prompt": ids, "max_tokens": 6})
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]


async def test_tokenize_renders_an_open_final_message(sim: Sim) -> None:
    partial = " the region"
    opened = await post(sim, "/tokenize", continued_chat([partial]))
    closed = await post(sim, "/tokenize", {"messages": MESSAGES})
    as_text = await post(sim, "/tokenize", {"prompt": render_chat(PAIRS) + partial})
    assert opened["tokens"] == as_text["tokens"] != closed["tokens"]


@pytest.mark.parametrize("path", [CHAT, "/tokenize"])
async def test_continue_final_message_with_a_generation_prompt_is_refused(
    sim: Sim, path: str
) -> None:
    both = {"messages": MESSAGES, "continue_final_message": True}
    sent = await post(sim, path, {**both, "add_generation_prompt": True}, status=400)
    assert sent == {
        "error": {"message": BOTH_SENT, "type": "BadRequestError", "param": None, "code": 400}
    }
    # Left at its default (true), the chat template refuses it, as transformers' does.
    defaulted = await post(sim, path, both, status=400)
    assert defaulted["error"]["message"] == BOTH_GENERATION_FLAGS
    assert (defaulted["error"]["type"], defaulted["error"]["code"]) == ("BadRequestError", 400)


# -- the stream_error_after fault ----------------------------------------------------------
@pytest.fixture
async def stream_error_after_3(sim: Sim) -> AsyncIterator[None]:
    fault = await post(sim, "/_sim/fault", {"stream_error_after": 3})
    assert fault["stream_error_after"] == 3
    yield
    async with sim.http.delete(sim.url + "/_sim/fault") as r:
        assert r.status == 200


@pytest.mark.usefixtures("stream_error_after_3")
async def test_a_stream_reaching_the_fault_gets_vllms_in_band_error_then_done(sim: Sim) -> None:
    usage = {"stream_options": {"include_usage": True}, "max_tokens": 8}
    events = await stream_events(sim, COMPLETIONS, {"prompt": "stream me", **usage})
    assert len(events) == 5 and events[-2:] == [STREAM_ERROR, b"data: [DONE]"]
    pieces, _ = stream_pieces([*events[:3], b"data: [DONE]"], COMPLETIONS)
    assert len(pieces) == 3
    events = await stream_events(sim, CHAT, {"messages": MESSAGES, **usage})
    role, *content, error, done = events
    assert json.loads(role.removeprefix(b"data: "))["choices"][0]["delta"]["role"] == "assistant"
    assert (len(content), error, done) == (3, STREAM_ERROR, b"data: [DONE]")  # no usage chunk


@pytest.mark.usefixtures("stream_error_after_3")
async def test_the_stream_error_fault_spares_short_and_unstreamed_requests(sim: Sim) -> None:
    pieces, finish = await streamed(sim, COMPLETIONS, {"prompt": "short", "max_tokens": 3})
    assert (len(pieces), finish) == (3, "length")  # nothing left to cut
    body = await post(sim, COMPLETIONS, {"prompt": "whole", "max_tokens": 8})
    assert body["usage"]["completion_tokens"] == 8


async def test_stream_error_after_zero_fails_before_any_output(sim: Sim) -> None:
    await post(sim, "/_sim/fault", {"stream_error_after": 0})
    try:
        events = await stream_events(sim, CHAT, {"messages": MESSAGES, "max_tokens": 4})
    finally:
        async with sim.http.delete(sim.url + "/_sim/fault") as r:
            assert r.status == 200
    assert events == [STREAM_ERROR, b"data: [DONE]"]  # not even the role chunk
    await post(sim, "/_sim/fault", {"stream_error_after": -1}, status=400)
    pieces, _ = await streamed(sim, CHAT, {"messages": MESSAGES, "max_tokens": 4})
    assert len(pieces) == 4  # cleared
