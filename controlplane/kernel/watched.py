"""A local copy of one etcd prefix of per-region values: one read, then one watch.

What a gateway must know on every request (routing, the warm pool's ACTIVE replicas)
must be local. :class:`WatchedPrefix` reads the whole prefix once (a consistent
snapshot at one revision), then follows it with a single watch from that revision
+ 1: O(1) watches per gateway. When the watch breaks (etcd down, member lost) the
copy keeps its last values (fail-static: traffic keeps flowing where it was going)
and reads again, then watches again, with backoff; if the revision it would resume
from was compacted away the read starts afresh anyway. A full re-read every
``resync_s`` heals anything a watch could have missed. A value that does not parse is
logged and the region keeps its last good value.

``values`` is replaced, never mutated: a request may hold one across awaits.
``on_change(region, value)`` is called once per region whose value changed (None: the
key is gone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

from pydantic import BaseModel

from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.port import EventType, Store, StoreError, WatchEvent

M = TypeVar("M", bound=BaseModel)


class WatchedPrefix(Generic[M]):
    def __init__(
        self,
        store: Store,
        keys: Keys,
        prefix: str,
        model: type[M],
        on_change: Callable[[str, M | None], None],
        *,
        log: logging.Logger,
        what: str,  # for log lines: "routing", "pools"
        retry_s: float = 0.2,
        max_retry_s: float = 2.0,
        resync_s: float = 30.0,
    ) -> None:
        self._store, self._keys, self._prefix, self._model = store, keys, prefix, model
        self._on_change, self._log, self._what = on_change, log, what
        self._retry_s, self._max_retry_s, self._resync_s = retry_s, max_retry_s, resync_s
        self._values: Mapping[str, M] = MappingProxyType({})
        self.revision = 0  # etcd revision the copy reflects
        self._read_revision = 0  # of the last full read: events at or below it are in it
        self.loaded = asyncio.Event()
        self.connected = False  # the last read or watch of etcd succeeded
        self.changes = 0  # regions whose value changed, counted per change

    @property
    def values(self) -> Mapping[str, M]:
        return self._values

    async def load(self) -> None:
        """Read the whole prefix at one revision and replace the copy with it."""
        page = await self._store.get_prefix(self._prefix)
        values: dict[str, M] = {}
        for kv in page.kvs:
            region = self._keys.region_of(kv.key, self._prefix)
            parsed = self._decode(kv.key, kv.value)
            if parsed is not None:
                values[region] = parsed
            elif region in self._values:
                values[region] = self._values[region]  # keep the last good value
        self._replace(values)
        self.revision = max(self.revision, page.revision)
        self._read_revision = max(self._read_revision, page.revision)
        self.connected = True
        self.loaded.set()

    def apply(self, event: WatchEvent) -> None:
        """One watch event; events at or below the last read's revision are already in.
        Not "at or below the copy's": the events of one transaction share its revision,
        and each must be applied (two loans, or two regions' routing, written together)."""
        if event.kv.mod_revision <= self._read_revision:
            return
        self.revision = max(self.revision, event.kv.mod_revision)
        region = self._keys.region_of(event.kv.key, self._prefix)
        values = dict(self._values)
        if event.type is EventType.DELETE:
            values.pop(region, None)
        else:
            parsed = self._decode(event.kv.key, event.kv.value)
            if parsed is None:
                return
            values[region] = parsed
        self._replace(values)

    async def run(self) -> None:
        """Read, then watch, forever; a failure keeps the copy and retries with backoff.
        Each round reads first, so after an outage ``connected`` is true again only
        with a fresh snapshot."""
        delay = self._retry_s
        while True:
            try:
                await self.load()
                delay = self._retry_s
                await self._watch()
                continue  # a timed resync: read again, watch again
            except StoreError as e:  # unavailable, or the revision was compacted
                if self.connected:
                    self._log.warning(
                        "%s watch lost (%s); serving from the copy at revision %d",
                        self._what,
                        e,
                        self.revision,
                    )
                self.connected = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_retry_s)

    async def _watch(self) -> None:
        """Apply events from the copy's revision + 1 for ``resync_s``; ends early
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

    def _replace(self, values: dict[str, M]) -> None:
        old, self._values = self._values, MappingProxyType(values)
        for region in sorted(old.keys() | values.keys()):
            if old.get(region) != values.get(region):
                self.changes += 1
                self._on_change(region, values.get(region))

    def _decode(self, key: str, raw: bytes) -> M | None:
        try:
            return decode(self._model, raw, key)
        except CorruptValue as e:
            self._log.error("ignoring %s (keeping the last good value)", e)
            return None
