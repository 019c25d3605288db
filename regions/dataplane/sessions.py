"""Which region serves a session, as fast as a dict lookup on the hot path.

In front of the shared ``SessionStore`` (pins in etcd, create-if-absent / CAS
re-pin) sits a bounded LRU of pins. A request whose session is cached and whose
pinned region still serves (by the routing cache) costs no I/O. A miss, a pin whose
region stopped serving, or a pin not confirmed by etcd for ``revalidate_s`` goes to
the store; concurrent requests of one session share that one call.

Fail-static: when etcd is unavailable (StoreUnavailable, or no answer within
``store_timeout_s``) the gateway keeps serving. A cached pin is used as it is; an
unknown session, or one whose region stopped serving, is resolved purely from the
cached routing (the same deterministic choice every gateway makes) and remembered
as *pending*. While etcd is down (a broken routing watch counts as down too) the
store is not asked on the request path, which would add a timeout to every new
session; a background loop probes it and, once it answers and the routing watch is
back, writes each pending pin (create-if-absent / re-pin) and adopts etcd's answer,
counting a session move where that answer differs.

When etcd answers but refuses the write (its NOSPACE alarm at the quota, or any other
permanent refusal) a pinned session is served where it is pinned, and one that would
have to move is not served elsewhere (503 + Retry-After, NoRegionServing): a move
that cannot be recorded would let another gateway answer it in its old region. New
sessions are served by the same deterministic choice as while etcd is down.
``writes_refused`` says so until a write succeeds, so that spills of sessions stop too.

A session another gateway moved (a spill: its region answered nothing there) would
otherwise keep its old pin here until ``revalidate_s``, and be served in the old
region again as soon as that answers: ``sessions_moved_off(region)`` (fed by
``session_moves.py`` from other gateways' notices) makes every cached pin of that
region go to the store at its next request, and ``on_moved`` tells the others when
this gateway moves one. A disagreement found that way was announced, not served: it
is no consistency violation.

``revalidate_s`` also bounds how long a busy session goes without the store seeing
it: each store call re-attaches the pin to the current expiry lease, so a session
in use lives at least ``ttl_s - revalidate_s`` past its last request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.codec import CorruptValue
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.resolve import (
    NoRegionServing,
    PinAction,
    Resolution,
    SessionPin,
    WarmCheck,
    pick_region,
    repinned,
    resolve,
    routing_of,
    self_routed,
)
from controlplane.kernel.sessions.store import SessionContention
from controlplane.kernel.store.port import StoreError, StoreUnavailable
from regions.dataplane.metrics import DataPlaneMetrics

log = logging.getLogger("tectonic.gateway.sessions")
PROBE_SESSION = "_gateway_probe"  # read (never written) to learn that etcd is back


class SessionStoreLike(Protocol):
    """The part of ``controlplane.kernel.sessions.store.SessionStore`` the gateway uses."""

    async def get(self, session_id: str) -> tuple[SessionPin, int] | None: ...

    async def resolve(
        self,
        session_id: str,
        home: str,
        routings: Mapping[str, Routing],
        warm: WarmCheck | None = None,
    ) -> Resolution: ...

    async def move(self, session_id: str, failed: str, to: str, *, home: str) -> SessionPin: ...


class RoutingView(Protocol):
    connected: bool  # False while the routing watch is broken: etcd is likely down

    @property
    def routings(self) -> Mapping[str, Routing]: ...


@dataclass(slots=True)
class _Entry:
    pin: SessionPin
    checked_at: float  # monotonic time etcd last confirmed this pin
    pending: bool = False  # made while etcd was unavailable; not confirmed yet
    seen: int = 0  # notices of moved sessions heard before etcd confirmed it (_remember)
    # the epoch of routing/<home> when etcd confirmed it: a newer routing (a failover, a
    # recovery step) may have re-pinned the session through another gateway, so the
    # cached pin is read again before it is trusted
    routing_epoch: int = 0


class SessionResolver:
    def __init__(
        self,
        sessions: SessionStoreLike,
        routing: RoutingView,
        home: str,
        metrics: DataPlaneMetrics,
        *,
        max_pins: int = 100_000,
        revalidate_s: float = 300.0,
        store_timeout_s: float = 1.0,
        probe_every_s: float = 0.5,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        on_moved: Callable[[str], None] | None = None,
    ) -> None:
        self._sessions = sessions
        self._routing = routing
        self.home = home
        self._metrics = metrics
        self._max_pins = max_pins
        self._revalidate_s = revalidate_s
        self._store_timeout_s = store_timeout_s
        self._probe_every_s = probe_every_s
        self._clock = clock or SystemClock()
        self._monotonic = monotonic
        self._pins: OrderedDict[str, _Entry] = OrderedDict()
        self._pending: dict[str, SessionPin] = {}  # bounded by max_pins, insertion order
        self._flights: dict[str, asyncio.Task[str]] = {}
        # notices that sessions were moved off a region: a running count, and per
        # region the count at its last notice (pins confirmed before it are stale)
        self._notices = 0
        self._noticed: dict[str, int] = {}
        self._on_moved = on_moved  # this gateway moved a session off a region
        self.store_up = True
        self.writes_refused = ""  # why the store refused the last write ("": it did not)
        self._woken = asyncio.Event()
        metrics.store_up.set(1)

    # ---- the request path ------------------------------------------------------------

    async def region_for(self, session_id: str, warm: WarmCheck | None = None) -> str:
        """The region that serves ``session_id`` now; raises NoRegionServing. ``warm``
        places a new session warm first (``controlplane.kernel.sessions.resolve.warm_first``);
        concurrent requests of one session share the first one's resolution."""
        routings = self._routing.routings
        entry = self._pins.get(session_id)
        if (
            entry is not None
            and self_routed(routings, entry.pin.region)
            and (
                entry.pending
                or not self.store_up
                or (
                    self._monotonic() - entry.checked_at < self._revalidate_s
                    and entry.seen >= self._noticed.get(entry.pin.region, 0)
                    and entry.routing_epoch >= routing_of(routings, entry.pin.home).epoch
                )
            )
        ):
            self._pins.move_to_end(session_id)
            return entry.pin.region
        flight = self._flights.get(session_id)
        if flight is None:
            flight = asyncio.ensure_future(self._resolve(session_id, warm))
            flight.add_done_callback(self._landed(session_id))
            self._flights[session_id] = flight
        # shield: a client that goes away must not cancel the pin write others await
        return await asyncio.shield(flight)

    def sessions_moved_off(self, region: str) -> None:
        """Another gateway moved sessions off ``region``: cached pins of it go to the
        store at their next request (the session may live elsewhere now)."""
        self._metrics.move_notices.labels(region).inc()
        self._notices += 1
        self._noticed[region] = self._notices

    def _announced(self, entry: _Entry) -> bool:
        """A notice about ``entry``'s region came after etcd last confirmed it."""
        return entry.seen < self._noticed.get(entry.pin.region, 0)

    def region_for_sessionless(self, key: str) -> str:
        """A request without a session: the same weighted choice, keyed by its prompt
        prefix (so a prefix keeps its region), and nothing written."""
        return pick_region(self._routing.routings, self.home, key)

    async def move(self, session_id: str, failed: str, to: str) -> str:
        """``session_id``'s region ``failed`` answered nothing: pin it to ``to`` (CAS in
        etcd; pending in the cache while etcd is down) and return where it is pinned
        now, which is another gateway's choice if it moved the session first. It never
        comes back by itself: like a failed-over session, it stays where it moved."""
        entry = self._pins.get(session_id)
        home = entry.pin.home if entry is not None else self.home
        if self.store_up:
            try:
                async with asyncio.timeout(self._store_timeout_s):
                    pin = await self._sessions.move(session_id, failed, to, home=home)
            except (StoreUnavailable, TimeoutError) as e:
                self._store_lost(e)
            except (CorruptValue, SessionContention) as e:
                log.warning("session %s: could not move it off %s (%s)", session_id, failed, e)
                return to
            except StoreError as e:
                self._refused(e)
                raise NoRegionServing(
                    f"session {session_id} cannot move off {failed}: the store refuses "
                    f"writes ({e}), and an unrecorded move could be answered by two regions"
                ) from e
            else:
                self._store_back()
                self.writes_refused = ""
                if entry is None or entry.pin.region != pin.region:
                    self._metrics.session_moves.inc()
                if pin.region != failed and self._on_moved is not None:
                    self._on_moved(failed)
                self._pending.pop(session_id, None)
                self._remember(session_id, _Entry(pin, self._monotonic()))
                log.warning(
                    "session %s moved %s -> %s: %s answered nothing",
                    session_id,
                    failed,
                    pin.region,
                    failed,
                )
                return pin.region
        now = self._clock.now()
        pin = (
            repinned(entry.pin, to, entry.pin.epoch, now)
            if entry is not None
            else SessionPin(home=home, region=to, epoch=0, pinned_at=now)
        )
        self._metrics.session_moves.inc()
        self._remember(session_id, _Entry(pin, self._monotonic(), pending=True))
        self._pending[session_id] = pin
        self._metrics.pending_pins.set(len(self._pending))
        self._woken.set()
        return to

    def cached(self, session_id: str) -> SessionPin | None:
        entry = self._pins.get(session_id)
        return entry.pin if entry is not None else None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _landed(self, session_id: str) -> Callable[[asyncio.Task[str]], None]:
        def done(task: asyncio.Task[str]) -> None:
            self._flights.pop(session_id, None)
            if not task.cancelled():
                task.exception()  # retrieved by the awaiters; no "never retrieved" noise

        return done

    async def _resolve(self, session_id: str, warm: WarmCheck | None) -> str:
        entry = self._pins.get(session_id)
        routings = self._routing.routings
        if not self._routing.connected and self.store_up:
            # The routing watch already broke: etcd is almost surely down, and asking
            # it would cost this request store_timeout_s.
            self._store_lost(StoreUnavailable("the routing watch is down"))
        if not self.store_up:
            return self._static(session_id, entry, routings, warm)
        home = entry.pin.home if entry is not None else self.home
        seen = self._notices  # a notice that lands while etcd answers makes it stale
        epoch = routing_of(routings, home).epoch  # and so does a routing that lands then
        try:
            async with asyncio.timeout(self._store_timeout_s):
                res = await self._sessions.resolve(session_id, home, routings, warm)
        except SessionContention as e:  # busy key, not a dead store: only this one waits
            log.warning("session %s: %s; resolving from the cache for now", session_id, e)
            return self._static(session_id, entry, routings, warm)
        except (StoreUnavailable, TimeoutError) as e:
            self._store_lost(e)
            return self._static(session_id, entry, routings, warm)
        except CorruptValue as e:
            log.error("session %s: store refused (%s); resolving from the cache", session_id, e)
            return self._static(session_id, entry, routings, warm, pending=False)
        except StoreError as e:
            self._refused(e)
            if entry is None:
                entry = await self._read_pin(session_id)  # reads still work while full
            return self._static(session_id, entry, routings, warm, pending=False, move=False)
        self._store_back()
        self.writes_refused = ""
        if res.action is PinAction.REPIN:
            self._metrics.session_moves.inc()
            log.info(
                "session %s moved %s -> %s",
                session_id,
                entry.pin.region if entry else "?",
                res.region,
            )
        self._adopt(session_id, entry, res.pin, seen, epoch)
        return res.region

    def _static(
        self,
        session_id: str,
        entry: _Entry | None,
        routings: Mapping[str, Routing],
        warm: WarmCheck | None = None,
        *,
        pending: bool = True,
        move: bool = True,
    ) -> str:
        """Fail-static resolution from what this gateway knows; raises NoRegionServing,
        also (``move`` False) for a session that would have to move."""
        self._metrics.fail_static.inc()
        if entry is not None and self_routed(routings, entry.pin.region):
            self._pins.move_to_end(session_id)
            return entry.pin.region
        home = entry.pin.home if entry is not None else self.home
        now = self._clock.now()
        res = resolve(entry.pin if entry else None, session_id, home, routings, now, warm)
        if res.action is PinAction.REPIN and not move:
            old = entry.pin.region if entry is not None else "?"
            raise NoRegionServing(
                f"session {session_id} would move off {old} to {res.region}, but the store "
                f"refuses writes ({self.writes_refused}): not served unrecorded"
            )
        if res.action is PinAction.REPIN:
            self._metrics.session_moves.inc()
        self._remember(session_id, _Entry(res.pin, self._monotonic(), pending=pending))
        if pending:
            self._pending.pop(session_id, None)
            self._pending[session_id] = res.pin
            if len(self._pending) > self._max_pins:
                dropped = next(iter(self._pending))
                del self._pending[dropped]
                log.warning("too many pending pins; session %s will be re-resolved", dropped)
            self._metrics.pending_pins.set(len(self._pending))
            self._woken.set()
        return res.region

    def _adopt(
        self,
        session_id: str,
        entry: _Entry | None,
        pin: SessionPin,
        seen: int | None = None,
        epoch: int | None = None,
    ) -> None:
        """Take etcd's pin (read when ``seen`` notices had been heard). If ours named
        another region that still serves, and no notice had announced the move, the
        session was (or would have been) served in two places: a consistency violation."""
        if (
            entry is not None
            and not entry.pending
            and entry.pin.region != pin.region
            and self_routed(self._routing.routings, entry.pin.region)
            and not self._announced(entry)
            and (epoch is None or entry.routing_epoch >= epoch)  # a new routing re-pins
        ):
            self._metrics.consistency_violations.inc()
            log.error(
                "session %s: cached pin %s disagrees with etcd's %s",
                session_id,
                entry.pin.region,
                pin.region,
            )
        if entry is not None and entry.pending and entry.pin.region != pin.region:
            self._metrics.session_moves.inc()  # served from the cache, etcd said otherwise
        if self._pending.pop(session_id, None) is not None:
            self._metrics.pending_pins.set(len(self._pending))
        self._remember(session_id, _Entry(pin, self._monotonic()), seen, epoch)

    def _remember(
        self, session_id: str, entry: _Entry, seen: int | None = None, epoch: int | None = None
    ) -> None:
        entry.seen = self._notices if seen is None else seen
        if epoch is None:
            epoch = routing_of(self._routing.routings, entry.pin.home).epoch
        entry.routing_epoch = epoch
        self._pins[session_id] = entry
        self._pins.move_to_end(session_id)
        while len(self._pins) > self._max_pins:
            self._pins.popitem(last=False)

    # ---- etcd availability and reconciliation ---------------------------------------

    async def _read_pin(self, session_id: str) -> _Entry | None:
        """etcd's pin of ``session_id`` (remembered), or None: none, or unreadable."""
        try:
            async with asyncio.timeout(self._store_timeout_s):
                found = await self._sessions.get(session_id)
        except (StoreError, CorruptValue, TimeoutError):
            return None
        if found is None:
            return None
        entry = _Entry(found[0], self._monotonic())
        self._remember(session_id, entry)
        return entry

    def _refused(self, e: StoreError) -> None:
        if not self.writes_refused:
            log.error(
                "etcd refuses writes (%s): pinned sessions stay where they are, none is "
                "moved until it takes writes again (runbooks/etcd-space.md)",
                e,
            )
        self.writes_refused = str(e) or type(e).__name__

    def _store_lost(self, e: BaseException) -> None:
        if self.store_up:
            log.warning(
                "etcd unavailable (%s); serving sessions from the cache", str(e) or type(e).__name__
            )
        self.store_up = False
        self._metrics.store_up.set(0)
        self._woken.set()

    def _store_back(self) -> None:
        if not self.store_up:
            log.info("etcd answers again; %d pending pins to write", len(self._pending))
        self.store_up = True
        self._metrics.store_up.set(1)

    async def run(self) -> None:
        """Background: while etcd is down, probe it; then write the pending pins."""
        while True:
            if self.store_up and not self._pending:
                self._woken.clear()
                await self._woken.wait()
                continue
            await asyncio.sleep(self._probe_every_s)
            if not self.store_up and not await self._probe():
                continue
            await self.reconcile()

    async def _probe(self) -> bool:
        if not self._routing.connected:
            return False  # pins resolved against stale routing could be wrong
        try:
            async with asyncio.timeout(self._store_timeout_s):
                await self._sessions.get(PROBE_SESSION)
        except (StoreError, CorruptValue, TimeoutError):
            return False
        self._store_back()
        return True

    async def reconcile(self) -> int:
        """Write pending pins to etcd (create-if-absent, or re-pin); adopt etcd's answer.
        Returns how many were settled; stops at the first unavailability."""
        settled = 0
        for session_id, pin in list(self._pending.items()):
            if self._pending.get(session_id) is not pin:
                continue  # replaced meanwhile; its newer pin is later in the order
            try:
                async with asyncio.timeout(self._store_timeout_s):
                    res = await self._sessions.resolve(session_id, pin.home, self._routing.routings)
            except (StoreUnavailable, TimeoutError) as e:
                self._store_lost(e)
                break
            except (StoreError, CorruptValue) as e:
                log.error("session %s: cannot write its pin (%s); dropped", session_id, e)
                res = None
            if self._pending.get(session_id) is pin:
                del self._pending[session_id]
            settled += 1
            if res is None:
                continue
            if res.region != pin.region:
                self._metrics.session_moves.inc()
                log.warning(
                    "session %s: served in %s while etcd was unavailable; etcd says "
                    "%s, following etcd",
                    session_id,
                    pin.region,
                    res.region,
                )
            self._remember(session_id, _Entry(res.pin, self._monotonic()))
        self._metrics.pending_pins.set(len(self._pending))
        return settled
