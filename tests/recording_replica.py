"""A model server for tests of what replicas receive: it records each request's headers
(lower-cased names) and answers one token, like a completion (regions/dataplane's
replays and the agent's pre-warm are checked against it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


class Recorder:
    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append({k.lower(): v for k, v in request.headers.items()})
        await request.read()
        usage = {"prompt_tokens": 7, "completion_tokens": 1}
        return web.json_response({"choices": [{"text": "x"}], "usage": usage})


@contextlib.asynccontextmanager
async def recording_replica() -> AsyncIterator[Recorder]:
    """A ``Recorder`` serving ``/v1/completions`` on a free 127.0.0.1 port."""
    rec = Recorder()
    app = web.Application()
    app.router.add_post("/v1/completions", rec.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    rec.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield rec
    finally:
        await runner.cleanup()
