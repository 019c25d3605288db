"""The leader half of the prefix pipeline: gateway exports merged into ``prefixes/<r>``,
fenced by leadership, bad exports skipped (MemoryStore, fake clock)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import pytest

from controlplane.election import NotLeader
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import ConfigError, PrefixesConfig, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.prefix_catalog import PrefixCatalog, PrefixWanted
from controlplane.kernel.prefix_tracker import PrefixTracker, TrackerConfig, TrackerExport
from controlplane.kernel.prefixes import PromptRequest, Residency, levels, may_leave
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import Compare
from controlplane.prefix_aggregator import REWRITE_EVERY, PrefixAggregator, fit_catalog

CFG = PrefixesConfig(block_size=16, level_tokens=16, min_sessions=3, max_entries=64)
KEYS = Keys("t")
ME = b"cp-a"
SHARED = "You are a helpful assistant for the ACME support desk. " * 6  # 330 chars
US = Residency(min_sessions=3, source_zone="us", target_zone="us")


def gateway(sessions: Sequence[str], prompt: str = SHARED, region: str = "east") -> bytes:
    """One gateway's export: each session sends ``prompt`` twice (sessions count from
    a key's second sighting on)."""
    t = PrefixTracker(
        TrackerConfig(params=CFG.params, min_sessions=CFG.min_sessions, doorkeeper_lg_bits=10)
    )
    for s in sessions:
        for _ in range(2):
            t.observe_request(region, s, PromptRequest("tiny", prompt=prompt))
    return t.export()


def deepest(prompt: str) -> str:
    """The key of the prompt's deepest full level, as gateways count it."""
    return levels(PromptRequest("tiny", prompt=prompt), CFG.params)[-1].key


async def leading_store() -> MemoryStore:
    store = MemoryStore()
    await store.put(KEYS.leader(), ME)
    return store


def fence() -> list[Compare]:
    return [Compare.value_is(KEYS.leader(), ME)]


def not_leader() -> list[Compare]:
    raise NotLeader("cp-a is not the leader")


def aggregator(
    store: MemoryStore,
    config: PrefixesConfig = CFG,
    *,
    fence: Callable[[], list[Compare]] = fence,
    regions: Sequence[str] | None = None,
) -> tuple[PrefixAggregator, FakeClock]:
    clock = FakeClock()
    return PrefixAggregator(store, KEYS, config, clock, fence, regions=regions), clock


async def stored(store: MemoryStore, region: str) -> PrefixCatalog | None:
    kv = await store.get(KEYS.prefixes(region))
    return None if kv is None else decode(PrefixCatalog, kv.value, kv.key)


async def test_two_gateways_merge_counts_add_and_sessions_union_capped_at_k() -> None:
    store = await leading_store()
    await store.put(KEYS.prefix_export("gw-a"), gateway(["a1", "a2"]))
    await store.put(KEYS.prefix_export("gw-b"), gateway(["b1", "b2"]))
    agg, clock = aggregator(store)
    written = await agg.run_once()
    assert set(written) == {"east"}
    catalog = await stored(store, "east")
    assert catalog == written["east"]
    assert catalog.at == clock.now() and catalog.gateways == 2 and catalog.min_sessions == 3
    assert catalog.params == CFG.params
    entry = {e.key: e for e in catalog.entries}[deepest(SHARED)]
    assert entry.count == 8  # 4 sightings on each gateway
    # 2 sessions on A and 2 others on B: neither could export it alone, merged it may
    # leave its region. Its payload stays on the gateways (each saw fewer than K).
    assert entry.sessions == 3 and may_leave(entry.sessions, US) is None
    assert entry.payload is None
    assert catalog.shared_prefixes >= 1


async def test_a_prefix_reaching_k_only_when_merged_is_wanted_and_then_exported() -> None:
    store = await leading_store()
    trackers = {}
    for gw, sessions in (("gw-a", ["a1", "a2"]), ("gw-b", ["b1", "b2"])):
        t = PrefixTracker(
            TrackerConfig(params=CFG.params, min_sessions=CFG.min_sessions, doorkeeper_lg_bits=10)
        )
        for s in sessions:
            for _ in range(2):
                t.observe_request("east", s, PromptRequest("tiny", prompt=SHARED))
        trackers[gw] = t
        await store.put(KEYS.prefix_export(gw), t.export())
    agg, _ = aggregator(store)
    await agg.run_once()
    kv = await store.get(KEYS.prefix_wanted("east"))
    assert kv is not None
    wanted = decode(PrefixWanted, kv.value, kv.key)
    assert deepest(SHARED) in wanted.keys
    # A gateway's next export carries the payloads the leader asked for, and only those.
    blob = trackers["gw-a"].export({"east": wanted.keys})
    exported = TrackerExport.model_validate_json(blob)
    with_payload = {e.key for r in exported.regions for e in r.entries if e.payload}
    assert with_payload == set(wanted.keys) & {e.key for e in exported.regions[0].entries}
    await store.put(KEYS.prefix_export("gw-a"), blob)
    await agg.run_once()
    entry = {e.key: e for e in (await stored(store, "east")).entries}[deepest(SHARED)]
    assert entry.payload is not None and SHARED.startswith(entry.payload.prompt or "-")
    kv = await store.get(KEYS.prefix_wanted("east"))
    assert kv is not None and deepest(SHARED) not in decode(PrefixWanted, kv.value).keys


async def test_a_payload_travels_once_one_gateway_saw_k_sessions() -> None:
    store = await leading_store()
    await store.put(KEYS.prefix_export("gw-a"), gateway(["a1", "a2", "a3"]))
    await store.put(KEYS.prefix_export("gw-b"), gateway(["b1"]))
    solo = "A private note that only one user ever sends, kept at home. " * 5
    await store.put(KEYS.prefix_export("gw-c"), gateway(["c1"], prompt=solo))
    agg, _ = aggregator(store)
    catalog = (await agg.run_once())["east"]
    by_key = {e.key: e for e in catalog.entries}
    shared = by_key[deepest(SHARED)]
    assert shared.sessions == 3 and shared.count == 8 and shared.payload is not None
    replay = shared.payload.request_body().decode()
    assert replay.startswith('{"model":"tiny","prompt":"You are a helpful assistant')
    private = by_key[deepest(solo)]
    assert private.sessions == 1 and private.payload is None
    ranked = [e.count for e in catalog.entries]
    assert ranked == sorted(ranked, reverse=True)


async def test_malformed_and_mismatched_exports_are_skipped_once_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = await leading_store()
    await store.put(KEYS.prefix_export("gw-a"), gateway(["a1", "a2"]))
    await store.put(KEYS.prefix_export("gw-bad"), b"{not json")
    other = PrefixesConfig(block_size=32, level_tokens=32, min_sessions=3)
    t = PrefixTracker(TrackerConfig(params=other.params, doorkeeper_lg_bits=10))
    t.observe_request("east", "x", PromptRequest("tiny", prompt=SHARED))
    await store.put(KEYS.prefix_export("gw-other"), t.export())
    await store.put(KEYS.prefix_export("gw-b"), gateway(["b1", "b2"]))
    agg, _ = aggregator(store)
    with caplog.at_level(logging.WARNING, "tectonic.prefixes"):
        catalog = (await agg.run_once())["east"]
        await agg.run_once()
    assert catalog.gateways == 2
    assert {e.key: e for e in catalog.entries}[deepest(SHARED)].count == 8
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2  # once each, not every round
    assert any("gw-bad" in m for m in skipped) and any("gw-other" in m for m in skipped)


async def test_not_leading_nothing_is_read_or_written() -> None:
    store = await leading_store()
    await store.put(KEYS.prefix_export("gw-a"), gateway(["a1", "a2", "a3"]))
    agg, _ = aggregator(store, fence=not_leader)
    assert await agg.run_once() == {}
    assert await stored(store, "east") is None
    # Deposed in etcd while still believing it leads: the fenced txn writes nothing.
    await store.put(KEYS.leader(), b"cp-b")
    agg, _ = aggregator(store)
    assert await agg.run_once() == {}
    assert await stored(store, "east") is None


async def test_a_region_nobody_reports_keeps_its_last_catalog() -> None:
    store = await leading_store()
    await store.put(KEYS.prefix_export("gw-a"), gateway(["a1", "a2", "a3"], region="west"))
    agg, clock = aggregator(store)
    first = (await agg.run_once())["west"]
    await store.delete(KEYS.prefix_export("gw-a"))  # its lease ran out
    clock.advance(10)
    assert await agg.run_once() == {}
    assert await stored(store, "west") == first


async def test_an_unchanged_catalog_is_rewritten_only_now_and_then() -> None:
    store = await leading_store()
    await store.put(KEYS.prefix_export("gw-a"), gateway(["a1", "a2", "a3"]))
    agg, clock = aggregator(store)
    assert "east" in await agg.run_once()
    rounds = 0
    while True:
        clock.advance(10)
        rounds += 1
        if "east" in await agg.run_once():
            break
    assert rounds == REWRITE_EVERY
    assert (await stored(store, "east")).at == clock.now()  # type: ignore[union-attr]
    await store.put(KEYS.prefix_export("gw-b"), gateway(["b1"]))
    assert "east" in await agg.run_once()  # changed: written at once


async def test_regions_outside_the_topology_get_no_catalog() -> None:
    store = await leading_store()
    await store.put(KEYS.prefix_export("gw-a"), gateway(["a1", "a2"], region="mars"))
    agg, _ = aggregator(store, regions=("east", "west"))
    assert await agg.run_once() == {}
    assert await stored(store, "mars") is None


async def test_catalogs_are_cut_to_size_lowest_ranked_first() -> None:
    store = await leading_store()
    for g in range(3):
        exported = [
            gateway([f"g{g}-{i}-{s}" for s in range(3)], prompt=f"{i}: " + SHARED) for i in range(8)
        ]
        for i, blob in enumerate(exported):
            await store.put(KEYS.prefix_export(f"gw-{g}-{i}"), blob)
    agg, _ = aggregator(store)
    full = (await agg.run_once())["east"]
    size = len(encode(full))
    with_payload = sum(e.payload is not None for e in full.entries)
    assert with_payload > 4
    cut, payloads, dropped = fit_catalog(full, size - 2000)
    assert len(encode(cut)) <= size - 2000 and payloads > 0 and dropped == 0
    kept = [i for i, e in enumerate(cut.entries) if e.payload is not None]
    lost = [i for i, e in enumerate(cut.entries) if e.payload is None and full.entries[i].payload]
    assert max(kept) < min(lost)  # the most frequent keep theirs
    tiny, _, dropped = fit_catalog(full, 600)
    assert dropped > 0 and len(encode(tiny)) <= 600
    assert [e.key for e in tiny.entries] == [e.key for e in full.entries[: len(tiny.entries)]]
    assert fit_catalog(full, size) == (full, 0, 0)


async def test_run_aggregates_only_while_leading() -> None:
    store = await leading_store()
    await store.put(KEYS.prefix_export("gw-a"), gateway(["a1", "a2", "a3"]))
    leading = False
    agg, _ = aggregator(store, PrefixesConfig(**{**CFG.model_dump(), "aggregate_interval_s": 0.01}))
    task = asyncio.create_task(agg.run(lambda: leading))
    await asyncio.sleep(0.05)
    assert await stored(store, "east") is None
    leading = True
    for _ in range(100):
        if await stored(store, "east") is not None:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await stored(store, "east") is not None


def test_the_prefixes_section_is_validated_with_named_fields() -> None:
    base = {"regions": [{"name": "e", "zone": "us", "agent": "h:1", "capacity_rps": 1}]}
    topo = parse_topology(base)
    assert topo.prefixes == PrefixesConfig() and topo.prefixes.params.block_size == 16
    with pytest.raises(ConfigError, match=r"level_tokens \(100\) must be a multiple"):
        parse_topology({**base, "prefixes": {"block_size": 128, "level_tokens": 100}})
    with pytest.raises(ConfigError, match=r"prefixes\.min_sessions"):
        parse_topology({**base, "prefixes": {"min_sessions": 0}})
    with pytest.raises(ConfigError, match=r"prefixes\.export_max_bytes"):
        parse_topology({**base, "prefixes": {"export_max_bytes": 2_000_000}})
    with pytest.raises(ConfigError, match=r"prefixes\.colour"):
        parse_topology({**base, "prefixes": {"colour": 1}})
