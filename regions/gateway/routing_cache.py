"""The gateway's view of ``routing/<r>``: one prefix read, then one watch.

A gateway resolves every request against routing, so routing must be local: the
cache reads the whole ``routing/`` prefix once (a consistent snapshot at one
revision), then follows it with a single watch from that revision + 1 — O(1)
watches per gateway however many sessions it serves. When the watch breaks (etcd
down, member lost) the cache keeps its last value (fail-static: traffic keeps
flowing where it was going) and re-watches from the last revision it applied + 1,
so no event is lost; if that revision was compacted away it reads the prefix again.
A full re-read every ``resync_s`` heals anything a watch could have missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from types import MappingProxyType

from controlplane.codec import CorruptValue, decode
from controlplane.core.model import Routing
from controlplane.keys import Keys
from controlplane.store.port import EventType, Store, StoreError, WatchEvent

log = logging.getLogger("tectonic.gateway.routing")


class RoutingCache:
    """``routings`` is replaced, never mutated: a request may hold one across awaits."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        *,
        retry_s: float = 0.2,
        max_retry_s: float = 2.0,
        resync_s: float = 30.0,
    ) -> None:
        self._store = store
        self._keys = keys
        self._prefix = keys.routing_prefix()
        self._retry_s = retry_s
        self._max_retry_s = max_retry_s
        self._resync_s = resync_s
        self._routings: Mapping[str, Routing] = MappingProxyType({})
        self.revision = 0  # etcd revision the cache reflects
        self.loaded = asyncio.Event()
        self.connected = False  # the last read or watch of etcd succeeded
        self.changes = 0

    @property
    def routings(self) -> Mapping[str, Routing]:
        return self._routings

    async def load(self) -> None:
        """Read the whole prefix at one revision and replace the cache with it."""
        page = await self._store.get_prefix(self._prefix)
        routings: dict[str, Routing] = {}
        for kv in page.kvs:
            region = self._keys.region_of(kv.key, self._prefix)
            parsed = self._decode(kv.key, kv.value)
            if parsed is not None:
                routings[region] = parsed
            elif region in self._routings:
                routings[region] = self._routings[region]  # keep the last good value
        if dict(routings) != dict(self._routings):
            self.changes += 1
            log.info("routing at revision %d: %s", page.revision, _describe(routings))
        self._routings = MappingProxyType(routings)
        self.revision = max(self.revision, page.revision)
        self.connected = True
        self.loaded.set()

    def apply(self, event: WatchEvent) -> None:
        """One watch event; events at or below the cached revision are already in."""
        if event.kv.mod_revision <= self.revision:
            return
        region = self._keys.region_of(event.kv.key, self._prefix)
        routings = dict(self._routings)
        if event.type is EventType.DELETE:
            routings.pop(region, None)
        else:
            parsed = self._decode(event.kv.key, event.kv.value)
            if parsed is None:
                self.revision = event.kv.mod_revision
                return
            routings[region] = parsed
        self._routings = MappingProxyType(routings)
        self.revision = event.kv.mod_revision
        self.changes += 1
        log.info(
            "routing/%s at revision %d: %s",
            region,
            self.revision,
            _describe({region: routings[region]}) if region in routings else "deleted",
        )

    async def run(self) -> None:
        """Read, then watch, forever; a failure keeps the cached routing and retries
        with backoff. Each round reads the prefix first, so a watch that comes back
        after an outage starts from a fresh snapshot and ``connected`` is true again."""
        delay = self._retry_s
        while True:
            try:
                await self.load()
                delay = self._retry_s
                await self._watch()
                continue  # a timed resync: read again, watch again
            except StoreError as e:  # unavailable, or the revision was compacted
                self._lost(e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_retry_s)

    async def _watch(self) -> None:
        """Apply events from the cached revision + 1 for ``resync_s``; ends early
        (without error) only if the store closes."""
        events = self._store.watch_prefix(self._prefix, start_revision=self.revision + 1)
        try:
            async with asyncio.timeout(self._resync_s):
                async for event in events:
                    self.apply(event)
        except TimeoutError:
            return
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    def _lost(self, e: StoreError) -> None:
        if self.connected:
            log.warning(
                "routing watch lost (%s); serving from the cached routing at revision %d",
                e,
                self.revision,
            )
        self.connected = False

    @staticmethod
    def _decode(key: str, raw: bytes) -> Routing | None:
        try:
            return decode(Routing, raw, key)
        except CorruptValue as e:
            log.error("ignoring %s (keeping the last good value)", e)
            return None


def _describe(routings: Mapping[str, Routing]) -> str:
    return (
        ", ".join(
            f"{r} -> {dict(v.targets)} (epoch {v.epoch})" for r, v in sorted(routings.items())
        )
        or "(none: every region serves itself)"
    )
