"""A region's catalog keeps its payloads while a gateway's export no longer carries them
(its size limit cut them, e.g. while the region is failed over and its traffic is
counted under the targets): what the recovery pre-warm replays survives the failover."""

from __future__ import annotations

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import PrefixesConfig
from controlplane.kernel.keys import Keys
from controlplane.kernel.prefix.catalog import CatalogEntry, PrefixCatalog
from controlplane.kernel.prefix.identity import PromptRequest
from controlplane.kernel.prefix.tracker import PrefixTracker, TrackerConfig, TrackerExport
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import Compare
from controlplane.prefix_aggregator import PrefixAggregator, carry_payloads

CFG = PrefixesConfig(block_size=16, level_tokens=16, min_sessions=3, max_entries=64)
KEYS = Keys("t")
PROMPT = "Returning region, its own hot system prompt. " * 6


def export(sessions: int, *, payloads: bool = True, region: str = "east") -> bytes:
    t = PrefixTracker(
        TrackerConfig(params=CFG.params, min_sessions=CFG.min_sessions, doorkeeper_lg_bits=10)
    )
    for s in range(sessions):
        for _ in range(2):
            t.observe_request(region, f"s{s}", PromptRequest("tiny", prompt=PROMPT))
    blob = TrackerExport.model_validate_json(t.export())
    if payloads:
        return blob.model_dump_json().encode()
    cut = tuple(
        r.model_copy(
            update={"entries": tuple(e.model_copy(update={"payload": None}) for e in r.entries)}
        )
        for r in blob.regions
    )
    return blob.model_copy(update={"regions": cut}).model_dump_json().encode()


async def catalog(store: MemoryStore) -> PrefixCatalog:
    kv = await store.get(KEYS.prefixes("east"))
    assert kv is not None
    return decode(PrefixCatalog, kv.value, kv.key)


def payloads(c: PrefixCatalog) -> int:
    return sum(e.payload is not None for e in c.entries)


async def test_payloads_cut_from_the_export_stay_in_the_catalog() -> None:
    store = MemoryStore()
    await store.put(KEYS.leader(), b"cp-a")

    def fence() -> list[Compare]:
        return [Compare.value_is(KEYS.leader(), b"cp-a")]

    agg = PrefixAggregator(store, KEYS, CFG, FakeClock(), fence)
    await store.put(KEYS.prefix_export("gw"), export(4))
    await agg.run_once()
    before = await catalog(store)
    assert payloads(before) > 0
    await store.put(KEYS.prefix_export("gw"), export(4, payloads=False))
    await agg.run_once()
    assert payloads(await catalog(store)) == payloads(before)
    # a new leader (nothing remembered this term) carries them over from etcd too
    fresh = PrefixAggregator(store, KEYS, CFG, FakeClock(), fence)
    await store.put(KEYS.prefix_export("gw"), export(5, payloads=False))
    await fresh.run_once()
    assert payloads(await catalog(store)) == payloads(before)


def test_only_entries_still_seen_from_k_sessions_get_theirs_back() -> None:
    full = PrefixCatalog.model_validate_json(_catalog_json(4, payloads=True))
    few = PrefixCatalog.model_validate_json(_catalog_json(1, payloads=False))
    assert payloads(carry_payloads(few, full)) == 0  # fewer than K sessions: none
    other = full.model_copy(update={"params": CFG.params.model_copy(update={"block_size": 32})})
    cut = PrefixCatalog.model_validate_json(_catalog_json(4, payloads=False))
    assert payloads(carry_payloads(cut, other)) == 0  # counted another way: not the same keys
    assert payloads(carry_payloads(cut, full)) == payloads(full)
    assert carry_payloads(cut, None) == cut


def _catalog_json(sessions: int, *, payloads: bool) -> bytes:
    t = PrefixTracker(TrackerConfig(params=CFG.params, min_sessions=3, doorkeeper_lg_bits=10))
    t.merge(export(sessions, payloads=payloads))
    entries = []
    for key, estimate, _, _ in t.ranked("east"):
        payload, seen = t.entry("east", key) or (None, 0)
        entries.append(
            CatalogEntry(
                key=key, count=estimate, sessions=seen, payload=payload if seen >= 3 else None
            )
        )
    c = PrefixCatalog(
        region="east",
        at=0.0,
        params=CFG.params,
        min_sessions=3,
        shared_prefixes=1,
        entries=tuple(entries),
    )
    return encode(c)
