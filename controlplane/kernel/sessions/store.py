"""Sticky sessions in etcd (docs/architecture.md §2): the adapter over the Store port.

Which region serves a session is decided purely by ``controlplane.kernel.sessions.resolve``;
this module reads ``sessions/<id>``, asks the core, and writes what it says:

* CREATE — a create-if-absent transaction. Two gateways racing for a new session
  agree: the loser's compare fails, it re-reads and returns the winner's pin.
* REPIN — a CAS on the mod_revision it read; on a lost race it re-reads and
  resolves again (at most ``MAX_ATTEMPTS`` times, then ``SessionContention``).
* KEEP — writes nothing about the pin (but see expiry below).

Expiry: leases are shared per time bucket, never one per session. ``BucketLeases``
grants one lease per ``bucket_s`` window with TTL ``ttl_s + bucket_s`` and records
it at ``<root>session-leases/<bucket>`` (create-if-absent, attached to the lease
itself), so every gateway and control-plane replica attaches to the *same* lease.
A session is written with the current bucket's lease; when it is used in a later
bucket, the KEEP path re-attaches it (a CAS writing the same value with the new
lease). Write cost: at most one extra write per session per ``bucket_s`` in which it
is used (~1/60 writes per request-minute at the defaults), plus per process per
bucket one read (and, for the first process, a grant and a create). A session
therefore lives at least ``ttl_s`` after its last use, and at most about
``ttl_s + 2 * bucket_s``. Were leases per process, two gateways serving one session
would re-attach it back and forth on every request.

Nothing re-pins sessions in bulk: a failover writes ``routing/`` only, and each
session is re-pinned by the gateway that serves its next request (REPIN above). A
session that sends nothing until its region serves again is never written, and is
served there again: it has nothing cached anywhere else.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping, Sequence

from controlplane.kernel.audit import AuditLog
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditAction, AuditEntry, Routing
from controlplane.kernel.sessions.leases import BucketLeases
from controlplane.kernel.sessions.resolve import (
    PinAction,
    Resolution,
    SessionPin,
    WarmCheck,
    repinned,
    resolve,
)
from controlplane.kernel.store.port import (
    Compare,
    KeyValue,
    LeaseNotFound,
    Op,
    Put,
    Store,
    StoreFull,
    StoreUnavailable,
)

log = logging.getLogger("tectonic.sessions")

MAX_ATTEMPTS = 4  # read-decide-write rounds before a contended session gives up
SESSION_ID_RULE = "1-256 printable ASCII characters (space to '~') without '/'"
_SESSION_ID = re.compile(r"[\x20-\x2e\x30-\x7e]{1,256}")


class InvalidSessionId(ValueError):
    """A session id breaks ``SESSION_ID_RULE``."""


class SessionContention(StoreUnavailable):
    """The session kept changing under us; temporary, retry shortly."""


def validate_session_id(session_id: str) -> str:
    if not _SESSION_ID.fullmatch(session_id):
        shown = session_id[:64] + ("..." if len(session_id) > 64 else "")
        raise InvalidSessionId(f"invalid session id {shown!r}: must be {SESSION_ID_RULE}")
    return session_id


class SessionStore:
    """Reads and writes ``sessions/<id>`` (see the module docstring), or with a model
    pool's ``family`` ``sessions/<id>/<family>``.

    ``regions`` are the known region names (``pin`` and ``resolve`` refuse others);
    ``writer`` names this process in audit keys and must differ from other audit
    writers of the process (e.g. ``sessions-<replica id>``).
    """

    def __init__(
        self,
        store: Store,
        keys: Keys,
        *,
        regions: Collection[str],
        clock: Clock,
        ttl_s: int = 3600,
        bucket_s: int = 60,
        writer: str = "sessions",
        family: str = "",
    ) -> None:
        if not regions:
            raise ValueError("SessionStore needs the known region names")
        self.store, self.keys, self.clock = store, keys, clock
        self.family = family  # a model pool's: its pins are its own (Keys.session)
        self.regions = tuple(regions)
        self.leases = BucketLeases(store, keys, ttl_s=ttl_s, bucket_s=bucket_s, clock=clock)
        self.audit = AuditLog(keys, writer)

    def _key(self, session_id: str) -> str:
        return self.keys.session(session_id, self.family)

    # ---- reads ---------------------------------------------------------------------
    async def get(self, session_id: str) -> tuple[SessionPin, int] | None:
        """The pin and its mod_revision, or None. Raises CorruptValue if unreadable."""
        kv = await self.store.get(self._key(validate_session_id(session_id)))
        if kv is None:
            return None
        return decode(SessionPin, kv.value, kv.key), kv.mod_revision

    async def _read(self, key: str) -> tuple[SessionPin | None, KeyValue | None]:
        kv = await self.store.get(key)
        if kv is None:
            return None, None
        try:
            return decode(SessionPin, kv.value, key), kv
        except CorruptValue as e:
            log.error("%s; treating the session as new and overwriting it", e)
            return None, kv

    # ---- the gateway path -------------------------------------------------------------
    async def resolve(
        self,
        session_id: str,
        home: str,
        routings: Mapping[str, Routing],
        warm: WarmCheck | None = None,
    ) -> Resolution:
        """Where ``session_id`` is served, writing what the core decided (``warm``: see
        ``controlplane.kernel.sessions.resolve.warm_first``). Raises
        NoRegionServing (answer 503), InvalidSessionId / ValueError (bad input),
        SessionContention or StoreUnavailable (temporary)."""
        self._check_region("home", home)
        key = self._key(validate_session_id(session_id))
        for _ in range(MAX_ATTEMPTS):
            pin, kv = await self._read(key)
            res = resolve(pin, session_id, home, routings, self.clock.now(), warm)
            if res.action is PinAction.KEEP:
                assert kv is not None  # KEEP needs a stored pin
                if await self._touch(kv):
                    return res
                continue  # the key changed under us: decide again on what is there now
            lease = await self.leases.current()
            # A corrupt value (pin None, kv set) is overwritten under a CAS as well.
            guard = Compare.mod_revision(key, kv.mod_revision if kv else 0)
            if await self._put_guarded(guard, [Put(key, encode(res.pin), lease)], lease):
                return res
        raise SessionContention(f"session {session_id!r} kept changing; retry")

    async def _touch(self, kv: KeyValue) -> bool:
        """Re-attach a session used in a later bucket to the current lease (same value,
        CAS). False if the key changed since it was read."""
        try:
            lease = await self.leases.current()
            if kv.lease == lease:
                return True
            guard = Compare.mod_revision(kv.key, kv.mod_revision)
            return await self._put_guarded(guard, [Put(kv.key, kv.value, lease)], lease)
        except (StoreUnavailable, StoreFull):
            # The answer stands; only the expiry was not extended (etcd down, or full: it
            # refuses the new bucket's lease grant). The next use retries.
            log.debug("lease re-attach of %s failed; next use retries", kv.key)
            return True

    async def _put_guarded(self, guard: Compare, ops: Sequence[Op], lease: int) -> bool:
        try:
            return (await self.store.txn([guard], ops)).succeeded
        except LeaseNotFound:
            self.leases.invalidate(lease)  # the bucket lease vanished: the retry re-grants
            return False

    # ---- operators --------------------------------------------------------------------
    async def pin(
        self,
        session_id: str,
        region: str,
        *,
        home: str | None = None,
        actor: str,
        reason: str,
    ) -> SessionPin:
        """Pin a session to ``region`` (an operator override), audited in the same
        transaction. ``home`` defaults to the session's current home, else ``region``."""
        validate_session_id(session_id)
        self._check_region("region", region)
        if home is not None:
            self._check_region("home", home)
        if not reason.strip() or not actor.strip():
            raise ValueError("actor and reason are required: say who and why, for the audit log")
        key = self._key(session_id)
        for _ in range(MAX_ATTEMPTS):
            old, kv = await self._read(key)
            new_home = home or (old.home if old else region)
            epoch = await self._routing_epoch(new_home)
            now = self.clock.now()
            moved = old is not None and old.region != region
            new = SessionPin(
                home=new_home,
                region=region,
                epoch=epoch,
                pinned_at=now,
                moves=(old.moves if old else 0) + int(moved),
            )
            entry = AuditEntry(
                at=now,
                actor=actor,
                action=AuditAction.SESSION_PIN,
                region=region,
                reason=reason,
                details={
                    "session": session_id,
                    "home": new_home,
                    "from": old.region if old else "",
                },
            )
            lease = await self.leases.current()
            guard = Compare.mod_revision(key, kv.mod_revision if kv else 0)
            ops = [Put(key, encode(new), lease), self.audit.op(entry)]
            if await self._put_guarded(guard, ops, lease):
                log.warning("session %s pinned to %s by %s: %s", session_id, region, actor, reason)
                return new
        raise SessionContention(f"session {session_id!r} kept changing; retry")

    async def move(self, session_id: str, failed: str, to: str, *, home: str) -> SessionPin:
        """Move a session off ``failed`` (its region answered nothing) to ``to``, unless
        it is pinned elsewhere already (another gateway moved it: that pin is returned).
        A session without a pin is created on ``to`` with ``home``. CAS on the pin, no
        audit entry: like a lazy re-pin, the gateway counts it."""
        validate_session_id(session_id)
        self._check_region("region", to)
        key = self._key(session_id)
        for _ in range(MAX_ATTEMPTS):
            old, kv = await self._read(key)
            if old is not None and old.region != failed:
                return old
            epoch = await self._routing_epoch(old.home if old else home)
            now = self.clock.now()
            new = (
                repinned(old, to, epoch, now)
                if old is not None
                else SessionPin(home=home, region=to, epoch=epoch, pinned_at=now)
            )
            lease = await self.leases.current()
            guard = Compare.mod_revision(key, kv.mod_revision if kv else 0)
            if await self._put_guarded(guard, [Put(key, encode(new), lease)], lease):
                return new
        raise SessionContention(f"session {session_id!r} kept changing; retry")

    async def _routing_epoch(self, home: str) -> int:
        kv = await self.store.get(self.keys.routing(home))
        try:
            return decode(Routing, kv.value, kv.key).epoch if kv else 0
        except CorruptValue as e:
            log.error("%s; recording epoch 0 in the pin", e)
            return 0

    def _check_region(self, what: str, region: str) -> None:
        if region not in self.regions:
            raise ValueError(
                f"unknown {what} region {region[:64]!r}; known regions: {', '.join(self.regions)}"
            )
