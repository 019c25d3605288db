"""Model pools in a lab of real processes (docs/models.md): three regions, each with a
pool of two models (simulators serving each name, an agent per pool), a gateway per
region, two control-plane replicas, and synthetic sessions that each talk to both
models under one session id.

The ``pool-outage`` drill on one model's pool in us-east passes, moves only that
model's conversations (every other one is answered where it started, measured from
each request's answering region), warms that pool's targets with that model's
prefixes only, and recovers. Then a region-wide fault (every server of us-west, both
pools) moves both models' conversations, each one region at a time."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import pytest

from chaos.drills.measure import SessionLog, consistency_violations
from chaos.drills.scenario import find_scenario
from chaos.lab.procs import until
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

            # a region-wide fault: every server of us-west, both pools
            blackout = lab_traffic(dep)
            blackout.add(9, list(REGIONS), prefix="b", models=list(MODELS), pools=MODELS)
            await blackout.start()
            try:

                async def twice() -> bool:
                    return blackout.answered(2)

                await until(twice, within=30, what="every blackout session answered twice")
                fault_at = time.monotonic()
                await asyncio.to_thread(dep.stop_servers, "us-west")

                async def both_failed_over() -> bool:
                    units = ("us-west.chat", "us-west.code")
                    states = [await state(store, dep.keys, u) for u in units]
                    return states == [RegionState.FAILING_OVER] * 2

                await until(both_failed_over, within=40, what="both us-west pools failed over")
                west = [s for s in blackout.sessions if s.home == "us-west"]

                async def answered_elsewhere() -> bool:
                    return all(
                        any(t > fault_at and r and r != s.home_unit for t, r in s.log) for s in west
                    )

                await until(answered_elsewhere, within=40, what="every us-west conversation moved")
            finally:
                await blackout.stop()
                await asyncio.to_thread(dep.start_servers, "us-west")
            assert {s.model for s in west} == set(MODELS)
            for s in west:
                after = {r for t, r in s.log if r and t > fault_at}
                assert after and after <= {f"{r}.{MODELS[s.model]}" for r in REGIONS}
            logs = [
                SessionLog(s.conversation, s.home_unit, tuple(s.log)) for s in blackout.sessions
            ]
            assert consistency_violations(logs, {"us-west.chat", "us-west.code"}) == 0
        finally:
            await store.close()
