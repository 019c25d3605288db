"""``GET /v1/models`` over model pools: the union of what each pool's replicas list,
as one vLLM answer (``{"object": "list", "data": [...]}``).

Each pool's list is cut to the names its pool answers in the topology (a replica may
serve an adapter the topology does not route: the gateway would answer 404 for it);
the regions without pools list whatever their replicas serve, as before pools.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Sequence

from aiohttp import web

log = logging.getLogger("tectonic.gateway")


def union(lists: Sequence[tuple[web.Response, Collection[str] | None]]) -> web.Response:
    """One answer from each pool's (its response, the names it answers or None: all).
    A single unfiltered answer is passed on as it came; a list that is not vLLM's
    shape is left out (logged)."""
    if len(lists) == 1 and lists[0][1] is None:
        return lists[0][0]
    seen: dict[str, object] = {}
    first = lists[0][0]
    for resp, names in lists:
        for entry in _entries(resp):
            ident = entry.get("id") if isinstance(entry, dict) else None
            if isinstance(ident, str) and (names is None or ident in names):
                seen.setdefault(ident, entry)
    body = json.dumps({"object": "list", "data": list(seen.values())}).encode()
    headers = {k: v for k, v in first.headers.items() if k.lower() != "content-length"}
    headers["Content-Type"] = "application/json"
    return web.Response(status=200, body=body, headers=headers)


def _entries(resp: web.Response) -> list[object]:
    try:
        data = json.loads(resp.body)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        log.warning("a replica's /v1/models answer is not JSON; left out of the list")
        return []
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        log.warning("a replica's /v1/models answer has no data list; left out of the list")
        return []
    return entries
