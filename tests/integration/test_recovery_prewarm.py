"""Recovery pre-warm: when a failed-over region comes back with cold caches, the leader
replays the region's own top prefixes on it (its agent, its catalog) before the first
increment of traffic goes home, so the first requests routed home hit the prefix cache.

Simulator replicas, real etcd, agents, a gateway and the control plane's gRPC API. The
same run with ``recovery.prewarm: false`` is the control: the first request home is cold.
The gateway runs without warm first (its own replay of home's prompts when home serves
again, tests/integration/test_gateway_warm_first.py), which would warm home in both.
"""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, until
from controlplane.kernel.codec import decode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditEntry
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.prewarm_harness import (
    first_hits,
    hits_across,
    send,
    tokens,
    two_regions,
    wait_catalog,
    wired_regions,
)

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

BLOCK = 16
K = 3
SYSTEM = "Returning region policy. " + " ".join(f"clause-{j} applies" for j in range(80))


@pytest.fixture
def sims() -> Iterator[dict[str, list[Proc]]]:
    with two_regions(BLOCK) as regions:
        yield regions


async def audit(store: EtcdStore, keys: Keys, action: str) -> list[AuditEntry]:
    page = await store.get_prefix(keys.audit_prefix())
    entries = [decode(AuditEntry, kv.value, kv.key) for kv in page.kvs]
    return [e for e in entries if e.action == action]


@pytest.mark.parametrize("recovery_prewarm", [True, False], ids=["prewarm", "no-prewarm"])
async def test_home_is_warmed_before_traffic_returns(
    sims: dict[str, list[Proc]],
    etcd: EtcdServer,
    etcd_store: EtcdStore,
    cluster_name: str,
    keys: Keys,
    recovery_prewarm: bool,
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
        recovery: dict[str, object] = {
            "prewarm": recovery_prewarm,
            "step_percent": 50,
            "step_interval_s": 0.5,
        }
        async with wired_regions(
            etcd,
            cluster_name,
            urls,
            prefixes=prefixes,
            prewarm={"budget_s": 20, "verify": 0},
            recovery=recovery,
            warm_first=False,
        ) as w:
            stub = w.control_plane.stub
            for s in range(K + 1):
                assert await send(http, w.gateway, f"s{s}", f"{SYSTEM}\nQ{s}?") == "a"
            catalog = await wait_catalog(etcd_store, keys, "a", payloads=1)

            # An operator drains a (servers to be restarted); its traffic goes to b.
            resp = await stub.RequestFailover(
                pb.FailoverRequest(region="a", to=["b"], reason="test: restart", actor="t")
            )
            assert resp.accepted, resp

            async def region_is(state: int, routing: dict[str, float]) -> bool:
                st = await stub.GetStatus(pb.GetStatusRequest())
                a = next(r for r in st.regions if r.name == "a")
                return a.state == state and dict(a.routing) == routing

            await until(
                lambda: region_is(pb.FAILING_OVER, {"b": 1.0}),
                within=30,
                every=0.2,
                what="a drained to b",
            )
            # a's servers come back restarted: empty prefix caches.
            for u in urls["a"]:
                async with http.post(u + "/reset_prefix_cache") as r:
                    assert r.status == 200
            replayed = await hits_across(http, urls["a"])

            resp = await stub.RequestRecovery(
                pb.RecoveryRequest(region="a", reason="test: servers back", actor="t")
            )
            assert resp.accepted, resp
            await until(
                lambda: region_is(pb.NORMAL, {"a": 1.0}),
                within=40,
                every=0.2,
                what="a recovered to NORMAL",
            )

            entries = await audit(etcd_store, keys, "recovery_prewarm")
            steps = await audit(etcd_store, keys, "recovery_step")
            if recovery_prewarm:
                [entry] = entries
                assert entry.result == "ok", entry
                assert float(entry.details["prefixes_warmed"]) >= 1
                assert entry.details["attained_fraction"] == "1"
                assert entry.at <= min(s.at for s in steps)  # before the first step
            else:  # nothing ran on a's replicas since the reset
                assert entries == [] and await hits_across(http, urls["a"]) == replayed

            region, hits = await first_hits(
                http,
                w.gateway,
                "new-after-recovery",
                f"{SYSTEM}\nFirst question home?",
                urls["a"],
            )
            assert region == "a"
            deepest = max((e.payload for e in catalog.entries if e.payload), key=lambda p: p.blocks)
            warm = await tokens(http, urls["a"][0], deepest.prompt or "")
            if recovery_prewarm:
                assert hits >= warm - BLOCK  # the replayed prefix, less at most one block
            else:
                assert hits == 0  # cold: the caches were reset and nothing warmed them
