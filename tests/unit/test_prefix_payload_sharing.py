"""One replay payload per prefix chain (issue 27): in a gateway's export and in the
leader's catalog, the levels of one prompt share the payload of the deepest one written,
and each is rebuilt on read exactly as it was; an export equal to the last one written
is not written again; payloads an export's size cut drops are counted."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import PrefixesConfig
from controlplane.kernel.keys import Keys
from controlplane.kernel.prefix.catalog import CatalogEntry, PrefixCatalog, catalog_selection
from controlplane.kernel.prefix.identity import FingerprintParams, Level, PromptRequest, levels
from controlplane.kernel.prefix.prewarm import (
    PrewarmLimits,
    ReplayPayload,
    Residency,
    cut_payload,
    replay_payload,
    shared_payloads,
)
from controlplane.kernel.prefix.tracker import PrefixTracker, TrackerConfig, TrackerExport
from controlplane.kernel.store.memory import ManualClock, MemoryStore
from controlplane.kernel.store.port import Compare
from controlplane.prefix_aggregator import PrefixAggregator, fit_catalog
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.prefix_export import ExportOptions, PrefixExporter, fit_export

# A level every 32 tokens = 128 characters: the lab's 5.5 KB template at 43 levels.
CFG = PrefixesConfig(block_size=16, level_tokens=32, min_sessions=3)
PARAMS = CFG.params
KEYS = Keys("t")
LOG = "tectonic.gateway.prefixes"
US = Residency(min_sessions=3, source_zone="us", target_zone="us")
DROPPED = "tectonic_gateway_prefix_payloads_dropped_total"


def words(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(chars))[:chars]


TEMPLATE = words(43 * 128, seed=1)  # 5,504 characters: 43 levels
IDS = [random.Random(2).randrange(50_000) for _ in range(43 * 32)]  # 43 levels of tokens
CHAT = (("system", TEMPLATE[:2000]), ("user", TEMPLATE[2000:3900]), ("assistant", TEMPLATE[3900:]))


def request(kind: str, session: int, turn: int) -> PromptRequest:
    """A session's request: the shared template, then its own question."""
    ask = f" question {session}-{turn}: " + words(300, seed=100 * session + turn)
    if kind == "tokens":
        return PromptRequest("tiny", token_ids=[*IDS, *range(session * 1000, session * 1000 + 90)])
    if kind == "chat":
        return PromptRequest("tiny", messages=[*CHAT, ("user", ask)], cache_salt="tenant-7")
    return PromptRequest("tiny", prompt=TEMPLATE + ask, lora="sql", cache_salt="tenant-7")


def shared(kind: str) -> PromptRequest:
    """What all sessions share (its levels are the shared chain)."""
    if kind == "tokens":
        return PromptRequest("tiny", token_ids=IDS)
    if kind == "chat":
        return PromptRequest("tiny", messages=CHAT, cache_salt="tenant-7")
    return PromptRequest("tiny", prompt=TEMPLATE, lora="sql", cache_salt="tenant-7")


def tracked(kind: str = "text", sessions: int = 4) -> PrefixTracker:
    t = PrefixTracker(TrackerConfig(params=PARAMS, min_sessions=3, doorkeeper_lg_bits=10))
    for s in range(sessions):
        for turn in range(2):
            t.observe_request("east", f"s{s}", request(kind, s, turn))
    return t


def payload_bytes(blob: bytes) -> int:
    """Bytes the payloads take in a stored export or catalog (as JSON writes them)."""
    raw = json.loads(blob)
    bare = json.loads(blob)
    for entries in _entry_lists(bare):
        for e in entries:
            e["payload"] = None
    return len(_dumps(raw)) - len(_dumps(bare))


def _entry_lists(raw: dict[str, Any]) -> list[list[dict[str, Any]]]:
    if "regions" in raw:
        return [r["entries"] for r in raw["regions"]]
    return [raw["entries"]]


def _dumps(raw: object) -> bytes:
    return json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode()


async def leader_catalog(*blobs: bytes) -> tuple[PrefixCatalog, bytes]:
    """The catalog the leader merges from ``blobs``: in memory, and as stored."""
    store = MemoryStore()
    await store.put(KEYS.leader(), b"cp-a")

    def fence() -> list[Compare]:
        return [Compare.value_is(KEYS.leader(), b"cp-a")]

    agg = PrefixAggregator(store, KEYS, CFG, FakeClock(), fence)
    for i, blob in enumerate(blobs):
        await store.put(KEYS.prefix_export(f"gw-{i}"), blob)
    catalog = (await agg.run_once())["east"]
    kv = await store.get(KEYS.prefixes("east"))
    assert kv is not None
    return catalog, kv.value


def read_payloads(blob: bytes) -> dict[str, ReplayPayload]:
    export = decode(TrackerExport, blob)
    return {e.key: e.payload for r in export.regions for e in r.entries if e.payload}


# ---- the size ------------------------------------------------------------------------


async def test_a_template_counted_at_43_levels_is_stored_about_once() -> None:
    t = tracked()
    chain = levels(shared("text"), PARAMS)
    assert len(chain) == 43
    blob = t.export()
    payloads = read_payloads(blob)
    assert all(lv.key in payloads for lv in chain)  # every level has its payload, read
    per_level = sum(len(payloads[lv.key].model_dump_json()) for lv in chain)
    assert per_level > 120_000  # what the levels took stored one by one
    assert payload_bytes(blob) < 2 * len(TEMPLATE)
    assert len(blob) < 3 * len(TEMPLATE)  # sketches, keys and session hashes included

    catalog, stored = await leader_catalog(blob)
    assert payload_bytes(stored) < 2 * len(TEMPLATE)
    read = decode(PrefixCatalog, stored)
    assert read == catalog  # every entry as the leader had it
    assert all(e.payload is not None for e in read.entries if e.key in {lv.key for lv in chain})


def test_the_size_cut_measures_the_shared_payloads() -> None:
    t = tracked()
    blob = t.export()
    assert fit_export(blob, len(blob), t.estimate) == (blob, None)
    per_level = len(_dumps(_all_whole(blob)))
    assert per_level > 5 * len(blob)  # the old measure would have cut it to pieces


def _all_whole(blob: bytes) -> dict[str, Any]:
    """The export as an older gateway wrote it: every level's payload whole."""
    raw = json.loads(blob)
    payloads = read_payloads(blob)
    for entries in _entry_lists(raw):
        for e in entries:
            if e["payload"] is None and e["key"] in payloads:
                e["payload"] = json.loads(payloads[e["key"]].model_dump_json())
    return raw


# ---- the same prefix, byte for byte ------------------------------------------------------


@pytest.mark.parametrize("kind", ["text", "tokens", "chat"])
async def test_a_level_replayed_from_the_shared_payload_is_the_payload_it_had(kind: str) -> None:
    t = tracked(kind)
    chain = levels(shared(kind), PARAMS)
    one = request(kind, 0, 0)
    ids = one.token_ids
    own = {
        lv.key: replay_payload(one, lv, PARAMS, ids, [a.key for a in chain[:i]])
        for i, lv in enumerate(chain)
    }  # each level's payload as the tracker made it, one by one
    blob = t.export()
    written = {e["key"]: e["payload"] for es in _entry_lists(json.loads(blob)) for e in es}
    assert [lv.key for lv in chain if written[lv.key]] == [chain[-1].key]  # stored once
    payloads = read_payloads(blob)
    for lv in chain:
        entry = t.entry("east", lv.key)
        assert entry is not None and entry[0] == own[lv.key]
        assert payloads[lv.key] == own[lv.key]
        assert payloads[lv.key].request_body() == own[lv.key].request_body()

    # The leader's catalog as stored and read, and what a failover replays from it: a
    # budget for 20 levels replays the 20th, with the very body it had.
    catalog, stored = await leader_catalog(blob)
    read = decode(PrefixCatalog, stored)
    assert {e.key: e.payload for e in read.entries if e.key in own} == own
    limits = PrewarmLimits(
        budget_s=1.0, prefill_tokens_per_s=20 * 32, kv_capacity_blocks=10**6, block_size=16
    )
    sel = catalog_selection(read, limits, US, len(read.entries))
    assert [p.key for p in sel.replay] == [chain[19].key]
    assert [p.request_body(1) for p in sel.replay] == [own[chain[19].key].request_body(1)]
    assert sel == catalog_selection(catalog, limits, US, len(catalog.entries))


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["system", "user", "assistant"]),
            st.text(alphabet="ab\n|<>", max_size=40),
        ),
        min_size=1,
        max_size=6,
    )
)
@settings(max_examples=200, deadline=None)
def test_a_chat_cut_shorter_is_the_chat_cut_there(messages: list[tuple[str, str]]) -> None:
    params = FingerprintParams(block_size=1, chars_per_token=3.0, level_tokens=1)
    req = PromptRequest("tiny", messages=messages)
    chain = levels(req, params)
    if not chain:
        return
    keys = [lv.key for lv in chain]
    deepest = replay_payload(req, chain[-1], params, ancestors=keys[:-1])
    for i, lv in enumerate(chain[:-1]):
        assert cut_payload(deepest, i, params) == replay_payload(
            req, lv, params, ancestors=keys[:i]
        )


def test_a_payload_a_deeper_one_does_not_rebuild_exactly_is_written_whole() -> None:
    chain = levels(shared("text"), PARAMS)
    keys = [lv.key for lv in chain]
    deep = replay_payload(shared("text"), chain[9], PARAMS, ancestors=keys[:9])
    mine = replay_payload(shared("text"), chain[4], PARAMS, ancestors=keys[:4])
    other = PromptRequest("tiny", prompt="x" * 5000, lora="sql", cache_salt="tenant-7")
    forged = replay_payload(other, Level(keys[4], chain[4].blocks, 0), PARAMS, ancestors=keys[:4])
    assert shared_payloads([deep, mine], PARAMS) == [False, True]
    assert shared_payloads([deep, forged], PARAMS) == [False, False]
    for shallow in (mine, forged):
        entries = (entry(deep, 3), entry(shallow, 3))
        assert decode(PrefixCatalog, encode(catalog_of(*entries))).entries == entries


def entry(p: ReplayPayload | None, sessions: int, key: str = "") -> CatalogEntry:
    return CatalogEntry(key=key or (p.key if p else ""), count=5, sessions=sessions, payload=p)


def catalog_of(*entries: CatalogEntry) -> PrefixCatalog:
    return PrefixCatalog(
        region="east", at=0.0, params=PARAMS, min_sessions=3, shared_prefixes=1, entries=entries
    )


def test_a_catalog_rebuilds_payloads_only_of_prefixes_seen_from_k_sessions() -> None:
    chain = levels(shared("text"), PARAMS)
    keys = [lv.key for lv in chain]
    deep = replay_payload(shared("text"), chain[9], PARAMS, ancestors=keys[:9])
    few = decode(PrefixCatalog, encode(catalog_of(entry(deep, 3), entry(None, 2, keys[4]))))
    assert few.entries[1].payload is None  # residency: fewer than K sessions
    enough = decode(PrefixCatalog, encode(catalog_of(entry(deep, 3), entry(None, 3, keys[4]))))
    assert enough.entries[1].payload == cut_payload(deep, 4, PARAMS)


# ---- a rolling upgrade ----------------------------------------------------------------


async def test_older_and_newer_readers_and_writers_understand_each_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    blob = tracked().export()
    chain = levels(shared("text"), PARAMS)
    full = read_payloads(blob)

    # An older leader reads the same JSON without rebuilding (no field was added): valid,
    # with the payloads written whole; it misses those of the shallower levels.
    older = TrackerExport.model_validate(json.loads(blob))
    kept = {e.key: e.payload for r in older.regions for e in r.entries if e.payload}
    assert kept == {chain[-1].key: full[chain[-1].key]}
    catalog, stored = await leader_catalog(blob)
    older_catalog = PrefixCatalog.model_validate(json.loads(stored))
    assert [e.key for e in older_catalog.entries if e.payload] == [chain[-1].key]

    # An older gateway's export (every payload whole) reads the same, merges the same.
    old_blob = _dumps(_all_whole(blob))
    assert decode(TrackerExport, old_blob) == decode(TrackerExport, blob)
    assert (await leader_catalog(old_blob))[0].entries == catalog.entries

    # A newer gateway's fields are dropped on read, the export merged, not skipped.
    newer = json.loads(blob)
    newer["compression"] = "none"
    newer["regions"][0]["entries"][0]["weight"] = 2
    with caplog.at_level(logging.WARNING, "tectonic.prefixes"):
        assert (await leader_catalog(_dumps(newer)))[0].entries == catalog.entries
    assert "skipped" not in caplog.text


# ---- the exporter: written when changed, cuts counted -----------------------------------


class CountingStore(MemoryStore):
    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(clock=clock)
        self.puts: list[str] = []

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        self.puts.append(key)
        return await super().put(key, value, lease=lease)


async def test_the_same_export_written_twice_is_put_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    store = CountingStore(clock)
    t = tracked()
    opts = ExportOptions(interval_s=1.0)
    ex = PrefixExporter(store, KEYS, t, opts, gateway_id="g1", clock=clock)
    with caplog.at_level(logging.DEBUG, LOG):
        for _ in range(10):  # over three lease lengths
            await ex.export_once()
            clock.advance(1)
    assert store.puts == [KEYS.prefix_export("g1")] and ex.exports == 1
    assert await store.get(KEYS.prefix_export("g1")) is not None  # the lease kept alive
    assert "unchanged" in caplog.text
    t.observe_request("east", "s9", request("text", 9, 0))
    assert await ex.export_once()  # changed: written
    assert len(store.puts) == 2


async def test_payloads_a_size_cut_drops_are_counted() -> None:
    t = tracked(sessions=4)
    for topic in range(6):  # more chains, each from K sessions, ranked below the template
        for s in range(3):
            for _ in range(2):
                t.observe_request("east", f"t{topic}-{s}", PromptRequest("tiny", words(700, topic)))
    blob = t.export()
    metrics = DataPlaneMetrics()
    store = MemoryStore()
    ex = PrefixExporter(
        store,
        KEYS,
        t,
        ExportOptions(max_bytes=len(blob) - 2000),
        gateway_id="g1",
        payloads_dropped=metrics.prefix_payloads_dropped,
    )
    assert metrics.registry.get_sample_value(DROPPED) == 0.0  # exposed from the start
    assert await ex.export_once()
    kv = await store.get(KEYS.prefix_export("g1"))
    assert kv is not None and len(kv.value) <= len(blob) - 2000
    lost = len(read_payloads(blob)) - len(read_payloads(kv.value))
    assert lost > 0 and metrics.registry.get_sample_value(DROPPED) == lost
    assert DROPPED in metrics.render().decode()
    assert not await ex.export_once()  # the same export: not written, not counted again
    assert metrics.registry.get_sample_value(DROPPED) == lost


def test_a_cut_takes_the_deepest_levels_text_first() -> None:
    t = tracked()
    chain = levels(shared("text"), PARAMS)
    blob = t.export()
    out, cut = fit_export(blob, len(blob) - 1000, t.estimate)
    assert out is not None and cut is not None and cut.entries == 0
    left = read_payloads(out)
    kept = [lv.key in left for lv in chain]
    # Equally frequent: the deepest go, each freeing only its own 128 characters.
    assert kept == [True] * (43 - cut.payloads) + [False] * cut.payloads
    assert 0 < cut.payloads < 12


def test_a_catalog_cut_measures_the_shared_payloads() -> None:
    chain = levels(shared("text"), PARAMS)
    keys = [lv.key for lv in chain]
    entries = tuple(
        entry(replay_payload(shared("text"), lv, PARAMS, ancestors=keys[:i]), 3)
        for i, lv in enumerate(chain)
    )
    catalog = catalog_of(*entries)
    size = len(encode(catalog))
    assert size < 3 * len(TEMPLATE)
    assert fit_catalog(catalog, size) == (catalog, 0, 0)


# ---- the leader: prefix-wanted written when it changed -----------------------------------


async def test_the_wanted_list_is_written_only_when_it_changed() -> None:
    store = MemoryStore()
    await store.put(KEYS.leader(), b"cp-a")

    def fence() -> list[Compare]:
        return [Compare.value_is(KEYS.leader(), b"cp-a")]

    clock = FakeClock()
    agg = PrefixAggregator(store, KEYS, CFG, clock, fence)
    await store.put(KEYS.prefix_export("gw-a"), tracked().export())
    assert "east" in await agg.run_once()
    wanted = await store.get(KEYS.prefix_wanted("east"))
    assert wanted is not None
    extra = PrefixTracker(TrackerConfig(params=PARAMS, min_sessions=3, doorkeeper_lg_bits=10))
    for _ in range(2):
        extra.observe_request("east", "x", PromptRequest("tiny", prompt=words(900, 5)))
    await store.put(KEYS.prefix_export("gw-b"), extra.export())
    clock.advance(10)
    assert "east" in await agg.run_once()  # the catalog changed, the wanted list did not
    again = await store.get(KEYS.prefix_wanted("east"))
    assert again is not None and again.mod_revision == wanted.mod_revision
    agg.forget()  # a new term writes it afresh
    assert "east" in await agg.run_once()
    fresh = await store.get(KEYS.prefix_wanted("east"))
    assert fresh is not None and fresh.mod_revision > wanted.mod_revision
