"""The leader half of the prefix pipeline: gateway exports merged into ``prefixes/<r>``,
fenced by leadership, bad exports skipped (MemoryStore, fake clock)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import pytest

from controlplane.cluster import Cluster
from controlplane.core.actions import NO_JOBS, JobKind, Jobs
from controlplane.core.decide import decide
from controlplane.core.publish import prefix_aggregation
from controlplane.election import NotLeader
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import ConfigError, PrefixesConfig, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.prefix.catalog import PrefixCatalog, PrefixWanted
from controlplane.kernel.prefix.identity import PromptRequest, levels
from controlplane.kernel.prefix.prewarm import Residency, may_leave
from controlplane.kernel.prefix.tracker import PrefixTracker, TrackerConfig, TrackerExport
from controlplane.kernel.snapshot_reader import read_snapshot
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import Compare
from controlplane.orchestrator import Orchestrator
from controlplane.prefix_aggregator import REWRITE_EVERY, PrefixAggregator, fit_catalog
from controlplane.prewarm import NoPrefixData

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


def test_the_tick_asks_for_an_aggregation_per_interval_and_never_two_at_once() -> None:
    every = CFG.aggregate_interval_s
    first = prefix_aggregation(100.0, CFG, NO_JOBS)  # a term's first tick
    assert first is not None and first.kind is JobKind.PREFIX_AGGREGATE
    assert prefix_aggregation(101.0, CFG, Jobs(running=frozenset({first.id}))) is None
    ended = Jobs(aggregated_at=105.0)
    assert prefix_aggregation(105.0 + every - 0.01, CFG, ended) is None
    again = prefix_aggregation(105.0 + every, CFG, ended)
    assert again is not None and again.id != first.id


async def test_the_leaders_cycle_runs_the_aggregation_as_a_job_and_forgets_on_leadership_loss() -> (
    None
):
    """decide asks for it, the orchestrator's executor runs it, its end is an input of
    the next tick: one catalog write per interval, and none after the lease is lost."""
    store = await leading_store()
    await store.put(KEYS.prefix_export("gw-a"), gateway(["a1", "a2", "a3"]))
    topo = parse_topology(
        {
            "cluster": "t",
            "regions": [{"name": "east", "zone": "us", "agent": "h:1", "capacity_rps": 1}],
            "prefixes": CFG.model_dump(),
        }
    )
    clock = FakeClock(1000.0)
    agg = PrefixAggregator(store, KEYS, topo.prefixes, clock, fence, regions=topo.names)
    orch = Orchestrator(
        Cluster(store, KEYS, topo, clock), fence, NoPrefixData(), "cp-a", catalogs=agg
    )

    async def tick(advance: float) -> None:
        clock.advance(advance)
        snap = await read_snapshot(store, KEYS, topo, clock.now())
        await orch.apply(decide(snap, topo, "cp-a", orch.jobs()))
        for _ in range(20):  # the job's own turns of the loop
            await asyncio.sleep(0)

    await tick(0.0)
    first = await store.get(KEYS.prefixes("east"))
    assert first is not None and orch.jobs().aggregated_at == 1000.0
    await store.put(KEYS.prefix_export("gw-b"), gateway(["b1", "b2", "b3"]))
    await tick(CFG.aggregate_interval_s / 2)  # not due: nothing merged
    assert (await store.get(KEYS.prefixes("east"))) == first
    await tick(CFG.aggregate_interval_s / 2)
    second = await store.get(KEYS.prefixes("east"))
    assert second is not None and second.mod_revision > first.mod_revision
    assert decode(PrefixCatalog, second.value).gateways == 2
    await orch.stop_failovers()  # leadership lost: the next term aggregates at once
    assert orch.jobs().aggregated_at is None and not agg._last


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
