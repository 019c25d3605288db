"""A manual failover (a drain) warms first, then switches: the target's replicas hold
the source's top prefixes before any of its traffic arrives (simulator replicas,
real etcd, the control plane's gRPC API)."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, until
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import FailoverStep
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.prewarm_harness import (
    first_hits,
    hits_across,
    send,
    tokens,
    two_regions,
    wait_catalog,
    wait_prewarmed,
    wired_regions,
)

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

BLOCK = 16
K = 3
SYSTEM = "Manual drain policy. " + " ".join(f"step-{j} is logged" for j in range(80))


@pytest.fixture
def sims() -> Iterator[dict[str, list[Proc]]]:
    with two_regions(BLOCK) as regions:
        yield regions


async def test_a_manual_failover_prewarms_before_the_switch(
    sims: dict[str, list[Proc]],
    etcd: EtcdServer,
    etcd_store: EtcdStore,
    cluster_name: str,
    keys: Keys,
) -> None:
    urls = {r: [p.url for p in ps] for r, ps in sims.items()}
    async with aiohttp.ClientSession() as http:
        cpt = len(SYSTEM) / await tokens(http, urls["a"][0], SYSTEM)
        prefixes: dict[str, object] = {
            "block_size": BLOCK,
            "chars_per_token": cpt,
            "level_tokens": 4 * BLOCK,
            "min_sessions": K,
        }
        async with wired_regions(
            etcd, cluster_name, urls, prefixes=prefixes, prewarm={"budget_s": 30, "verify": 2}
        ) as w:
            for s in range(K + 1):
                assert await send(http, w.gateway, f"s{s}", f"{SYSTEM}\nQ{s}?") == "a"
            await wait_catalog(etcd_store, keys, "a", payloads=1)
            b_hits = await hits_across(http, urls["b"])

            resp = await w.control_plane.stub.RequestFailover(
                pb.FailoverRequest(region="a", to=["b"], reason="test: kernel patch", actor="t")
            )
            assert resp.accepted, resp
            record = await wait_prewarmed(etcd_store, keys, "a")
            assert record.failover is not None and record.failover.plan.warm_first
            # warmed first: the switch is not done (or done after the pre-warm)
            assert record.failover.done[0] is FailoverStep.PREWARM
            assert record.failover.prewarm_result.attained_fraction == 1.0
            assert await hits_across(http, urls["b"]) > b_hits  # the verification's hits

            async def switched() -> bool:
                st = await w.control_plane.stub.GetStatus(pb.GetStatusRequest())
                return any(r.name == "a" and "b" in r.routing for r in st.regions)

            await until(switched, within=20, every=0.2, what="a's traffic switched to b")
            region, hits = await first_hits(
                http, w.gateway, "new", f"{SYSTEM}\nA first question?", urls["b"]
            )
            assert region == "b"
            catalog = await wait_catalog(etcd_store, keys, "a", payloads=1)
            deepest = max((e.payload for e in catalog.entries if e.payload), key=lambda p: p.blocks)
            warm = await tokens(http, urls["b"][0], deepest.prompt or "")
            assert hits >= warm - BLOCK
