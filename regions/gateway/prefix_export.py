"""The gateway's prefix export: its tracker's counts, shipped to etcd for the leader.

Every ``interval_s`` (topology ``prefixes.export_interval_s``, 10 s by default) the
exporter writes ``PrefixTracker.export()`` to ``prefix-exports/<gateway id>``
(``Keys.prefix_export``), attached to the gateway's own lease of ``3 x interval``
seconds. Each round refreshes the lease, so a gateway that dies or stops exporting
leaves nothing behind once its lease runs out, and its counts stop counting. The
leader merges every export into ``prefixes/<region>`` (``controlplane.prefix_aggregator``).

* **What leaves the gateway**: the sketches, the heavy hitters with keyed session
  hashes (never session ids), and replay payloads only of prefixes this gateway saw
  from at least K sessions (the tracker's rule), or that the leader listed in
  ``prefix-wanted/<region>`` because the merged counts reached K sessions.
* **Bounded size**: an export over ``max_bytes`` (512 KiB by default; etcd refuses
  requests over 1.5 MiB) is cut, lowest-ranked first: payloads, then whole entries;
  the sketches stay. A warning says what was cut. If even the sketches do not fit,
  nothing is written (an error says so) and the old export expires with its lease.
* **Never in the way**: an unchanged export is not rewritten (the lease is still
  refreshed). Store errors are logged at most every ``error_every_s`` and retried the
  next round; nothing here fails the gateway or waits in a request's path. The
  export itself is serialized on the event loop (the tracker is not thread-safe):
  a few milliseconds every interval.
* A gateway stopping does not revoke its lease: during a rolling restart its last
  counts keep counting until the lease expires.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.config import PrefixesConfig
from controlplane.kernel.keys import Keys
from controlplane.kernel.leases import LeaseKeeper
from controlplane.kernel.prefix_catalog import PrefixWanted
from controlplane.kernel.prefix_tracker import (
    PrefixTracker,
    RegionExport,
    TrackerConfig,
    TrackerExport,
)
from controlplane.kernel.store.port import LeaseNotFound, Store, StoreError

log = logging.getLogger("tectonic.gateway.prefixes")

DEFAULT_MAX_BYTES = 512 * 1024
REWRITE_EVERY = 6  # rounds: an unchanged export is rewritten this often (heals a lost key)


@dataclass(frozen=True)
class ExportOptions:
    interval_s: float = 10.0
    max_bytes: int = DEFAULT_MAX_BYTES
    error_every_s: float = 30.0  # at most one store-error line per this many seconds

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.max_bytes < 1 or self.error_every_s < 0:
            raise ValueError(f"invalid prefix export options: {self}")

    @property
    def lease_ttl_s(self) -> int:
        """Three rounds: one lost write does not drop the export."""
        return max(2, math.ceil(3 * self.interval_s))

    @classmethod
    def from_topology(cls, prefixes: PrefixesConfig) -> ExportOptions:
        return cls(interval_s=prefixes.export_interval_s, max_bytes=prefixes.export_max_bytes)


def tracker_config(prefixes: PrefixesConfig, session_key: str = "") -> TrackerConfig:
    """A gateway's tracker as the topology's ``prefixes`` section describes it."""
    return TrackerConfig(
        params=prefixes.params, min_sessions=prefixes.min_sessions, session_key=session_key
    )


@dataclass(frozen=True)
class Cut:
    """What :func:`fit_export` left out."""

    before: int  # bytes
    after: int
    payloads: int = 0
    entries: int = 0


Rank = Callable[[str, str], int]  # (region, key) -> estimated count


def fit_export(blob: bytes, max_bytes: int, rank: Rank) -> tuple[bytes | None, Cut | None]:
    """``blob`` cut to ``max_bytes``: payloads of the lowest-ranked entries (all regions
    together) go first, then those entries. None when even the sketches do not fit;
    the Cut is None when nothing had to go."""
    if len(blob) <= max_bytes:
        return blob, None
    export = TrackerExport.model_validate_json(blob)
    entries = [list(r.entries) for r in export.regions]
    order = sorted(
        (rank(r.region, e.key), ri, ei)
        for ri, r in enumerate(export.regions)
        for ei, e in enumerate(r.entries)
    )
    payloads = 0
    excess = len(blob) - max_bytes
    for _, ri, ei in order:
        if excess <= 0:
            break
        e = entries[ri][ei]
        if e.payload is not None:
            excess -= len(e.payload.model_dump_json().encode()) - len(b"null")
            entries[ri][ei] = e.model_copy(update={"payload": None})
            payloads += 1
    gone: set[tuple[int, int]] = set()
    for _, ri, ei in order:
        if excess <= 0:
            break
        excess -= len(entries[ri][ei].model_dump_json().encode()) + len(b",")
        gone.add((ri, ei))
    regions = tuple(
        RegionExport(
            region=r.region,
            sketch=r.sketch,
            distinct=r.distinct,
            entries=tuple(e for ei, e in enumerate(entries[ri]) if (ri, ei) not in gone),
        )
        for ri, r in enumerate(export.regions)
    )
    out = export.model_copy(update={"regions": regions}).model_dump_json().encode()
    cut = Cut(len(blob), len(out), payloads, len(gone))
    if len(out) <= max_bytes:
        return out, cut
    if payloads or gone:  # the size estimate fell short: cut what is left
        again, more = fit_export(out, max_bytes, rank)
        assert more is not None
        return again, Cut(len(blob), more.after, payloads + more.payloads, len(gone) + more.entries)
    return None, cut  # nothing left to cut: the sketches alone are too big


class PrefixExporter:
    """Writes the tracker's export on the gateway's lease (see the module doc)."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        tracker: PrefixTracker,
        options: ExportOptions | None = None,
        *,
        gateway_id: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.keys, self.tracker = store, keys, tracker
        self.options = options or ExportOptions()
        self.gateway_id = gateway_id  # the server sets it once it knows its port
        self._clock = clock
        self._lease = LeaseKeeper(store, self.options.lease_ttl_s, clock=clock, log=log)
        self._written: bytes | None = None  # what the key holds, as far as we know
        self._unchanged = 0
        self._failures = 0  # since the last logged one
        self._logged_at = -math.inf
        self._cut_logged_at = -math.inf
        self.exports = 0  # writes that succeeded
        self.last_bytes = 0

    @property
    def key(self) -> str:
        return self.keys.prefix_export(self.gateway_id)

    async def run(self) -> None:
        """Export every interval until cancelled; never raises anything else."""
        while True:
            await asyncio.sleep(self.options.interval_s)
            await self.tick()

    async def tick(self) -> None:
        """One round, its errors logged (rate-limited) and swallowed: the next round
        retries. Bounded by two intervals, so a hung store cannot stall exporting."""
        try:
            async with asyncio.timeout(2 * self.options.interval_s):
                await self.export_once()
        except (StoreError, TimeoutError) as e:
            self._failed(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        except Exception:  # a bug in export must not end the gateway's task group
            self._failed("unexpected error", exc_info=True)
        else:
            if self._failures or self._logged_at > -math.inf:
                log.info("prefix export to %s works again", self.key)
                self._failures, self._logged_at = 0, -math.inf

    async def export_once(self) -> bool:
        """Refresh (or take) the lease and write the export if it changed. True when
        written. Raises StoreError (StoreUnavailable when etcd is down)."""
        if not self.gateway_id:
            return False  # not serving yet: nothing counted, no name
        blob = self._fitted(await self._wanted())
        if blob is None:
            return False  # logged; the old export expires with the lease
        await self._keep_lease()
        if blob == self._written and self._unchanged < REWRITE_EVERY:
            self._unchanged += 1
            return False
        try:
            await self.store.put(self.key, blob, lease=self._lease.id)
        except LeaseNotFound:  # expired between the refresh and the put
            self._lease.forget()
            await self._keep_lease()
            await self.store.put(self.key, blob, lease=self._lease.id)
        self._written, self._unchanged = blob, 0
        self.exports += 1
        self.last_bytes = len(blob)
        return True

    async def _keep_lease(self) -> None:
        """Refresh the lease (once a round, no keep-alive task), or take a new one."""
        if await self._lease.ensure(self._lease_gone):
            self._written = None  # the key went with the old lease

    def _lease_gone(self, lease: int) -> None:
        log.warning(
            "prefix export lease %#x expired (etcd unreachable for %ds?); taking a new one",
            lease,
            self.options.lease_ttl_s,
        )

    async def _wanted(self) -> dict[str, tuple[str, ...]]:
        """Region -> keys the leader asks payloads for (``prefix-wanted/``)."""
        page = await self.store.get_prefix(self.keys.prefix_wanted_prefix())
        out: dict[str, tuple[str, ...]] = {}
        for kv in page.kvs:
            try:
                w = decode(PrefixWanted, kv.value, kv.key)
            except CorruptValue as e:
                self._failed(str(e))
                continue
            out[w.region] = w.keys
        return out

    def _fitted(self, wanted: dict[str, tuple[str, ...]] | None = None) -> bytes | None:
        blob = self.tracker.export(wanted)
        out, cut = fit_export(blob, self.options.max_bytes, self.tracker.estimate)
        if cut is None:
            return out
        now = self._clock()
        if now - self._cut_logged_at < self.options.error_every_s:
            return out  # said so lately; the cut goes on every round while traffic lasts
        self._cut_logged_at = now
        if out is None:
            log.error(
                "prefix export of %d bytes exceeds %d even without payloads and entries "
                "(%d bytes left: the sketches); not exported. Raise prefixes.export_max_bytes "
                "or lower the tracker's lg_max_map_size",
                cut.before,
                self.options.max_bytes,
                cut.after,
            )
        else:
            log.warning(
                "prefix export cut from %d to %d bytes (limit %d): %d payloads and %d "
                "entries of the lowest-ranked prefixes left out",
                cut.before,
                cut.after,
                self.options.max_bytes,
                cut.payloads,
                cut.entries,
            )
        return out

    def _failed(self, what: str, *, exc_info: bool = False) -> None:
        self._failures += 1
        now = self._clock()
        if now - self._logged_at < self.options.error_every_s:
            return
        log.warning(
            "prefix export to %s failed (%d times since the last message; retried every %.3gs): %s",
            self.key,
            self._failures,
            self.options.interval_s,
            what,
            exc_info=exc_info,
        )
        self._failures, self._logged_at = 0, now
