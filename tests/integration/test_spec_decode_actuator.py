"""Degradation step 1 end to end on a real etcd with real simulator processes: an agent
runs a pool of simulators launched with ``--speculative-config`` (2 ACTIVE, 1 WARM) and
publishes ``pools/<region>``; an in-process gateway routes a steady stream of requests
to it. The leader's record ``degradation/<region>`` (written here as the leader writes
it) turns speculative decoding off: the agent rolls the pool to replicas without it -
seen in their ``/metrics`` (no ``vllm:spec_decode_*``) and in ``pools/<region>`` -
while every published ACTIVE set holds at least 2 replicas and every request succeeds;
the flag back on rolls it back. An agent started while the flag is off launches
replicas without it straight away (it reads the flag and what runs, not a history)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import until
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import DegradationRecord, FeatureFlags
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.vllm.metrics import parse_gauges
from regions.agent.pool_config import parse_pool_config
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from regions.agent.spec_decode_actuator import SpecDecodeActuator
from regions.agent.warm_pool import AgentPool
from regions.gateway.server import GatewayServer
from regions.pool.spec_decode import NO_SPEC_DECODE, SPEC_DECODE
from tests.integration.cp_harness import fast_topology, running_gateway

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
REGION = "east"
DRAFTS = "vllm:spec_decode_num_drafts_total"
SERVED = "vllm:prefix_cache_queries_total"  # prompt tokens looked up: >0 once it served
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
POOL = {
    "launcher": {"kind": "simulator", "speculative_config": NGRAM},
    "active": 2,
    "warm": 1,
    "reconcile_interval_s": 0.2,
    # Compressed dwells: an old replica leaves routing once its replacement serves; the
    # drain grace lets requests already sent to it finish before it is put to sleep.
    "dwell": {"warm_min_s": 1, "idle_min_s": 1, "active_min_s": 0.5, "drain_s": 0.3},
}
OFF = DegradationRecord(
    region=REGION,
    applied=("speculative_decoding_off",),
    flags=FeatureFlags(speculative_decoding=False),
    epoch=1,
    reason="test: ttft p99 over 2x baseline",
)


async def start_agent(etcd: EtcdServer, cluster: str) -> AgentHandle:
    config = AgentConfig(
        region=REGION,
        pool=parse_pool_config(POOL),
        etcd=etcd.endpoints,
        cluster=cluster,
        interval=0.25,
        timeout=0.25,
    )
    return await serve_agent(config)


def pool_of(handle: AgentHandle) -> AgentPool:
    assert handle.pool is not None
    return handle.pool


def topology(etcd: EtcdServer, cluster: str) -> Topology:
    """East has no static replicas: the pool is all it routes to."""
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [{**r, "replicas": []} for r in data["regions"][:2]]
    return parse_topology(data)


async def published(store: EtcdStore, keys: Keys) -> PoolMembers | None:
    kv = await store.get(keys.pool(REGION))
    return None if kv is None else decode(PoolMembers, kv.value, kv.key)


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> float | None:
    """The metric's value at ``url``, None when the replica does not export it."""
    async with http.get(url + "/metrics") as r:
        return parse_gauges(await r.text(), frozenset({name})).get(name)


async def runs_spec_decode(http: aiohttp.ClientSession, url: str) -> bool:
    return await metric(http, url, DRAFTS) is not None


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # A request routed to a sleeping replica would wait forever: fail instead.
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        yield s


@pytest.fixture
async def agent(etcd: EtcdServer, cluster_name: str) -> AsyncIterator[AgentHandle]:
    handle = await start_agent(etcd, cluster_name)
    try:
        yield handle
    finally:
        await handle.stop(grace=0)


class Traffic:
    """Requests through the gateway, one after another, until stopped."""

    def __init__(self, http: aiohttp.ClientSession, gw: GatewayServer) -> None:
        self.http, self.gw = http, gw
        self.ok = 0
        self.failures: list[str] = []

    async def run(self) -> None:
        i = 0
        while True:
            i += 1
            body = {"model": "tiny", "prompt": f"{i:05d} tell me about rockets", "max_tokens": 8}
            try:
                async with self.http.post(
                    self.gw.url + "/v1/completions", json=body, headers={"x-session-id": f"s{i}"}
                ) as r:
                    text = await r.text()
                    if r.status == 200:
                        self.ok += 1
                    else:
                        self.failures.append(f"HTTP {r.status}: {text[:200]}")
            except (aiohttp.ClientError, TimeoutError) as e:
                self.failures.append(repr(e))
            await asyncio.sleep(0.01)


class ActiveWatch:
    """Every value etcd takes for ``pools/<region>`` (a watch misses none), and the
    pool's own ACTIVE count sampled every 20 ms."""

    def __init__(self, store: EtcdStore, keys: Keys, pool: AgentPool) -> None:
        self.store, self.keys, self.pool = store, keys, pool
        self.published: list[tuple[str, ...]] = []
        self.sampled: list[int] = []

    async def run(self, from_revision: int) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch(from_revision))
            tg.create_task(self._sample())

    async def _watch(self, from_revision: int) -> None:
        key = self.keys.pool(REGION)
        async for event in self.store.watch_prefix(key, start_revision=from_revision):
            self.published.append(decode(PoolMembers, event.kv.value, key).active)

    async def _sample(self) -> None:
        while True:
            self.sampled.append(len(self.pool.active()))
            await asyncio.sleep(0.02)


async def rolled(
    http: aiohttp.ClientSession, store: EtcdStore, keys: Keys, agent: AgentHandle, spec: bool
) -> bool:
    """Both published ACTIVE replicas run (or not) speculative decoding, the roll is
    over, and the agent's signals say so."""
    members = await published(store, keys)
    if members is None or len(members.active) != 2:
        return False
    kinds = [await runs_spec_decode(http, url) for url in members.active]
    actuator = pool_of(agent).spec_decode
    assert isinstance(actuator, SpecDecodeActuator)
    done = actuator.progress is not None and actuator.progress.done
    signals = agent.view.signals
    return (
        kinds == [spec, spec]
        and done
        and signals.get("spec_decode_wanted") == float(spec)
        and signals.get("spec_decode_active") == (2.0 if spec else 0.0)
        and signals.get("spec_decode_roll_left") == 0.0
    )


async def test_speculative_decoding_off_rolls_the_pool_and_back_without_losing_capacity(
    etcd: EtcdServer,
    cluster_name: str,
    keys: Keys,
    etcd_store: EtcdStore,
    agent: AgentHandle,
    http: aiohttp.ClientSession,
) -> None:
    pool = pool_of(agent)
    assert pool.pool.variant == SPEC_DECODE
    await until(
        lambda: rolled(http, etcd_store, keys, agent, spec=True),
        within=20,
        every=0.1,
        what="the pool serving 2 ACTIVE replicas with speculative decoding",
    )
    start = await published(etcd_store, keys)
    assert start is not None
    original = set(start.active)
    revision = (await etcd_store.get(keys.pool(REGION))).mod_revision  # type: ignore[union-attr]

    async with running_gateway(topology(etcd, cluster_name), REGION, prefix_tracking=False) as gw:
        traffic, watch = Traffic(http, gw), ActiveWatch(etcd_store, keys, pool)
        tasks = [asyncio.create_task(traffic.run()), asyncio.create_task(watch.run(revision + 1))]
        try:
            await until(lambda: _true(traffic.ok >= 20), within=20, what="traffic flowing")
            for url in original:  # they decoded with drafts
                assert (await metric(http, url, DRAFTS) or 0) > 0

            await etcd_store.put(keys.degradation(REGION), encode(OFF))
            await until(
                lambda: rolled(http, etcd_store, keys, agent, spec=False),
                within=30,
                every=0.1,
                what="the pool rolled to replicas without --speculative-config",
            )
            plain = await published(etcd_store, keys)
            assert plain is not None and not set(plain.active) & original  # all replaced
            assert pool.pool.variant == NO_SPEC_DECODE
            served_before = traffic.ok

            async def new_replicas_serve() -> bool:
                served = [await metric(http, url, SERVED) or 0 for url in plain.active]
                return traffic.ok > served_before + 20 and all(s > 0 for s in served)

            await until(new_replicas_serve, within=20, what="the gateway using the new replicas")

            back = OFF.model_copy(
                update={
                    "applied": (),
                    "restored": OFF.applied,
                    "flags": FeatureFlags(),
                    "epoch": 2,
                    "reason": "test: recovered",
                }
            )
            await etcd_store.put(keys.degradation(REGION), encode(back))
            await until(
                lambda: rolled(http, etcd_store, keys, agent, spec=True),
                within=30,
                every=0.1,
                what="the pool rolled back to speculative decoding",
            )
            again = await published(etcd_store, keys)
            assert again is not None and not set(again.active) & set(plain.active)
            ok_before = traffic.ok
            await until(lambda: _true(traffic.ok >= ok_before + 10), what="traffic after")
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    assert traffic.failures == [], traffic.failures[:5]
    assert watch.published, "the watch saw no publication"
    # Never fewer than the 2 ACTIVE it started with: in etcd (every value) and in the pool.
    assert min(len(active) for active in watch.published) >= 2, watch.published
    assert min(watch.sampled) >= 2 and max(watch.sampled) <= 3  # one replacement at a time
    assert max(len(active) for active in watch.published) == 3  # the surge was published


async def test_an_agent_started_with_the_flag_off_launches_without_spec_decode(
    etcd: EtcdServer,
    cluster_name: str,
    keys: Keys,
    etcd_store: EtcdStore,
    http: aiohttp.ClientSession,
) -> None:
    await etcd_store.put(keys.degradation(REGION), encode(OFF))
    handle = await start_agent(etcd, cluster_name)
    try:
        pool = pool_of(handle)
        assert pool.pool.variant == NO_SPEC_DECODE  # read before the first launch
        snap = pool.pool.snapshot()
        assert {r.variant for r in snap.replicas} == {NO_SPEC_DECODE}  # nothing to roll
        for url in pool.active():
            assert not await runs_spec_decode(http, url)
        await until(
            lambda: rolled(http, etcd_store, keys, handle, spec=False),
            within=20,
            every=0.1,
            what="the agent settled without speculative decoding",
        )
    finally:
        await handle.stop(grace=0)


async def _true(value: bool) -> bool:
    return value
