"""Scale to zero on a lab of simulator warm pools (docs/scaling.md, "Scale to zero"):
an idle pool drains to zero after its idle window, a request through the gateway wakes
it and is served within the hold; back at zero, a request through the endpoint picker
(spoken to as Envoy does) wakes it too; no region is ever failed over (asleep is not
down). The lab is bench zero's (``bench/zero.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from bench._stream import streamed_completion
from bench.zero import UNIT, ZeroLab, completion, spec_of, through_picker
from chaos.lab.procs import Proc, start_picker, until
from chaos.lab.run import running_lab
from controlplane.kernel.codec import decode
from controlplane.kernel.model import Health, RegionHealth, RegionState
from controlplane.kernel.pool.scale import WakeRequest
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_an_idle_pool_sleeps_and_a_request_wakes_it(tmp_path: Path) -> None:
    async with running_lab(spec_of(4.0), tmp_path, say=lambda m: None) as dep:
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        lab = ZeroLab(dep, store)
        seen: list[dict[str, RegionState]] = []
        picker: Proc | None = None
        try:

            async def asleep() -> bool:
                seen.append(await lab.states())
                return await lab.at_zero()

            await until(asleep, within=90, every=0.2, what=f"{UNIT} at zero")
            rec = await lab.scale()
            assert rec is not None and any("idle_to_zero_s" in r for r in rec.reasons)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as http:
                got = await streamed_completion(http, dep.gateway_urls[UNIT], completion(0))
            assert got.region == UNIT  # served there (a 503 raises), held while it woke
            assert await lab.awake()
            woken = await lab.scale()
            assert woken is not None and woken.active >= 1 and woken.woken_at is not None
            assert any(r.startswith("woken by a request") for r in woken.reasons) or (
                woken.demand_at is not None and woken.demand_at >= woken.woken_at
            )
            picker = await asyncio.to_thread(
                start_picker, dep.topology_path, UNIT, control_planes=dep.cp_targets
            )
            await until(asleep, within=90, every=0.2, what=f"{UNIT} back at zero")
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as http:
                picked = await through_picker(http, picker.url.removeprefix("grpc://"), 2)
            assert picked.refused == 0 and len(picked.first_tokens) == 2
            wake = await store.get(dep.keys.wake(UNIT))  # the picker asked this time
            assert wake is not None
            assert decode(WakeRequest, wake.value, wake.key).by.startswith("picker")
            seen.append(await lab.states())
            assert all(s is RegionState.NORMAL for st in seen for s in st.values()), seen
            assert await dep_health(lab) is not Health.UNHEALTHY
        finally:
            if picker is not None:
                await asyncio.to_thread(picker.terminate)
            await store.close()


async def dep_health(lab: ZeroLab) -> Health:
    kv = await lab.store.get(lab.dep.keys.region_health(UNIT))
    assert kv is not None
    return decode(RegionHealth, kv.value, kv.key).verdict
