"""A generation streamed as vLLM streams it: server-sent events, the role chunk with
the first engine output, an injected error in band, the usage chunk, ``[DONE]``; and
the speculative-decoding counters fed as the tokens pass."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Callable

from aiohttp import web

from regions.simulator.engine import Token
from regions.simulator.metrics import SpecDecodeStats
from regions.simulator.protocol import Json, dumps, error_body

log = logging.getLogger("tectonic.simulator")


def sse(payload: Json) -> bytes:
    return b"data: " + dumps(payload).encode() + b"\n\n"


def stream_error_event() -> bytes:
    """vLLM's in-band error for an engine error mid-stream (its
    ``create_streaming_error_response``), spaced as its ``json.dumps`` writes it."""
    body = error_body("Internal server error (injected)", "InternalServerError", 500)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def stream_events(
    request: web.Request,
    generate: Callable[[], AsyncGenerator[Token]],
    *,
    first: Json | None,
    chunk: Callable[[Token], list[Json]],
    usage_chunk: Callable[[list[Token]], Json] | None,
    error_due: Callable[[int], bool],
) -> web.StreamResponse:
    """Stream ``generate()``'s tokens as events: ``first`` before the first one (the chat
    role chunk), ``chunk(token)`` for each, ``usage_chunk(tokens)`` at the end (when
    asked for and nothing failed); an error event instead of the next output token once
    ``error_due(tokens sent)``."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    tokens: list[Token] = []
    sent = 0  # output tokens written
    failed = False
    stream = generate()
    try:
        async for t in stream:
            if t.token_id is not None and error_due(sent):
                await resp.write(stream_error_event())
                failed = True
                break
            if first is not None and not tokens:
                # vLLM sends the role chunk with the first engine output, i.e. after
                # queueing and prefill: a client's first byte includes the prefill.
                await resp.write(sse(first))
            tokens.append(t)
            if t.token_id is not None:
                sent += 1
            for payload in chunk(t):
                await resp.write(sse(payload))
        if usage_chunk is not None and not failed:  # vLLM's usage chunk never follows an error
            await resp.write(sse(usage_chunk(tokens)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionError:
        log.debug("client went away mid-stream")
    finally:
        await stream.aclose()
    return resp


async def count_drafts(
    stream: AsyncGenerator[Token], spec: SpecDecodeStats
) -> AsyncGenerator[Token]:
    """Pass the tokens on, counting every decode token into its draft (vLLM counts per
    step; the totals agree)."""
    n = 0
    try:
        async for t in stream:
            if t.token_id is not None:
                if n:  # the first token comes from prefill, not from a draft
                    spec.observe_decode_token(n - 1)
                n += 1
            yield t
    finally:
        await stream.aclose()  # the engine releases the sequence now, not at GC
