"""The gateway's view of ``routing/<r>``: where each home region's traffic goes.

A gateway resolves every request against routing, so routing is a local copy
(:class:`controlplane.kernel.watched.WatchedPrefix`: one read, then one watch; fail-static
when etcd is lost; a full re-read every ``resync_s``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.store.port import Store
from controlplane.kernel.watched import WatchedPrefix

log = logging.getLogger("tectonic.gateway.routing")


class RoutingCache(WatchedPrefix[Routing]):
    """``routings`` is replaced, never mutated: a request may hold one across awaits.
    ``listeners`` are called with the new ``routings`` after each change."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        *,
        retry_s: float = 0.2,
        max_retry_s: float = 2.0,
        resync_s: float = 30.0,
    ) -> None:
        super().__init__(
            store,
            keys,
            keys.routing_prefix(),
            Routing,
            self._changed,
            log=log,
            what="routing",
            retry_s=retry_s,
            max_retry_s=max_retry_s,
            resync_s=resync_s,
        )
        self.listeners: list[Callable[[Mapping[str, Routing]], None]] = []

    @property
    def routings(self) -> Mapping[str, Routing]:
        return self.values

    def _changed(self, region: str, routing: Routing | None) -> None:
        if routing is None:
            log.info("routing/%s deleted: %s serves itself", region, region)
        else:
            log.info(
                "routing/%s at revision %d: %s (epoch %d)",
                region,
                self.revision,
                dict(routing.targets),
                routing.epoch,
            )
        for listener in self.listeners:
            listener(self.routings)
