"""The prefix tracker: counts prompt prefixes per region in a mergeable sketch.

A gateway holds one :class:`PrefixTracker` behind its ``PrefixObserver``
(``regions/dataplane/observe.py``). Per request it computes the prompt's level keys
(``controlplane.kernel.prefix.identity``: vLLM-aligned block chains, or their character proxy)
and counts each key in the serving region's **frequent-items sketch** (Apache
DataSketches ``frequent_strings_sketch``, a Misra-Gries sketch with a bounded map:
at most ``0.75 * 2**lg_max_map_size`` keys, mergeable, serializable; typed in
``controlplane.kernel.prefix.sketches``). Next to it:

* a doorkeeper (:class:`Doorkeeper`, two small Bloom filters, local): a key enters
  the sketch only on its second sighting (with weight 2), so the unique suffix levels
  of prompts, which are most keys, never dilute the sketch's counts (at 200,000
  prompts of the bench workload recall stays 1.0 with it, 0.88 without);

* a bounded map (``max_payloads`` per region) from current heavy hitters to their
  :class:`ReplayPayload` and the distinct sessions seen (a set capped at K). A key
  gets an entry once the sketch's lower bound for it reaches ``admit_count``
  (2: seen twice while tracked), so unique suffixes never do; when the map is full
  the half with the lowest lower bounds is dropped. Sessions are counted from
  admission on, so the residency count is a lower bound (it errs towards keeping
  a prefix in its region).
* a sample of the distinct keys with their exact counts (DataSketches tuple sketch,
  sum policy, ``2**distinct_lg_k`` keys): the number of distinct keys seen at least
  twice, i.e. of shared prefixes, is its distinct estimate times the sampled share
  with a count of 2 or more; ``top(0.01, ...)`` takes 1 % of that.

``export()`` serializes all of it (JSON; sketches base64; the levels of one prompt
written as one payload, :class:`TrackerExport`); payloads of prefixes seen from fewer
than K sessions are left out: they never leave the gateway. The leader
``merge()``-s every gateway's export and asks ``top(...)`` what to replay on a
failover target (``controlplane.kernel.prefix.prewarm.select_prewarm``).

The tracker is not thread-safe: the gateway calls it from its event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_serializer,
    field_validator,
)

from controlplane.kernel.codec import decode
from controlplane.kernel.model import Frozen
from controlplane.kernel.prefix import sketches
from controlplane.kernel.prefix.identity import FingerprintParams, Level, PromptRequest, levels
from controlplane.kernel.prefix.prewarm import (
    Candidate,
    PrewarmLimits,
    ReplayPayload,
    Residency,
    Selection,
    merge_sessions,
    replay_payload,
    restore_payloads,
    select_prewarm,
    session_hash,
    share_in_json,
    top_n,
)
from controlplane.kernel.prefix.sketches import DistinctSketch, FrequentItem

log = logging.getLogger("tectonic.prefixes")

Tokenize = Callable[[PromptRequest], Sequence[int] | None]


_SESSION_MEMO = 4096  # session ids whose keyed hash is kept, each of at most:
_SESSION_MEMO_CHARS = 256  # the gateway's limit on a session id


class TrackerConfig(Frozen):
    params: FingerprintParams = Field(default_factory=FingerprintParams)
    lg_max_map_size: int = Field(12, ge=3, le=20)  # 4,096: up to 3,072 keys, < 100 KB
    distinct_lg_k: int = Field(10, ge=4, le=16)  # the distinct-keys sample: 1,024 keys
    doorkeeper_lg_bits: int = Field(22, ge=0, le=30)  # 2 x 512 KiB; 0: no doorkeeper
    max_payloads: int = Field(512, ge=2)  # heavy hitters with a payload, per region
    max_regions: int = Field(64, ge=1)
    min_sessions: int = Field(3, ge=1)  # K (docs/architecture.md §4 residency)
    admit_count: int = Field(2, ge=1)  # sketch lower bound before a key gets a payload
    session_key: str = ""  # keys the session-id hash; the same on every gateway
    model: str = ""  # the model ``observe`` assumes (the gateway protocol carries none)

    @field_validator("doorkeeper_lg_bits")
    @classmethod
    def _doorkeeper_size(cls, v: int) -> int:
        if 0 < v < 10:
            raise ValueError("doorkeeper_lg_bits is 0 (off) or 10 and more")
        return v


class EntryExport(Frozen):
    key: str
    sessions: tuple[str, ...] = ()  # keyed session hashes, at most K
    payload: ReplayPayload | None = None  # only once seen from K sessions


class RegionExport(Frozen):
    model_config = ConfigDict(
        frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64"
    )

    region: str
    sketch: bytes  # frequent_strings_sketch.serialize(), base64 in JSON
    distinct: bytes  # compact_tuple_sketch.serialize(PyLongsSerDe()), base64 in JSON
    entries: tuple[EntryExport, ...] = ()


class TrackerExport(Frozen):
    """A tracker's export as JSON writes it: in each region, the payloads of one chain's
    levels are stored once (``prewarm_selection.shared_payloads``) and every level has
    its own again when read."""

    version: Literal[1] = 1
    params: FingerprintParams
    min_sessions: int
    regions: tuple[RegionExport, ...] = ()

    @field_validator("regions", mode="after")
    @classmethod
    def _restore(cls, regions: tuple[RegionExport, ...], info: ValidationInfo) -> object:
        params = info.data.get("params")
        if info.mode != "json" or params is None:
            return regions  # built here: every payload is already whole
        return tuple(
            r.model_copy(update={"entries": restore_payloads(r.entries, params)}) for r in regions
        )

    @field_serializer("regions", mode="wrap", when_used="json")
    def _share(
        self, regions: tuple[RegionExport, ...], handler: SerializerFunctionWrapHandler
    ) -> object:
        out = handler(regions)
        for r, data in zip(regions, out, strict=True):
            share_in_json(data["entries"], r.entries, self.params)
        return out


class _Entry:
    __slots__ = ("payload", "sessions")

    def __init__(self, payload: ReplayPayload | None, sessions: set[str]) -> None:
        self.payload = payload
        self.sessions = sessions


class Doorkeeper:
    """Keys seen once lately (TinyLFU's doorkeeper): two Bloom filters of ``2**lg_bits``
    bits with two probes, the current one and the previous; when the current one has
    taken ``2**lg_bits / 8`` keys it becomes the previous one. Keys it has not seen
    stay out of the frequent-items sketch, so unique suffixes no longer push shared
    prefixes out of it. Local to one tracker, never exported. A false positive
    (about 5 % at the end of a window) lets a first sighting in with weight 2."""

    __slots__ = ("_cap", "_cur", "_mask", "_n", "_prev")

    def __init__(self, lg_bits: int) -> None:
        self._mask = (1 << lg_bits) - 1
        self._cap = 1 << (lg_bits - 3)
        self._cur = bytearray(1 << (lg_bits - 3))
        self._prev = bytearray(1 << (lg_bits - 3))
        self._n = 0

    def seen_or_add(self, h: int) -> bool:
        """Whether ``h`` was (probably) added lately; adds it if not."""
        a, b = h & self._mask, (h >> 32) & self._mask
        ia, ma, ib, mb = a >> 3, 1 << (a & 7), b >> 3, 1 << (b & 7)
        cur, prev = self._cur, self._prev
        if (cur[ia] & ma and cur[ib] & mb) or (prev[ia] & ma and prev[ib] & mb):
            return True
        cur[ia] |= ma
        cur[ib] |= mb
        self._n += 1
        if self._n >= self._cap:
            self._prev, self._cur, self._n = cur, bytearray(len(cur)), 0
        return False


class _Region:
    __slots__ = ("distinct", "door", "entries", "merged", "sketch")

    def __init__(self, config: TrackerConfig) -> None:
        lg = config.doorkeeper_lg_bits
        self.door = Doorkeeper(lg) if lg else None
        self.sketch = sketches.frequent(config.lg_max_map_size)
        self.distinct = sketches.distinct(config.distinct_lg_k)  # updated on the hot path
        self.merged: DistinctSketch | None = None  # what merges brought (a compact sketch)
        self.entries: dict[str, _Entry] = {}

    def all_distinct(self, lg_k: int) -> DistinctSketch:
        if self.merged is None:
            return self.distinct
        return sketches.distinct_union(lg_k, [self.distinct, self.merged])


class PrefixTracker:
    """See the module doc (``regions.dataplane.observe.TrackerObserver`` adapts it)."""

    def __init__(self, config: TrackerConfig | None = None, *, tokenize: Tokenize | None = None):
        self.config = config or TrackerConfig()
        self.params = self.config.params
        self._tokenize = tokenize
        self._session_key = self.config.session_key.encode()
        self._regions: dict[str, _Region] = {}
        self._session_hashes: dict[str, str] = {}
        self.errors = 0  # observations dropped because they failed

    # ---- the hot path -------------------------------------------------------------------

    def observe(self, region: str, session_id: str, prompt_prefix: str) -> None:
        """The gateway protocol: a text prompt of the configured model."""
        self.observe_request(region, session_id, PromptRequest(self.config.model, prompt_prefix))

    def observe_request(self, region: str, session_id: str, request: PromptRequest) -> None:
        """Count one request's prefixes; never raises (a failure is counted and logged)."""
        try:
            self._observe(region, session_id, request)
        except Exception:
            self.errors += 1
            if self.errors == 1:
                log.exception("prefix tracker: observation dropped (later ones counted only)")

    def _observe(self, region: str, session_id: str, request: PromptRequest) -> None:
        ids: Sequence[int] | None = None
        if self._tokenize is not None and request.token_ids is None:
            ids = self._tokenize(request)
        chain = levels(request, self.params, ids)
        if not chain:
            return
        st = self._region(region)
        sketch, distinct, entries = st.sketch, st.distinct, st.entries
        admit, cap = self.config.admit_count, self.config.min_sessions
        session = self._session(session_id) if session_id else None
        door = st.door
        for i, (key, _, hash64) in enumerate(chain):
            distinct.update(key, 1)
            entry = entries.get(key)
            if entry is None:
                if door is not None and sketch.get_estimate(key) == 0:
                    if not door.seen_or_add(hash64):
                        continue  # a first sighting: most are a prompt's own suffix
                    sketch.update(key, 2)  # the sighting the doorkeeper held, and this one
                else:
                    sketch.update(key)
                if sketch.get_lower_bound(key) < admit:
                    continue
                entry = self._admit(st, request, chain, i, ids)
            else:
                sketch.update(key)
            if session is not None and len(entry.sessions) < cap:
                entry.sessions.add(session)

    def _session(self, session_id: str) -> str:
        """The keyed hash of a session id, memoised (a session sends many requests);
        the memo is bounded: cleared when full."""
        h = self._session_hashes.get(session_id)
        if h is None:
            h = session_hash(session_id, self._session_key)
            if len(session_id) > _SESSION_MEMO_CHARS:
                return h
            if len(self._session_hashes) >= _SESSION_MEMO:
                self._session_hashes.clear()
            self._session_hashes[session_id] = h
        return h

    def _region(self, region: str) -> _Region:
        st = self._regions.get(region)
        if st is None:
            if len(self._regions) >= self.config.max_regions:
                raise ValueError(f"more than {self.config.max_regions} regions tracked")
            st = self._regions[region] = _Region(self.config)
        return st

    def _admit(
        self,
        st: _Region,
        request: PromptRequest,
        chain: Sequence[Level],
        i: int,
        ids: Sequence[int] | None,
    ) -> _Entry:
        if len(st.entries) >= self.config.max_payloads:
            self._prune(st, self.config.max_payloads // 2)
        level = chain[i]
        ancestors = [lv.key for lv in chain[:i]]
        payload = replay_payload(request, level, self.params, ids, ancestors)
        entry = st.entries[level.key] = _Entry(payload, set())
        return entry

    def _prune(self, st: _Region, keep: int) -> None:
        """Keep the ``keep`` entries with the highest lower bounds (amortized O(1))."""
        lb = st.sketch.get_lower_bound
        ranked = sorted(st.entries, key=lb, reverse=True)
        for key in ranked[keep:]:
            del st.entries[key]

    # ---- export and merge ------------------------------------------------------------

    def export(self, wanted: Mapping[str, Collection[str]] | None = None) -> bytes:
        """:meth:`export_model` as JSON."""
        return self.export_model(wanted).model_dump_json().encode()

    def export_model(self, wanted: Mapping[str, Collection[str]] | None = None) -> TrackerExport:
        """Sketches and heavy-hitter entries of every region; payloads only of prefixes
        seen from at least K distinct sessions here, or that the leader ``wanted``
        (region -> keys it saw from K sessions once merged)."""
        k, lg_k = self.config.min_sessions, self.config.distinct_lg_k
        asked = {region: set(keys) for region, keys in (wanted or {}).items()}
        regions = tuple(
            RegionExport(
                region=name,
                sketch=st.sketch.serialize(),
                distinct=sketches.distinct_bytes(lg_k, st.all_distinct(lg_k)),
                entries=tuple(
                    EntryExport(
                        key=key,
                        sessions=tuple(sorted(e.sessions)),
                        payload=(
                            e.payload
                            if len(e.sessions) >= k or key in asked.get(name, ())
                            else None
                        ),
                    )
                    for key, e in st.entries.items()
                ),
            )
            for name, st in sorted(self._regions.items())
        )
        return TrackerExport(params=self.params, min_sessions=k, regions=regions)

    def merge(self, blob: bytes | TrackerExport) -> None:
        """Add another tracker's export (the leader, per region, from every gateway).
        Raises ValueError, having changed nothing, when the export is malformed or the
        two trackers were configured differently."""
        try:
            # decode: fields a newer gateway adds are dropped, not taken as corruption
            other = blob if isinstance(blob, TrackerExport) else decode(TrackerExport, blob)
            if other.params != self.params or other.min_sessions != self.config.min_sessions:
                raise ValueError(
                    f"cannot merge a tracker export with {other.params!r}, "
                    f"K={other.min_sessions} into one with {self.params!r}, "
                    f"K={self.config.min_sessions}"
                )
            unknown = {r.region for r in other.regions} - set(self._regions)
            if len(self._regions) + len(unknown) > self.config.max_regions:
                raise ValueError(f"more than {self.config.max_regions} regions tracked")
            parsed = [
                (r, sketches.frequent_from(r.sketch), sketches.distinct_from(r.distinct))
                for r in other.regions
            ]
        except ValueError:
            raise
        except Exception as err:  # the sketches' own decoding errors
            raise ValueError(f"malformed tracker export: {err}") from err
        k, lg_k = self.config.min_sessions, self.config.distinct_lg_k
        for r, sketch, distinct in parsed:
            st = self._region(r.region)
            st.sketch.merge(sketch)
            st.merged = sketches.distinct_union(
                lg_k, [distinct] if st.merged is None else [st.merged, distinct]
            )
            for e in r.entries:
                mine = st.entries.get(e.key)
                if mine is None:
                    st.entries[e.key] = _Entry(e.payload, merge_sessions((), e.sessions, k))
                    continue
                mine.sessions = merge_sessions(mine.sessions, e.sessions, k)
                if mine.payload is None:
                    mine.payload = e.payload
            if len(st.entries) > self.config.max_payloads:
                self._prune(st, self.config.max_payloads)

    # ---- reading -----------------------------------------------------------------------

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(sorted(self._regions))

    def ranked(self, region: str) -> list[FrequentItem]:
        """Every key the region's sketch tracks, most frequent first."""
        st = self._regions.get(region)
        if st is None:
            return []
        items = st.sketch.get_frequent_items(sketches.ALL_ITEMS, 0)
        return sorted(items, key=lambda it: (-it[1], it[0]))

    def estimate(self, region: str, key: str) -> int:
        st = self._regions.get(region)
        return 0 if st is None else st.sketch.get_estimate(key)

    def shared_prefixes(self, region: str) -> int:
        """Estimated distinct keys seen at least twice (the base of ``top``'s 1 %): a
        key seen once is a prompt's own suffix, not a prefix anyone shares."""
        st = self._regions.get(region)
        if st is None:
            return 0
        return round(sketches.shared_estimate(st.all_distinct(self.config.distinct_lg_k), 2))

    def entry(self, region: str, key: str) -> tuple[ReplayPayload | None, int] | None:
        """The payload and distinct-session count (capped at K) kept for a key."""
        st = self._regions.get(region)
        e = None if st is None else st.entries.get(key)
        return None if e is None else (e.payload, len(e.sessions))

    def sketch_bytes(self, region: str) -> int:
        """Serialized size of the region's sketches (frequent items and the distinct-key
        sample), as exported; payloads and session hashes excluded."""
        st = self._regions.get(region)
        if st is None:
            return 0
        lg_k = self.config.distinct_lg_k
        return len(st.sketch.serialize()) + len(
            sketches.distinct_bytes(lg_k, st.all_distinct(lg_k))
        )

    def top(
        self,
        region: str,
        n_or_fraction: float,
        limits: PrewarmLimits,
        residency: Residency,
    ) -> Selection:
        """What to replay on a failover target for ``region``'s traffic: of the top
        ``n`` (an int) or fraction of shared prefixes (a float, e.g. 0.01), those that
        may leave, within the budget and the target's KV capacity."""
        if residency.min_sessions > self.config.min_sessions:
            raise ValueError(
                f"residency asks for {residency.min_sessions} sessions; this tracker counts "
                f"at most {self.config.min_sessions}"
            )
        n = top_n(n_or_fraction, self.shared_prefixes(region))
        st = self._regions.get(region)
        if st is None or n == 0:
            return Selection()
        candidates: list[Candidate] = []
        for key, est, _, _ in self.ranked(region)[:n]:
            e = st.entries.get(key)
            candidates.append(
                Candidate(
                    key=key,
                    count=est,
                    sessions=0 if e is None else len(e.sessions),
                    payload=None if e is None else e.payload,
                )
            )
        return select_prewarm(candidates, n, limits, residency)
