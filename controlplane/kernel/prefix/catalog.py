"""The leader's per-region catalog of top prefixes (``prefixes/<r>`` in etcd).

The leader merges every gateway's tracker export (``controlplane.kernel.prefix.tracker``)
and writes, per serving region, the ranked heavy hitters with what residency needs
(distinct sessions seen, capped at K) and, for those that may leave, the replay
payload. A failover reads the source's catalog and asks :func:`catalog_selection`
what to replay on each target: the top 1 % of shared prefixes, those that may leave
into the target's zone, within the budget and the target's KV capacity.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_serializer,
    field_validator,
)

from controlplane.kernel.model import Frozen
from controlplane.kernel.prefix.identity import FingerprintParams
from controlplane.kernel.prefix.prewarm import (
    Candidate,
    PrewarmLimits,
    ReplayPayload,
    Residency,
    Selection,
    restore_payloads,
    select_prewarm,
    share_in_json,
    top_n,
)

TOP_FRACTION = 0.01  # docs/architecture.md §4: the top 1 % of shared prefixes


class CatalogEntry(Frozen):
    key: str
    count: int = Field(ge=0)  # estimated frequency (merged sketches)
    sessions: int = Field(ge=0)  # distinct sessions seen, capped at K
    payload: ReplayPayload | None = None  # only once seen from K sessions


class PrefixCatalog(Frozen):
    """Value of ``prefixes/<region>``: most frequent first, bounded in length. In JSON
    the payloads of one chain's levels are stored once
    (``prewarm_selection.shared_payloads``); read, every entry seen from K sessions has
    its own again."""

    region: str
    at: float  # when the leader merged it
    params: FingerprintParams
    min_sessions: int = Field(ge=1)  # the K the gateways counted to
    shared_prefixes: int = Field(ge=0)  # estimated distinct keys seen twice or more
    gateways: int = Field(0, ge=0)  # exports merged
    entries: tuple[CatalogEntry, ...] = ()

    @field_validator("entries", mode="after")
    @classmethod
    def _restore(cls, entries: tuple[CatalogEntry, ...], info: ValidationInfo) -> object:
        params, k = info.data.get("params"), info.data.get("min_sessions")
        if info.mode != "json" or params is None or k is None:
            return entries  # built here: every payload is already whole
        return restore_payloads(entries, params, _may_leave(entries, k))

    @field_serializer("entries", mode="wrap", when_used="json")
    def _share(
        self, entries: tuple[CatalogEntry, ...], handler: SerializerFunctionWrapHandler
    ) -> object:
        restorable = _may_leave(entries, self.min_sessions)
        return share_in_json(handler(entries), entries, self.params, restorable)


def _may_leave(entries: Sequence[CatalogEntry], k: int) -> list[bool]:
    """Entries whose payload a read may rebuild: a catalog carries payloads only of
    prefixes seen from K sessions (residency), rebuilt ones too."""
    return [e.sessions >= k for e in entries]


class PrefixWanted(Frozen):
    """Value of ``prefix-wanted/<region>``: prefixes seen from K distinct sessions only
    once the gateways' counts were merged, so no gateway exported their payload (each
    saw fewer than K). Gateways include the payloads of these keys in their next export:
    the K rule holds over the merged count, and the leader never asks for others."""

    region: str
    keys: tuple[str, ...] = ()


def wanted_keys(catalog: PrefixCatalog, limit: int = 128) -> PrefixWanted:
    """The catalog's entries that may leave (K sessions) but have no payload yet."""
    keys = [
        e.key for e in catalog.entries if e.payload is None and e.sessions >= catalog.min_sessions
    ]
    return PrefixWanted(region=catalog.region, keys=tuple(keys[:limit]))


def catalog_selection(
    catalog: PrefixCatalog,
    limits: PrewarmLimits,
    residency: Residency,
    fraction: float = TOP_FRACTION,
) -> Selection:
    """What to replay on one target from ``catalog`` (see the module doc). Raises
    ValueError if residency asks for more sessions than the gateways counted."""
    if residency.min_sessions > catalog.min_sessions:
        raise ValueError(
            f"residency asks for {residency.min_sessions} sessions; the gateways count "
            f"at most {catalog.min_sessions}"
        )
    n = top_n(fraction, catalog.shared_prefixes)
    # Ties (the levels of one shared prompt have equal counts) go deepest first: its
    # replay warms the shallower ones too.
    ranked = sorted(
        catalog.entries, key=lambda e: (-e.count, -(e.payload.blocks if e.payload else 0))
    )
    candidates = [
        Candidate(key=e.key, count=e.count, sessions=e.sessions, payload=e.payload)
        for e in ranked[:n]
    ]
    return select_prewarm(candidates, n, limits, residency)
