"""Model pools in a lab of real processes (docs/models.md): three regions, each with a
pool of two models (simulators serving each name, an agent per pool), a gateway per
region, two control-plane replicas, and synthetic sessions that each talk to both
models under one session id.

The ``pool-outage`` drill on one model's pool in us-east passes, moves only that
model's conversations (every other one is answered where it started, measured from
each request's answering region), warms that pool's targets with that model's
prefixes only, and recovers. Then the ``region-blackout`` drill on us-west (every
server of both its pools) passes for each pool and moves both models' conversations,
each one region at a time.

What is judged is the drills' verdicts, whose windows (RTO and pre-warm: 30 s) are many
times what an outage takes, and where each conversation was answered; so scripts/test.sh
runs this module two at a time with other outcome-only labs (OUTCOMES_PAIRED there): add
nothing that times or judges a latency.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import aiohttp
import pytest

from chaos.drills.measure import SessionLog, consistency_violations
from chaos.drills.scenario import find_scenario
from chaos.lab.run import drill_on, lab_traffic, running_lab
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.codec import decode
from controlplane.kernel.model import RegionRecord, RegionState
from controlplane.kernel.prefix.catalog import PrefixCatalog
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from tests.drill_paths import blackout_path

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(420)]

POOLS = (("chat", "llama-3"), ("code", "qwen-coder"))
MODELS = {model: pool for pool, model in POOLS}
REGIONS = ("us-east", "us-west", "us-central")


async def state(store: EtcdStore, keys: object, unit: str) -> RegionState | None:
    kv = await store.get(keys.region_state(unit))  # type: ignore[attr-defined]
    return None if kv is None else decode(RegionRecord, kv.value, kv.key).state


async def scrape(base: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


async def test_a_pool_outage_moves_one_models_conversations_a_blackout_moves_all(
    tmp_path: Path,
) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-test-lab-"))
    spec = DeploymentSpec(pools=POOLS, replicas_per_region=1)
    async with running_lab(spec, workdir, say=lambda m: None) as dep:
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        try:
            traffic = lab_traffic(dep)
            result = await drill_on(
                dep,
                store,
                find_scenario("pool-outage"),
                "us-east.chat",
                reports=tmp_path,
                sessions=12,
                traffic=traffic,
                say=lambda m: None,
            )
            assert result.passed, [c for c in result.criteria if not c.passed]
            assert blackout_path(result, "us-east.chat") == ["FAILING_OVER", "RECOVERED", "NORMAL"]
            assert {t.region for t in result.transitions} == {"us-east.chat"}
            assert result.figures["prewarm_attained_fraction"] == 1.0
            # only the chat pool of us-east moved its conversations, to chat pools
            moved = 0
            for s in traffic.sessions:
                served = [r for _, r in s.log if r]
                assert served and served[0] == s.home_unit, (s.conversation, served[:3])
                if s.home_unit != "us-east.chat":
                    assert set(served) == {s.home_unit}, (s.conversation, set(served))
                elif len(set(served)) > 1:
                    moved += 1
                    assert set(served) - {"us-east.chat"} <= {"us-west.chat", "us-central.chat"}
            assert moved > 0, "no chat conversation of us-east was seen moving"
            # while failed over, its traffic went to chat pools only ...
            away = {
                target
                for sample in result.samples
                if (view := sample.regions.get("us-east.chat")) is not None
                for target, weight in view.routing.items()
                if weight > 0 and target != "us-east.chat"
            }
            assert away and away <= {"us-west.chat", "us-central.chat"}
            # ... warmed from the chat pool's own catalog: its model's prompts only
            kv = await store.get(dep.keys.prefixes("us-east.chat"))
            assert kv is not None
            catalog = decode(PrefixCatalog, kv.value, kv.key)
            models = {e.payload.model for e in catalog.entries if e.payload is not None}
            assert models == {"llama-3"}
            # every series of a pool, an agent's and a gateway's, names its model
            agent = await scrape(f"http://127.0.0.1:{dep.agent_metrics_ports['us-east.code']}")
            gateway = await scrape(dep.gateway_urls["us-west"])
            for text, unit, model in (
                (agent, "us-east.code", "qwen-coder"),
                (gateway, "us-east.chat", "llama-3"),
            ):
                series = [line for line in text.splitlines() if f'region="{unit}"' in line]
                bare = [line for line in series if f'model="{model}"' not in line]
                assert series and not bare, bare[:3]

            # a region-wide fault: the region-blackout drill on us-west, both its pools
            blackout = lab_traffic(dep)
            result = await drill_on(
                dep,
                store,
                find_scenario("region-blackout"),
                "us-west",
                reports=tmp_path,
                sessions=9,
                traffic=blackout,
                session_prefix="b",  # new sessions: the first drill's moved some
                say=lambda m: None,
            )
            assert result.passed, [c for c in result.criteria if not c.passed]
            for unit in ("us-west.chat", "us-west.code"):
                assert blackout_path(result, unit) == ["FAILING_OVER", "RECOVERED", "NORMAL"]
            consistency = next(c for c in result.criteria if c.name == "session_consistency")
            assert consistency.measured.startswith("0.0000%")
            west = [s for s in blackout.sessions if s.home == "us-west"]
            assert {s.model for s in west} == set(MODELS)
            for s in west:  # every us-west conversation of both models moved, to its pool
                served = [r for _, r in s.log if r]
                assert served[0] == s.home_unit and len(set(served)) == 2, (s.conversation, served)
                assert set(served) <= {f"{r}.{MODELS[s.model]}" for r in REGIONS}
            logs = [
                SessionLog(s.conversation, s.home_unit, tuple(s.log)) for s in blackout.sessions
            ]
            assert consistency_violations(logs, {"us-west.chat", "us-west.code"}) == 0
        finally:
            await store.close()
