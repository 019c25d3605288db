"""Compacts etcd's history behind every watcher (docs/etcd.md, "Compaction").

Every replica samples the store's revision every ``etcd.compact_interval_s``; the
leader compacts to the revision the store had ``etcd.compact_retention_s`` ago
(``core/compaction.py`` chooses it). Followers sample too, so that a new leader
compacts at its first interval instead of a retention later. Compaction is not fenced:
it is idempotent and only drops history older than the retention, so a deposed
leader's late compaction changes nothing anyone relies on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from controlplane.core.compaction import RevisionWindow
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.port import Store, StoreError, StoreUnavailable
from controlplane.kernel.store.settings import EtcdConfig

log = logging.getLogger("tectonic.compactor")


class Compactor:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        config: EtcdConfig,
        is_leader: Callable[[], bool],
        *,
        on_compacted: Callable[[int], None] = lambda revision: None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store, self._keys, self._config = store, keys, config
        self._is_leader, self._on_compacted, self._now = is_leader, on_compacted, now
        self.window = RevisionWindow(config.compact_retention_s)

    async def run(self) -> None:
        if self._config.compact_retention_s <= 0:
            log.warning(
                "etcd.compact_retention_s is 0: Tectonic does not compact etcd's history; "
                "etcd's own --auto-compaction-* must, or the store fills (docs/etcd.md)"
            )
            return
        while True:
            try:
                await self.once()
            except StoreUnavailable as e:
                log.warning("compaction skipped, the store is unavailable: %s", e)
            except StoreError as e:
                log.error(
                    "compaction failed (retried in %gs): %s", self._config.compact_interval_s, e
                )
            await asyncio.sleep(self._config.compact_interval_s)

    async def once(self) -> int | None:
        """Sample the revision; as leader, compact when a sample is old enough. Returns
        the revision compacted to, or None."""
        # One key's read carries the store's current revision in its header.
        revision = (await self._store.get_prefix(self._keys.leader())).revision
        now = self._now()
        self.window.observe(now, revision)
        target = self.window.target(now)
        if target is None or not self._is_leader():
            return None
        await self._store.compact(target)
        self.window.done(target)
        log.info(
            "compacted etcd's history before revision %d (now %d; kept %.0fs)",
            target,
            revision,
            self._config.compact_retention_s,
        )
        self._on_compacted(target)
        return target
