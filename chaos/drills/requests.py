"""Drills asked for by operators, and what the drill service tells them.

``failoverctl drill run`` makes the control plane write a ``DrillRequest`` to
``drills/requests/<id>`` (audited, with the actor and reason); the drill service picks
the oldest up on its next tick (a watch wakes it early), runs it under the same lock as
every drill, records the result in the history with the request's id, and deletes the
request. Every tick the service also republishes ``drills/catalog``: the scenarios it
can run and its upcoming scheduled drills, which is how the API refuses an unknown
scenario and how ``failoverctl drill list``/``schedule`` know what will happen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from chaos.drills.scenario import Scenario
from chaos.drills.schedule import Schedule, next_runs
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.drills import DrillCatalog, DrillRequest, ScenarioInfo, UpcomingDrill
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.port import Store, StoreError

log = logging.getLogger("tectonic.drills")


def scenario_infos(scenarios: Sequence[Scenario]) -> tuple[ScenarioInfo, ...]:
    return tuple(ScenarioInfo(name=s.name, title=s.title, region=s.region) for s in scenarios)


async def publish_catalog(
    store: Store,
    keys: Keys,
    service: str,
    scenarios: Sequence[ScenarioInfo],
    schedule: Schedule,
    now: float,
    upcoming: int = 10,
) -> DrillCatalog:
    from datetime import UTC, datetime

    runs = next_runs(schedule, datetime.fromtimestamp(now, UTC), upcoming).runs
    catalog = DrillCatalog(
        service=service,
        published_at=now,
        scenarios=tuple(scenarios),
        upcoming=tuple(
            UpcomingDrill(
                scenario=r.entry.scenario, region=r.entry.region or "", at=r.at_utc.timestamp()
            )
            for r in runs
        ),
    )
    await store.put(keys.drill_catalog(), encode(catalog))
    return catalog


async def pending(store: Store, keys: Keys) -> list[DrillRequest]:
    """Requests not yet carried out, oldest first (an unreadable one is logged and
    left for an operator: it never blocks the others)."""
    out = []
    for kv in (await store.get_prefix(keys.drill_requests_prefix())).kvs:
        try:
            out.append(decode(DrillRequest, kv.value, kv.key))
        except CorruptValue as e:
            log.error("%s", e)
    return sorted(out, key=lambda r: (r.requested_at, r.id))


async def done(store: Store, keys: Keys, request: DrillRequest) -> None:
    await store.delete(keys.drill_request(request.id))


async def watch_requests(store: Store, keys: Keys, wake: asyncio.Event, retry_s: float) -> None:
    """Set ``wake`` whenever a request is written; reconnects after store errors."""
    while True:
        try:
            async for _ in store.watch_prefix(keys.drill_requests_prefix()):
                wake.set()
        except StoreError as e:
            log.info("watch on drill requests broke (%s); the tick still finds them", e)
        await asyncio.sleep(retry_s)
