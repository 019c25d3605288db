"""Pre-warm at scale on the simulator: many replicas per region, many tenants.

Thirty tenants, each with its own long system prompt, talk to region ``a`` from K + 1
sessions each (sessions count from a prefix's second sighting); ``a``'s replicas are
killed; the leader pre-warms ``b``'s replicas with every shared prefix
(``top_fraction`` raised so that all of them are chosen).
Each tenant's first request in ``b`` goes where the gateway routes it and hits the
prefix cache there (vLLM's counter, summed over ``b``'s replicas, one request at a
time); the replays spread over ``b``'s replicas.
"""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.prewarm_harness import (
    first_hits,
    queries_of,
    send,
    tokens,
    wait_catalog,
    wait_prewarmed,
    wired_regions,
)

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

BLOCK = 16
REPLICAS = 6  # per region
TENANTS = 30
LEVEL = 4 * BLOCK  # the tracker counts a prompt every 64 tokens
K = 3


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, list[Proc]]]:
    procs = start_simulators(2 * REPLICAS, block_size=BLOCK)
    yield {"a": procs[:REPLICAS], "b": procs[REPLICAS:]}
    for p in procs:
        p.kill()


def system(t: int) -> str:
    return f"Tenant {t:02d} policy. " + " ".join(f"clause-{t}-{j} applies" for j in range(60))


async def test_every_tenant_finds_its_prefix_warm_on_the_replica_it_lands_on(
    sims: dict[str, list[Proc]],
    etcd: EtcdServer,
    etcd_store: EtcdStore,
    cluster_name: str,
    keys: Keys,
) -> None:
    urls = {r: [p.url for p in ps] for r, ps in sims.items()}
    async with aiohttp.ClientSession() as http:
        cpt = len(system(0)) / await tokens(http, urls["a"][0], system(0))
        prefixes: dict[str, object] = {
            "block_size": BLOCK,
            "chars_per_token": cpt,
            "level_tokens": LEVEL,
            "min_sessions": K,
            "max_entries": 1024,
        }
        prewarm: dict[str, object] = {"budget_s": 30, "verify": 8, "top_fraction": 0.99}
        async with wired_regions(etcd, cluster_name, urls, prefixes=prefixes, prewarm=prewarm) as w:
            for s in range(K + 1):  # a key's sessions count from its second sighting
                for t in range(TENANTS):
                    prompt = f"{system(t)}\nSession {s} asks: question {t}-{s}?"
                    assert await send(http, w.gateway, f"t{t}-s{s}", prompt) == "a"
            catalog = await wait_catalog(
                etcd_store, keys, "a", payloads=TENANTS, prompts=[system(t) for t in range(TENANTS)]
            )
            deepest = {  # per tenant, its deepest level: what the replay warms
                t: max(
                    (
                        e.payload
                        for e in catalog.entries
                        if e.payload and system(t).startswith(e.payload.prompt or "-")
                    ),
                    key=lambda p: p.blocks,
                )
                for t in range(TENANTS)
            }
            b_queries = await queries_of(http, urls["b"])

            for p in sims["a"]:
                p.kill()
            record = await wait_prewarmed(etcd_store, keys, "a")
            assert record.failover is not None
            result = record.failover.prewarm_result
            # one replay per tenant: a tenant's shallower levels are covered by its deepest
            assert result.prefixes_total == TENANTS, result
            assert result.attained_fraction == 1.0 and result.prefixes_failed == 0
            assert result.skipped["covered"] > 0
            assert result.replicas_active == REPLICAS
            assert result.verified == 8 and result.verified_hit_rate > 0.8
            spread = [
                q1 - q0 for q0, q1 in zip(b_queries, await queries_of(http, urls["b"]), strict=True)
            ]
            assert sum(1 for d in spread if d > 0) >= REPLICAS // 2, spread

            for t in range(TENANTS):
                prompt = f"{system(t)}\nA new user asks: anything new for {t}?"
                region, hits = await first_hits(http, w.gateway, f"new-{t}", prompt, urls["b"])
                assert region == "b"
                warm = await tokens(http, urls["b"][0], deepest[t].prompt or "")
                whole = await tokens(http, urls["b"][0], system(t))
                assert warm >= whole - LEVEL - BLOCK  # covered to its last counted level
                assert hits >= warm - BLOCK, (t, hits, warm)
