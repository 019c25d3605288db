"""Session expiry through leases shared per time bucket, never one lease per session.

One lease is granted per ``bucket_s`` window with TTL ``ttl_s + bucket_s`` and
recorded at ``session-leases/<bucket>`` (create-if-absent, attached to the lease
itself), so every gateway and control-plane replica attaches sessions of that window
to the *same* lease. Were leases per process, two gateways serving one session would
re-attach it back and forth on every request.
"""

from __future__ import annotations

import asyncio
import logging

from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.leases import grant_and_put
from controlplane.kernel.model import Frozen
from controlplane.kernel.store.port import Compare, Store, StoreUnavailable

log = logging.getLogger("tectonic.sessions")

MAX_ATTEMPTS = 4


class LeaseContention(StoreUnavailable):
    """The bucket's lease record kept changing; temporary, retry shortly."""


class _BucketRecord(Frozen):
    """Value of ``session-leases/<bucket>``: the lease every writer uses in that bucket."""

    lease: int
    bucket: int
    ttl_s: int


class BucketLeases:
    """One lease per ``bucket_s`` window, shared by all processes through the store
    (see the module docstring). ``current()`` is cheap within a bucket (cached)."""

    def __init__(
        self, store: Store, keys: Keys, *, ttl_s: int, bucket_s: int, clock: Clock
    ) -> None:
        if ttl_s < 1 or bucket_s < 1:
            raise ValueError(f"ttl_s and bucket_s must be >= 1 s, got {ttl_s}, {bucket_s}")
        self.store, self.clock = store, clock
        self.ttl_s, self.bucket_s = ttl_s, bucket_s
        self.keys = keys
        self._bucket, self._lease = -1, 0
        self._lock = asyncio.Lock()
        self.granted = 0  # leases this process granted and got recorded (for tests, metrics)

    def bucket(self) -> int:
        return int(self.clock.now() // self.bucket_s)

    async def current(self) -> int:
        """The lease id of the current bucket; fetched or granted once per bucket."""
        b = self.bucket()
        if b == self._bucket and self._lease:
            return self._lease
        async with self._lock:  # one fetch per bucket however many callers wait
            if b != self._bucket or not self._lease:
                self._lease = await self._fetch(b)
                self._bucket = b
            return self._lease

    def invalidate(self, lease_id: int) -> None:
        """A write found ``lease_id`` gone (LeaseNotFound): fetch or grant anew. Its
        record went with it (it is attached to the lease), so the next fetch grants."""
        if self._lease == lease_id:
            self._lease = 0

    async def _fetch(self, bucket: int) -> int:
        key = self.keys.session_lease(bucket)
        ttl = self.ttl_s + self.bucket_s
        for _ in range(MAX_ATTEMPTS):
            kv = await self.store.get(key)
            if kv is not None and kv.lease:
                return kv.lease
            # Never kept alive: it runs out at least ttl_s after its window ends.
            guard = Compare.mod_revision(key, kv.mod_revision if kv else 0)
            lease = await grant_and_put(
                self.store,
                ttl,
                [guard],
                key,
                lambda lease_id: encode(_BucketRecord(lease=lease_id, bucket=bucket, ttl_s=ttl)),
            )
            if lease:
                self.granted += 1
                log.debug("session lease %#x for bucket %d (ttl %d s)", lease, bucket, ttl)
                return lease
            # Another process recorded its lease first (ours was revoked): use that.
        raise LeaseContention(f"session lease of bucket {bucket} kept changing; retry")
