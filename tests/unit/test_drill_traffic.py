"""The drills' synthetic traffic: a streamed answer counts only when it is whole."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from chaos.drills.traffic import REGION_HEADER, Traffic, stream_cut


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


CHUNK = _event({"id": "c1", "choices": [{"index": 0, "delta": {"content": "hi"}}]})
ERROR = _event({"error": {"message": "the replica failed mid-stream (127.0.0.1:8001)"}})
DONE = b"data: [DONE]\n\n"


def test_a_whole_stream_is_not_cut() -> None:
    assert stream_cut(CHUNK + CHUNK + DONE) == ""


def test_an_in_band_error_is_a_cut_named_without_the_address() -> None:
    assert stream_cut(CHUNK + ERROR) == "the replica failed mid-stream"


def test_a_stream_without_done_is_a_cut() -> None:
    assert stream_cut(CHUNK) == "no [DONE]"
    assert stream_cut(b"") == "no [DONE]"


def test_a_content_that_mentions_error_is_no_cut() -> None:
    said = _event({"choices": [{"index": 0, "delta": {"content": '"error"'}}]})
    assert stream_cut(said + DONE) == ""


def test_stream_share_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="stream_share"):
        Traffic({"a": "http://127.0.0.1:1"}, stream_share=1.5)


async def test_streamed_requests_count_whole_answers_and_cut_ones_apart() -> None:
    """Against a real HTTP server: every request streams (share 1); the server cuts
    every second stream, which the traffic must count as a failure."""
    seen: list[dict[str, object]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        resp = web.StreamResponse(headers={REGION_HEADER: "us-east"})
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        await resp.write(CHUNK)
        await resp.write(ERROR if len(seen) % 2 == 0 else DONE)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with TestServer(app, host="127.0.0.1") as server:
        # an hour's interval: the session's own loop (started by start) stays asleep
        url = str(server.make_url(""))
        traffic = Traffic({"us-east": url}, stream_share=1.0, interval_s=3600)
        (s,) = traffic.add(1, ["us-east"])
        await traffic.start()
        try:
            for _ in range(4):
                await traffic.send(s)
        finally:
            await traffic.stop()
    assert all(b["stream"] is True and b["max_tokens"] == 24 for b in seen)
    assert traffic.ok == 2
    assert [f.reason for f in traffic.failures] == ["stream cut: the replica failed mid-stream"] * 2
    assert s.served == ["us-east", "us-east"]
