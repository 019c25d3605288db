"""``GET /v1/models`` over model pools (docs/models.md): the union of what each pool's
replicas list, as one vLLM answer (``{"object": "list", "data": [...]}``), for the
gateway and the endpoint picker alike.

Each pool's list is cut to the names its pool answers in the topology (a replica may
serve an adapter the topology does not route: a request for it would get a 404); the
regions without pools list whatever their replicas serve, as before pools.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

import aiohttp

from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.resolve import self_routed
from regions.dataplane.models import ModelRoutes, OneFamily

log = logging.getLogger("tectonic.gateway")


def merge(lists: Sequence[tuple[bytes, Collection[str] | None]]) -> bytes:
    """One list from each pool's answer (its body, the names it answers or None: all),
    each name once, in the pools' order; an answer not of vLLM's shape is left out."""
    seen: dict[str, object] = {}
    for body, names in lists:
        for entry in _entries(body):
            ident = entry.get("id") if isinstance(entry, dict) else None
            if isinstance(ident, str) and (names is None or ident in names):
                seen.setdefault(ident, entry)
    return json.dumps({"object": "list", "data": list(seen.values())}).encode()


class _Homed(Protocol):
    home: str


def pools_to_ask(
    routes: ModelRoutes[_Homed] | OneFamily[_Homed],
    routings: Mapping[str, Routing],
    replicas: Mapping[str, Sequence[str]],
) -> list[tuple[list[str], tuple[str, ...] | None]]:
    """Per family, the replicas to ask (those of its units that serve their own traffic,
    its home's first) and the names it answers."""
    out = []
    for family, resolver in routes.by_family.items():
        units = dict.fromkeys([resolver.home, *routes.units_of(family)])
        serving = [u for u in units if self_routed(routings, u)]
        asked = [r for u in serving for r in replicas.get(u, ())]
        out.append((asked, routes.models_of(family)))
    return out


async def fetch_union(
    http: aiohttp.ClientSession,
    pools: Sequence[tuple[Sequence[str], Collection[str] | None]],
    timeout_s: float,
) -> bytes | None:
    """``merge`` of one answer per pool, asked of its replicas (base URLs) in order
    until one answers 200; None when no pool's replica did."""
    got = []
    for replicas, names in pools:
        for base in replicas:
            body = await _get(http, base + "/v1/models", timeout_s)
            if body is not None:
                got.append((body, names))
                break
    return merge(got) if got else None


async def _get(http: aiohttp.ClientSession, url: str, timeout_s: float) -> bytes | None:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status == 200:
                return await resp.read()
            log.info("GET %s: %d", url, resp.status)
    except (aiohttp.ClientError, TimeoutError) as e:
        log.info("GET %s: %s", url, e)
    return None


def _entries(body: bytes) -> list[object]:
    try:
        data = json.loads(body)
    except (TypeError, ValueError):
        log.warning("a replica's /v1/models answer is not JSON; left out of the list")
        return []
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        log.warning("a replica's /v1/models answer has no data list; left out of the list")
        return []
    return entries
