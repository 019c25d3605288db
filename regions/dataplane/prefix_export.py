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
* **Bounded size**: the levels of one prompt share one replay payload in the export
  (``TrackerExport``), so a shared template costs its size once, not once per level.
  An export over ``max_bytes`` (512 KiB by default; etcd refuses requests over
  1.5 MiB) is cut, lowest-ranked first: payloads, then whole entries; the sketches
  stay. A warning says what was cut, and ``tectonic_gateway_prefix_payloads_dropped``
  counts the payloads each written export lost. If even the sketches do not fit,
  nothing is written (an error says so) and the old export expires with its lease.
* **Never in the way**: an export equal to the one last written is not written again
  (the lease is still refreshed; a debug line says so). Store errors are logged at
  most every ``error_every_s`` and retried the next round; nothing here fails the
  gateway or waits in a request's path. The export itself is serialized on the event
  loop (the tracker is not thread-safe): a few milliseconds every interval.
* **Sealed** (``payload_keys``, topology ``prefixes.sealed_payloads``): every payload's
  prompt is sealed with the zone's active data key before it leaves
  (``controlplane.kernel.prefix.sealing``; the keys re-read every round). A key
  directory that cannot be used exports no payload at all, with an error, never one
  in clear.
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

from prometheus_client import Counter

from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.config import PrefixesConfig
from controlplane.kernel.keys import Keys
from controlplane.kernel.leases import LeaseKeeper
from controlplane.kernel.prefix.catalog import PrefixWanted
from controlplane.kernel.prefix.prewarm import fewest_to_drop, restore_payloads
from controlplane.kernel.prefix.sealing import Keyring, KeyringError, seal_entries
from controlplane.kernel.prefix.tracker import (
    EntryExport,
    PrefixTracker,
    TrackerConfig,
    TrackerExport,
)
from controlplane.kernel.store.port import LeaseNotFound, Store, StoreError

log = logging.getLogger("tectonic.gateway.prefixes")

DEFAULT_MAX_BYTES = 512 * 1024


@dataclass(frozen=True)
class ExportOptions:
    interval_s: float = 10.0
    max_bytes: int = DEFAULT_MAX_BYTES
    error_every_s: float = 30.0  # at most one store-error line per this many seconds
    # this zone's data keys (docs/residency.md); None: payloads leave in clear
    payload_keys: str | None = None

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.max_bytes < 1 or self.error_every_s < 0:
            raise ValueError(f"invalid prefix export options: {self}")

    @property
    def lease_ttl_s(self) -> int:
        """Three rounds: one lost write does not drop the export."""
        return max(2, math.ceil(3 * self.interval_s))

    @classmethod
    def from_topology(
        cls, prefixes: PrefixesConfig, payload_keys: str | None = None
    ) -> ExportOptions:
        return cls(
            interval_s=prefixes.export_interval_s,
            max_bytes=prefixes.export_max_bytes,
            payload_keys=payload_keys,
        )


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
    the Cut is None when nothing had to go. Sizes are measured encoded (a level shares
    its chain's payload there), by bisection."""
    if len(blob) <= max_bytes:
        return blob, None
    export = decode(TrackerExport, blob)
    regions = export.regions

    def order(at: tuple[int, int]) -> tuple[int, int, int, int]:
        e = regions[at[0]].entries[at[1]]
        # Of equal counts (one prompt's levels) the deepest first: its payload is the
        # one that holds the text, and the shallower levels keep theirs.
        return (rank(regions[at[0]].region, e.key), -(e.payload.blocks if e.payload else 0), *at)

    ranked = sorted(
        ((ri, ei) for ri, r in enumerate(regions) for ei in range(len(r.entries))), key=order
    )
    with_payload = [(ri, ei) for ri, ei in ranked if regions[ri].entries[ei].payload is not None]

    def cut(payloads: int, entries: int = 0) -> TrackerExport:
        bare, gone = set(with_payload[:payloads]), set(ranked[:entries])
        kept = tuple(
            r.model_copy(
                update={
                    "entries": tuple(
                        e.model_copy(update={"payload": None}) if (ri, ei) in bare else e
                        for ei, e in enumerate(r.entries)
                        if (ri, ei) not in gone
                    )
                }
            )
            for ri, r in enumerate(regions)
        )
        return export.model_copy(update={"regions": kept})

    def size(x: TrackerExport) -> int:
        return len(x.model_dump_json())

    every = len(with_payload)
    payloads = fewest_to_drop(every, lambda m: size(cut(m)) <= max_bytes)
    entries: int | None = 0
    if payloads is None:
        payloads = every
        entries = fewest_to_drop(len(ranked), lambda n: size(cut(every, n)) <= max_bytes)
    if entries is None:  # nothing left to cut: the sketches alone are too big
        bare = size(cut(every, len(ranked)))
        return None, Cut(len(blob), bare, _with_payloads(export), len(ranked))
    out = cut(payloads, entries)
    raw = out.model_dump_json().encode()
    # A payload dropped here that a deeper one kept still holds is rebuilt on read: not lost.
    lost = _with_payloads(export) - _with_payloads(out)
    return raw, Cut(len(blob), len(raw), lost, entries)


def _with_payloads(export: TrackerExport) -> int:
    """Entries that have a payload once the export is read."""
    return sum(
        e.payload is not None
        for r in export.regions
        for e in restore_payloads(r.entries, export.params)
    )


def _bare(e: EntryExport) -> EntryExport:
    return e if e.payload is None else e.model_copy(update={"payload": None})


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
        payloads_dropped: Counter | None = None,
    ) -> None:
        """``payloads_dropped``: the gateway's ``tectonic_gateway_prefix_payloads_dropped``
        (``GatewayMetrics.prefix_payloads_dropped``)."""
        self.store, self.keys, self.tracker = store, keys, tracker
        self.options = options or ExportOptions()
        self.gateway_id = gateway_id  # the server sets it once it knows its port
        self._clock = clock
        self._lease = LeaseKeeper(store, self.options.lease_ttl_s, clock=clock, log=log)
        self._written: bytes | None = None  # what the key holds, as far as we know
        self._payloads_dropped = payloads_dropped
        self._failures = 0  # since the last logged one
        self._logged_at = -math.inf
        self._cut_logged_at = -math.inf
        self._seal_logged_at = -math.inf
        self._unsealed = 0  # payloads the last export left out: no key to seal them
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
        blob, cut = self._fitted(await self._wanted())
        if blob is None:
            self._dropped(cut)
            return False  # logged; the old export expires with the lease
        await self._keep_lease()
        if blob == self._written:
            # The key holds it on a live lease (a new lease clears _written): a put would
            # only add a copy to etcd's history.
            log.debug("prefix export to %s unchanged (%d bytes): not written", self.key, len(blob))
            return False
        try:
            await self.store.put(self.key, blob, lease=self._lease.id)
        except LeaseNotFound:  # expired between the refresh and the put
            self._lease.forget()
            await self._keep_lease()
            await self.store.put(self.key, blob, lease=self._lease.id)
        self._written = blob
        self.exports += 1
        self.last_bytes = len(blob)
        self._dropped(cut)
        return True

    def _dropped(self, cut: Cut | None) -> None:
        """Count the payloads a cut, or keys that could not seal them, kept out of an
        export that went (or could not go)."""
        if self._payloads_dropped is None:
            return
        if cut is not None and cut.payloads:
            self._payloads_dropped.inc(cut.payloads)
        if self._unsealed:
            self._payloads_dropped.inc(self._unsealed)

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

    def _fitted(
        self, wanted: dict[str, tuple[str, ...]] | None = None
    ) -> tuple[bytes | None, Cut | None]:
        blob = self._sealed(self.tracker.export_model(wanted)).model_dump_json().encode()
        out, cut = fit_export(blob, self.options.max_bytes, self.tracker.estimate)
        if cut is None:
            return out, cut
        now = self._clock()
        if now - self._cut_logged_at < self.options.error_every_s:
            return out, cut  # said so lately; the cut goes on every round while traffic lasts
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
        return out, cut

    def _sealed(self, export: TrackerExport) -> TrackerExport:
        """``export`` with its payloads sealed when this gateway seals; without them
        (an error said why) when its keys cannot be read."""
        where = self.options.payload_keys
        self._unsealed = 0
        if where is None:
            return export
        try:
            ring = Keyring.load(where)
            if ring.active is None:
                raise KeyringError(f"payload keys: {where} has no 'active' file naming a key")
            regions = tuple(
                r.model_copy(update={"entries": seal_entries(r.entries, ring, export.params)})
                for r in export.regions
            )
        except (OSError, KeyringError) as e:
            now = self._clock()
            if now - self._seal_logged_at >= self.options.error_every_s:
                self._seal_logged_at = now
                log.error("prefix export: no payload exported (none leaves in clear): %s", e)
            self._unsealed = sum(e.payload is not None for r in export.regions for e in r.entries)
            regions = tuple(
                r.model_copy(
                    update={
                        "entries": tuple(e.model_copy(update={"payload": None}) for e in r.entries)
                    }
                )
                for r in export.regions
            )
        return export.model_copy(update={"regions": regions})

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
