"""The leader's half of the prefix pipeline: every gateway's export, merged per region.

Gateways write their tracker exports under ``prefix-exports/`` on their own leases
(``regions.dataplane.prefix_export``). Every ``prefixes.aggregate_interval_s`` the
leader reads them all (one consistent read), merges them into a fresh
``PrefixTracker`` (counts add, session sets union capped at K) and writes, per
region, ``prefixes/<region>`` = a :class:`PrefixCatalog`: the ``max_entries`` most
frequent prefixes with their session counts and, for those seen from K sessions,
their replay payloads. Beside it, ``prefix-wanted/<region>`` lists the prefixes that
reached K sessions only in the merge (no gateway saw K, so none exported a payload);
gateways add those payloads to their next export. The leader's cycle runs it as a
periodic job (``controlplane.core.publish.prefix_aggregation``).

* An export that does not parse, or was counted with other fingerprint parameters
  or another K, is skipped with a warning (once per gateway and problem); the others
  are merged.
* Every write is fenced by leadership (``controlplane/fenced.py``: the election's
  compares in the same txn), so a deposed leader writes nothing. Not leading,
  ``run_once`` reads nothing either.
* A region that no live export mentions keeps its last catalog (its ``at`` shows its
  age): when a region dies with its gateways, the failover still finds what was hot.
* A payload, once in a region's catalog, stays while its entry does (still ranked,
  still seen from K sessions; a key's payload never changes): a gateway's export cuts
  the payloads of its lowest-ranked prefixes to fit ``export_max_bytes``, and while a
  region is failed over its gateways count its traffic under the targets, whose
  growing counts push the region's own payloads out. Without this the region's catalog
  would erode during a failover (measured: 19 prompts with payloads, 7 after 60 s)
  and the recovery pre-warm (``AgentPrewarmer.prewarm_home``) would find little.
  Sealed payloads (docs/residency.md) are carried only under a key the region's fresh
  exports still seal with, so a rotated key's envelopes age out; with
  ``prefixes.sealed_payloads`` a payload in clear is dropped (warned once), never kept.
* A catalog over ``max_catalog_bytes`` (etcd refuses requests over 1.5 MiB) loses the
  payloads of its lowest-ranked entries first, then those entries, with a warning. The
  size is the stored one: the levels of one prompt share one payload there
  (``PrefixCatalog``), so a level costs only its own text.
* A catalog is written when it changed, an unchanged one only every ``REWRITE_EVERY``
  rounds (its ``at`` says it is still current), so an idle deployment does not fill
  etcd's history with copies; ``prefix-wanted/<region>`` only when it changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from controlplane.election import NotLeader
from controlplane.fenced import Fence, FencedWriter
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.config import PrefixesConfig
from controlplane.kernel.keys import Keys
from controlplane.kernel.prefix.catalog import (
    CatalogEntry,
    PrefixCatalog,
    PrefixWanted,
    wanted_keys,
)
from controlplane.kernel.prefix.prewarm import ReplayPayload, fewest_to_drop
from controlplane.kernel.prefix.sealing import sealed_kid
from controlplane.kernel.prefix.tracker import PrefixTracker, TrackerConfig, TrackerExport
from controlplane.kernel.store.port import Put, Store

log = logging.getLogger("tectonic.prefixes")

REWRITE_EVERY = 6  # rounds
READ_BYTES = 32 << 20  # exports read per page (the client takes up to 64 MiB)


class PrefixAggregator:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        config: PrefixesConfig,
        clock: Clock,
        fence: Fence,
        *,
        regions: Collection[str] | None = None,
        on_written: Callable[[str, PrefixCatalog], None] | None = None,
    ) -> None:
        """``regions``: the topology's; catalogs of others are not written.
        ``on_written``: told of every catalog written (the leader's metrics)."""
        self.store, self.keys, self.config = store, keys, config
        self.clock, self.fence = clock, fence
        self.writer = FencedWriter(store, fence)
        self.regions = None if regions is None else frozenset(regions)
        self._sealed_only = config.sealed_payloads
        self._on_written = on_written
        self._tracker_config = TrackerConfig(
            params=config.params,
            min_sessions=config.min_sessions,
            doorkeeper_lg_bits=0,  # merges only: nothing is observed here
            max_payloads=max(512, 2 * config.max_entries),
        )
        self._page = max(1, READ_BYTES // config.export_max_bytes)
        self._skipped: dict[str, str] = {}  # export key -> problem, last round
        self._skipping: dict[str, str] = {}  # this round
        self._last: dict[str, tuple[PrefixCatalog, int]] = {}  # region -> (written, rounds)
        self._wanted: dict[str, PrefixWanted] = {}  # region -> written this term

    def forget(self) -> None:
        """Leadership lost: a later term writes every catalog afresh."""
        self._last.clear()
        self._wanted.clear()

    async def run_once(self) -> dict[str, PrefixCatalog]:
        """Merge every export and write each region's catalog; returns the catalogs
        written (none when not leading). Raises StoreError."""
        try:
            self.fence()
        except NotLeader:
            self.forget()
            return {}
        page = await self.store.get_prefix(self.keys.prefix_exports_prefix(), page_size=self._page)
        tracker = PrefixTracker(self._tracker_config)
        contributors: dict[str, int] = {}
        self._skipping = {}
        for kv in page.kvs:
            try:
                # decode: fields a newer gateway adds are dropped, not taken as corruption
                export = decode(TrackerExport, kv.value, kv.key)
                tracker.merge(export)
            except ValueError as e:  # CorruptValue and the merge's refusals
                self._skip(kv.key, " ".join(str(e).split())[:400])
                continue
            for r in export.regions:
                contributors[r.region] = contributors.get(r.region, 0) + 1
        written: dict[str, PrefixCatalog] = {}
        for region in tracker.regions:
            if self.regions is not None and region not in self.regions:
                self._skip(f"for region {region}", "not in the topology; no catalog written")
                continue
            fresh = self._catalog(tracker, region, contributors.get(region, 0))
            if self._sealed_only and (clear := clear_payloads(fresh)):
                self._skip(
                    f"payloads for region {region}",
                    f"{clear} in clear while prefixes.sealed_payloads is on: dropped "
                    "(a gateway without --payload-keys, or older than this leader)",
                )
            previous = await self._previous(region)
            catalog = self._fit(carry_payloads(fresh, previous, sealed_only=self._sealed_only))
            if not self._due(region, catalog):
                continue
            puts = [Put(self.keys.prefixes(region), encode(catalog))]
            wanted = wanted_keys(catalog)
            if self._wanted.get(region) != wanted:
                puts.append(Put(self.keys.prefix_wanted(region), encode(wanted)))
            try:
                result = await self.writer.txn(puts)
            except NotLeader:
                result = None
            if result is None or not result.succeeded:
                log.info("prefix catalogs not written: leadership lost")
                self.forget()
                break
            self._last[region] = (catalog, 0)
            self._wanted[region] = wanted
            written[region] = catalog
            if self._on_written is not None:
                self._on_written(region, catalog)
        self._skipped = self._skipping
        return written

    def _catalog(self, tracker: PrefixTracker, region: str, gateways: int) -> PrefixCatalog:
        k = self.config.min_sessions
        entries: list[CatalogEntry] = []
        for key, estimate, _, _ in tracker.ranked(region)[: self.config.max_entries]:
            payload, sessions = tracker.entry(region, key) or (None, 0)
            entries.append(
                CatalogEntry(
                    key=key,
                    count=estimate,
                    sessions=sessions,
                    # residency (docs/architecture.md §4)
                    payload=payload if sessions >= k else None,
                )
            )
        return PrefixCatalog(
            region=region,
            at=self.clock.now(),
            params=self.config.params,
            min_sessions=k,
            shared_prefixes=tracker.shared_prefixes(region),
            gateways=gateways,
            entries=tuple(entries),
        )

    async def _previous(self, region: str) -> PrefixCatalog | None:
        """The region's last catalog: written this term, else as etcd holds it."""
        last = self._last.get(region)
        if last is not None:
            return last[0]
        kv = await self.store.get(self.keys.prefixes(region))
        if kv is None:
            return None
        try:
            return decode(PrefixCatalog, kv.value, kv.key)
        except CorruptValue:
            return None  # rewritten from the exports alone

    def _due(self, region: str, catalog: PrefixCatalog) -> bool:
        """Whether to write: changed, or unchanged for REWRITE_EVERY rounds."""
        last = self._last.get(region)
        if last is None or _content(last[0]) != _content(catalog):
            return True
        if last[1] + 1 >= REWRITE_EVERY:
            return True
        self._last[region] = (last[0], last[1] + 1)
        return False

    def _fit(self, catalog: PrefixCatalog) -> PrefixCatalog:
        """The catalog cut to ``max_catalog_bytes`` (warning when cut)."""
        limit = self.config.max_catalog_bytes
        out, payloads, dropped = fit_catalog(catalog, limit)
        if payloads or dropped:
            log.warning(
                "prefix catalog of %s cut to %d bytes (limit %d): %d payloads and %d "
                "entries of the lowest-ranked prefixes left out",
                catalog.region,
                len(encode(out)),
                limit,
                payloads,
                dropped,
            )
        return out

    def _skip(self, what: str, problem: str) -> None:
        """Log a problem once while it lasts (a bad gateway exports every interval)."""
        if self._skipped.get(what) != problem:
            log.warning("prefix export %s skipped: %s", what, problem)
        self._skipping[what] = problem


def carry_payloads(
    catalog: PrefixCatalog, previous: PrefixCatalog | None, *, sealed_only: bool = False
) -> PrefixCatalog:
    """``catalog`` with the payloads ``previous`` had for entries that have none now but
    are still seen from K sessions (see the module doc). Sealed payloads
    (docs/residency.md) are carried only under a key id the fresh catalog still uses,
    so that a rotated key's envelopes age out; with ``sealed_only`` (the topology's
    ``prefixes.sealed_payloads``) a payload in clear is never kept."""

    def kept(p: ReplayPayload | None) -> bool:
        return p is not None and (p.sealed is not None or not sealed_only)

    fresh = tuple(
        e if e.payload is None or kept(e.payload) else e.model_copy(update={"payload": None})
        for e in catalog.entries
    )
    if previous is None or previous.params != catalog.params:
        return catalog.model_copy(update={"entries": fresh})
    live = {kid for e in fresh if (kid := sealed_kid(e.payload)) is not None}

    def carried(p: ReplayPayload) -> bool:
        kid = sealed_kid(p)
        return kept(p) and (not live or kid is None or kid in live)

    old = {e.key: e.payload for e in previous.entries if e.payload is not None}
    k = catalog.min_sessions
    entries = tuple(
        e.model_copy(update={"payload": old[e.key]})
        if e.payload is None and e.sessions >= k and e.key in old and carried(old[e.key])
        else e
        for e in fresh
    )
    return catalog.model_copy(update={"entries": entries})


def clear_payloads(catalog: PrefixCatalog) -> int:
    """How many of ``catalog``'s payloads are in clear."""
    return sum(e.payload is not None and e.payload.sealed is None for e in catalog.entries)


def fit_catalog(catalog: PrefixCatalog, limit: int) -> tuple[PrefixCatalog, int, int]:
    """``catalog`` cut to ``limit`` bytes of JSON, lowest-ranked entries first: their
    payloads, then the entries themselves; with the payloads and entries cut. Sizes are
    measured encoded (a level shares its chain's payload there), by bisection."""
    if len(encode(catalog)) <= limit:
        return catalog, 0, 0
    entries = catalog.entries
    with_payload = [i for i in reversed(range(len(entries))) if entries[i].payload is not None]

    def cut(payloads: int, dropped: int = 0) -> PrefixCatalog:
        bare = set(with_payload[:payloads])
        kept = tuple(
            e.model_copy(update={"payload": None}) if i in bare else e
            for i, e in enumerate(entries[: len(entries) - dropped])
        )
        return catalog.model_copy(update={"entries": kept})

    def fits(c: PrefixCatalog) -> bool:
        return len(encode(c)) <= limit

    payloads = fewest_to_drop(len(with_payload), lambda m: fits(cut(m)))
    if payloads is not None:
        return cut(payloads), payloads, 0
    dropped = fewest_to_drop(len(entries), lambda n: fits(cut(len(with_payload), n)))
    dropped = len(entries) if dropped is None else dropped
    return cut(len(with_payload), dropped), len(with_payload), dropped


def _content(c: PrefixCatalog) -> PrefixCatalog:
    return c.model_copy(update={"at": 0.0})
