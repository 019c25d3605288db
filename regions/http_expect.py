"""The ``Expect`` header, answered without aiohttp's default handler.

aiohttp 3.14 puts an unknown ``Expect`` value into a text/plain 417 it then cannot
encode when the value is not ASCII, and the request ends in a 500. This handler does
what the default does for ``100-continue`` and answers anything else with a JSON 417
whose message shows the value escaped.
"""

from __future__ import annotations

import json

from aiohttp import HttpVersion11, hdrs, web


async def expect_handler(request: web.BaseRequest) -> None:
    if request.version != HttpVersion11:
        return
    expect = request.headers.get(hdrs.EXPECT, "")
    if expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the body has not started yet
        return
    shown = expect.encode("ascii", "backslashreplace").decode()[:64]
    message = f"unsupported Expect header {shown!r}: only 100-continue is"
    body = {"error": {"message": message, "type": "BadRequestError", "code": 417}}
    raise web.HTTPExpectationFailed(text=json.dumps(body), content_type="application/json")
