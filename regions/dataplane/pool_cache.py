"""The gateway's view of ``pools/<r>``: which replicas each pooled region routes to.

A region agent that runs a warm pool publishes the pool's ACTIVE replicas there
(``PoolMembers``); WARM replicas sleep and would hang requests, so a gateway must route
to those and no others. A local copy like routing's
(:class:`controlplane.kernel.watched.WatchedPrefix`).

``on_change(region, members)`` is called once per region whose value changed (None:
the key is gone, the region routes to the topology's static replicas again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.store.port import Store
from controlplane.kernel.watched import WatchedPrefix

log = logging.getLogger("tectonic.gateway.pools")
OnChange = Callable[[str, PoolMembers | None], None]


class PoolCache(WatchedPrefix[PoolMembers]):
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
        super().__init__(
            store,
            keys,
            keys.pools_prefix(),
            PoolMembers,
            on_change,
            log=log,
            what="pools",
            retry_s=retry_s,
            max_retry_s=max_retry_s,
            resync_s=resync_s,
        )

    @property
    def members(self) -> Mapping[str, PoolMembers]:
        return self.values
