"""Gateways tell each other when they move sessions off a region that answered nothing.

A spill (the gateway's ``regions/gateway/app.py``, the endpoint picker's
``regions/picker/pick.py``) moves a session to another region of its zone and CASes
its pin in etcd, but every other gateway that has the session cached keeps the old pin until
it revalidates (``revalidate_s``, minutes): should the old region answer again before
the control plane fails it over (a blip), the session would be served there by them
and in its new region by this one. So after moving sessions off a region, a gateway
writes ``session-moves/<region>`` (``SessionMoves``: who, when, how many so far), and
every gateway follows ``session-moves/`` with one watch (``WatchedPrefix``: O(1)
watches, fail-static like routing): a change makes its cached pins of that region go
to etcd at their next request (``SessionResolver.sessions_moved_off``).

Writes are coalesced: a burst of spills off one region (a region going dark moves
every session that asks) is one write per ``flush_s``. A write that fails is retried
after the next ``flush_s``; the pins themselves are already in etcd, so a lost notice
only means the others learn at their next revalidation, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.sessions.resolve import SessionMoves
from controlplane.kernel.store.port import Store, StoreError
from controlplane.kernel.watched import WatchedPrefix

log = logging.getLogger("tectonic.gateway.session_moves")
DEFAULT_FLUSH_S = 0.2


class SessionMovesBoard:
    """Publishes this gateway's moves and hears the others'. ``gateway_id`` may be set
    after construction (the listening port is known only once serving)."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        on_notice: Callable[[str], None],
        *,
        gateway_id: str = "",
        flush_s: float = DEFAULT_FLUSH_S,
    ) -> None:
        self._store, self._keys, self._on_notice = store, keys, on_notice
        self.gateway_id = gateway_id
        self._flush_s = flush_s
        self._moved: Counter[str] = Counter()  # region -> sessions this gateway moved
        self._dirty: set[str] = set()  # regions whose notice is not written yet
        self._wake = asyncio.Event()
        self.watch = WatchedPrefix(
            store,
            keys,
            keys.session_moves_prefix(),
            SessionMoves,
            self._changed,
            log=log,
            what="session moves",
        )

    def moved(self, region: str) -> None:
        """This gateway moved a session off ``region``: tell the others (soon)."""
        self._moved[region] += 1
        self._dirty.add(region)
        self._wake.set()

    def _changed(self, region: str, notice: SessionMoves | None) -> None:
        if notice is None or notice.by == self.gateway_id:
            return  # deleted, or our own: this gateway's cache already knows
        if not self.watch.loaded.is_set():
            return  # the first read: older than anything this gateway has cached
        log.info(
            "gateway %s moved sessions off %s (%d so far): re-reading cached pins of %s",
            notice.by,
            region,
            notice.moved,
            region,
        )
        self._on_notice(region)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.watch.run(), name="session-moves-watch")
            tg.create_task(self._publish(), name="session-moves-publish")

    async def _publish(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self._flush_s)  # coalesce a burst into one write
            await self.flush()

    async def flush(self) -> None:
        """Write a notice for every region moved off since the last flush."""
        for region in sorted(self._dirty):
            notice = SessionMoves(by=self.gateway_id, at=time.time(), moved=self._moved[region])
            try:
                await self._store.put(self._keys.session_moves(region), encode(notice))
            except StoreError as e:
                log.warning("cannot tell other gateways about moves off %s: %s", region, e)
                self._wake.set()  # again after the next flush_s
                continue
            if self._moved[region] == notice.moved:  # else moved again meanwhile: again
                self._dirty.discard(region)
