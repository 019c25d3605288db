"""``GET /v1/models`` at the gateway: one answer of a replica of each pool, merged
(``regions/dataplane/model_list.py``) into one vLLM answer."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from aiohttp import web

from regions.dataplane.model_list import merge


def union(lists: Sequence[tuple[web.Response, Collection[str] | None]]) -> web.Response:
    """One answer from each pool's (its response, the names it answers or None: all).
    A single unfiltered answer is passed on as it came."""
    if len(lists) == 1 and lists[0][1] is None:
        return lists[0][0]
    body = merge([(bytes(resp.body), names) for resp, names in lists])  # type: ignore[arg-type]
    first = lists[0][0]
    headers = {k: v for k, v in first.headers.items() if k.lower() != "content-length"}
    headers["Content-Type"] = "application/json"
    return web.Response(status=200, body=body, headers=headers)
