"""A model server for tests of what replicas receive: it records each request's headers
(lower-cased names, and its path as ``:path``) and answers one token, like a
completion, or a one-model list on ``/v1/models`` (regions/dataplane's replays and the
agent's pre-warm and engine reads are checked against it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


class Recorder:
    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(
            {":path": request.path} | {k.lower(): v for k, v in request.headers.items()}
        )
        await request.read()
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "tiny"}]})
        usage = {"prompt_tokens": 7, "completion_tokens": 1}
        return web.json_response({"choices": [{"text": "x"}], "usage": usage})


@contextlib.asynccontextmanager
async def recording_replica() -> AsyncIterator[Recorder]:
    """A ``Recorder`` serving ``/v1/completions`` and ``/v1/models`` on a free
    127.0.0.1 port."""
    rec = Recorder()
    app = web.Application()
    app.router.add_post("/v1/completions", rec.handle)
    app.router.add_get("/v1/models", rec.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    rec.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield rec
    finally:
        await runner.cleanup()
