"""The gateway's view of ``pools/<r>``: which replicas each pooled region routes to.

A region agent that runs a warm pool publishes the pool's ACTIVE replicas there
(``PoolMembers``); WARM replicas sleep and would hang requests, so a gateway must route
to those and no others. Same approach as :mod:`regions.gateway.routing_cache`: read the
whole prefix at one revision, then one watch from that revision + 1; a broken watch
keeps the last values (fail-static) and re-reads, then re-watches, with backoff; a full
re-read every ``resync_s`` heals anything a watch could have missed.

``on_change(region, members)`` is called once per region whose value changed (None:
the key is gone, the region routes to the topology's static replicas again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType

from controlplane.codec import CorruptValue, decode
from controlplane.core.pool_members import PoolMembers
from controlplane.keys import Keys
from controlplane.store.port import EventType, Store, StoreError, WatchEvent

log = logging.getLogger("tectonic.gateway.pools")
OnChange = Callable[[str, PoolMembers | None], None]


class PoolCache:
    """``members`` is replaced, never mutated."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        on_change: OnChange,
        *,
        retry_s: float = 0.2,
        max_retry_s: float = 2.0,
        resync_s: float = 30.0,
    ) -> None:
        self._store = store
        self._keys = keys
        self._prefix = keys.pools_prefix()
        self._on_change = on_change
        self._retry_s = retry_s
        self._max_retry_s = max_retry_s
        self._resync_s = resync_s
        self._members: Mapping[str, PoolMembers] = MappingProxyType({})
        self.revision = 0  # etcd revision the cache reflects
        self.loaded = asyncio.Event()
        self.connected = False  # the last read or watch of etcd succeeded

    @property
    def members(self) -> Mapping[str, PoolMembers]:
        return self._members

    async def load(self) -> None:
        """Read the whole prefix at one revision and replace the cache with it."""
        page = await self._store.get_prefix(self._prefix)
        members: dict[str, PoolMembers] = {}
        for kv in page.kvs:
            region = self._keys.region_of(kv.key, self._prefix)
            parsed = self._decode(kv.key, kv.value)
            if parsed is not None:
                members[region] = parsed
            elif region in self._members:
                members[region] = self._members[region]  # keep the last good value
        self._replace(members)
        self.revision = max(self.revision, page.revision)
        self.connected = True
        self.loaded.set()

    def apply(self, event: WatchEvent) -> None:
        """One watch event; events at or below the cached revision are already in."""
        if event.kv.mod_revision <= self.revision:
            return
        self.revision = event.kv.mod_revision
        region = self._keys.region_of(event.kv.key, self._prefix)
        members = dict(self._members)
        if event.type is EventType.DELETE:
            members.pop(region, None)
        else:
            parsed = self._decode(event.kv.key, event.kv.value)
            if parsed is None:
                return
            members[region] = parsed
        self._replace(members)

    async def run(self) -> None:
        """Read, then watch, forever; a failure keeps the cached members and retries
        with backoff."""
        delay = self._retry_s
        while True:
            try:
                await self.load()
                delay = self._retry_s
                await self._watch()
                continue  # a timed resync: read again, watch again
            except StoreError as e:  # unavailable, or the revision was compacted
                if self.connected:
                    log.warning(
                        "pools watch lost (%s); routing pooled regions to the "
                        "members at revision %d",
                        e,
                        self.revision,
                    )
                self.connected = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_retry_s)

    async def _watch(self) -> None:
        events = self._store.watch_prefix(self._prefix, start_revision=self.revision + 1)
        try:
            async with asyncio.timeout(self._resync_s):
                async for event in events:
                    self.apply(event)
        except TimeoutError:
            return
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    def _replace(self, members: dict[str, PoolMembers]) -> None:
        old, self._members = self._members, MappingProxyType(members)
        for region in sorted(old.keys() | members.keys()):
            if old.get(region) != members.get(region):
                self._on_change(region, members.get(region))

    @staticmethod
    def _decode(key: str, raw: bytes) -> PoolMembers | None:
        try:
            return decode(PoolMembers, raw, key)
        except CorruptValue as e:
            log.error("ignoring %s (keeping the last good value)", e)
            return None
