"""Pre-warm end to end with two regions each served by a REAL vLLM (CPU build).

Traffic from several sessions sharing a long system prompt goes through a gateway into
region ``a``; the gateway counts its prefixes and exports them, the leader merges them
into ``prefixes/a``. Then ``a``'s vLLM is SIGKILLed: its agent reports the region down,
the control plane fails ``a`` over to ``b`` (switch at once, the source is hard down)
and asks ``b``'s agent to pre-warm. The proof is vLLM's own counter on ``b``: the first
request for the top prefix raises ``vllm:prefix_cache_hits_total`` by at least the
replayed prefix's length minus one block; the same request after
``/reset_prefix_cache`` (no pre-warm) raises it by 0.

Uses the two vLLM servers the admission tests use too (``vllm_pair``,
tests/integration/conftest.py: started once, ~20-40 s each, in parallel; ~2.3 GB RSS
each), each with an empty prefix cache; ``a``, killed here, is started again for a test
that asks for it after this one.
"""

from __future__ import annotations

import aiohttp
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.vllm_cpu import VllmProc
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import RegionState
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.prewarm_harness import (
    first_hits,
    send,
    tokens,
    wait_catalog,
    wait_prewarmed,
    wired_regions,
)

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.realvllm]

BLOCK = 128  # vLLM's CPU build
SESSIONS = 4
K = 3
SYSTEM = " ".join(
    f"Rule {i}: the assistant of the Tectonic rocket shop answers order question {i} "
    "politely, briefly, and never invents a delivery date."
    for i in range(12)
)


async def test_failover_prewarms_the_target_and_vllm_counts_the_hits(
    vllm_pair: tuple[VllmProc, VllmProc],
    etcd: EtcdServer,
    etcd_store: EtcdStore,
    cluster_name: str,
    keys: Keys,
) -> None:
    vllm_a, vllm_b = vllm_pair
    async with aiohttp.ClientSession() as http:
        cpt = len(SYSTEM) / await tokens(http, vllm_a.url, SYSTEM)  # calibrate the proxy
        system_tokens = await tokens(http, vllm_b.url, SYSTEM)
        replicas = {"a": [vllm_a.url], "b": [vllm_b.url]}
        prefixes: dict[str, object] = {
            "block_size": BLOCK,
            "chars_per_token": cpt,
            "level_tokens": BLOCK,
            "min_sessions": K,
        }
        async with wired_regions(
            etcd, cluster_name, replicas, prefixes=prefixes, prewarm={"budget_s": 30, "verify": 1}
        ) as w:
            # 1. Traffic homed in a: sessions share SYSTEM, each with its own questions.
            for turn in range(2):
                for s in range(SESSIONS):
                    prompt = f"{SYSTEM}\nUser {s} asks question {turn}: where is my order?"
                    assert await send(http, w.gateway, f"user-{s}", prompt) == "a"
            catalog = await wait_catalog(etcd_store, keys, "a", payloads=1)
            payloads = [e.payload for e in catalog.entries if e.payload]
            assert all(SYSTEM.startswith(p.prompt or "-") for p in payloads)  # cut from SYSTEM

            # 2. a's vLLM dies; the control plane fails a over to b and pre-warms b.
            vllm_a.kill()
            record = await wait_prewarmed(etcd_store, keys, "a")
            assert record.state is RegionState.FAILING_OVER and record.failover is not None
            assert not record.failover.plan.warm_first  # hard down: switched first
            result = record.failover.prewarm_result
            assert result.prefixes_total >= 1 and result.attained_fraction == 1.0
            assert result.verified >= 1 and result.verified_hit_rate > 0.5
            # the replay (vLLM's usage) covered the shared prompt to its last counted level
            replayed = int(result.prompt_tokens)
            assert replayed >= system_tokens - 2 * BLOCK, (replayed, system_tokens)

            # 3. The first request for the top prefix in b: vLLM counts pre-warmed hits.
            prompt = f"{SYSTEM}\nUser 99 asks a first question: can I change my address?"
            region, hits = await first_hits(http, w.gateway, "newcomer", prompt, [vllm_b.url])
            assert region == "b" and hits >= replayed - BLOCK, (region, hits, replayed)

            # 4. Without pre-warm the same first request hits nothing.
            async with http.post(vllm_b.url + "/reset_prefix_cache") as r:
                assert r.status == 200
            region, hits = await first_hits(http, w.gateway, "newcomer-2", prompt, [vllm_b.url])
            assert region == "b" and hits == 0
