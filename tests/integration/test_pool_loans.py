"""Lending a WARM replica out of rotation, end to end on a real etcd: an agent runs a
simulator pool (one ACTIVE, one WARM) and follows ``pool-loans/east/``; ``borrow`` gets
the WARM replica awake and outside ``pools/east.active`` (requests on it work, the
gateway never routes to it), and on exit the replica is asleep and WARM again. A named
ACTIVE replica is refused before anything is written, a second loan finds no WARM
replica left, a borrower that dies (its lease expires) gets its replica put back to
sleep, and a lost lease or a lent replica that dies cancels the borrower's body. Loans
taken together (``borrow_together``) get what is WARM: too few lent, the ones lent go
back; enough, the refused ones are dropped at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import until
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.loans import (
    LoanLost,
    LoanRefused,
    LoanTimedOut,
    PoolLoan,
    borrow,
    borrow_together,
    read_members,
)
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import Store
from controlplane.kernel.vllm.metrics import parse_gauges
from regions.agent.pool_config import AgentPoolConfig
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from regions.agent.warm_pool import AgentPool
from regions.pool.launchers import SimulatorLauncher
from regions.pool.states import ReplicaState
from tests.integration.cp_harness import fast_topology, running_gateway

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
QUERIES = "vllm:prefix_cache_queries_total"  # prompt tokens looked up: >0 once served
REGION = "east"
WARM, LENT = ReplicaState.WARM, ReplicaState.LENT


@pytest.fixture
async def agent(etcd: EtcdServer, cluster_name: str) -> AsyncIterator[AgentHandle]:
    pool = AgentPoolConfig.model_validate(
        {"launcher": {"kind": "simulator"}, "active": 1, "warm": 1, "reconcile_interval_s": 0.5}
    )
    config = AgentConfig(
        region=REGION, pool=pool, etcd=etcd.endpoints, cluster=cluster_name, interval=0.5
    )
    handle = await serve_agent(config)
    try:
        store = pool_of(handle).store

        async def published_once() -> bool:
            return await store.get(Keys(cluster_name).pool(REGION)) is not None

        await until(published_once, within=20, every=0.05, what="the agent publishing")
        yield handle
    finally:
        await handle.stop(grace=0)


def topology(etcd: EtcdServer, cluster: str) -> Topology:
    """East has no static replicas: the pool is all it routes to."""
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [{**r, "replicas": []} for r in data["regions"][:2]]
    return parse_topology(data)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s


def pool_of(handle: AgentHandle) -> AgentPool:
    assert handle.pool is not None
    return handle.pool


async def members(store: Store, keys: Keys) -> PoolMembers:
    m = await read_members(store, keys, REGION)
    assert m is not None
    return m


async def is_sleeping(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.get(url + "/is_sleeping") as r:
        return bool((await r.json())["is_sleeping"])


async def queries(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as r:
        return parse_gauges(await r.text(), frozenset({QUERIES})).get(QUERIES, 0.0)


async def complete(http: aiohttp.ClientSession, url: str, prompt: str) -> None:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()


def state_of(agent: AgentHandle, url: str) -> ReplicaState:
    [r] = [r for r in pool_of(agent).pool.snapshot().replicas if r.url == url]
    return r.state


class RecordingStore:
    """The store, counting what would write: a refusal must come before any of it."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.writes: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in ("put", "grant_lease", "txn", "create", "cas", "delete"):
            self.writes.append(name)
        return getattr(self._store, name)


async def test_a_borrowed_replica_is_awake_out_of_rotation_and_warm_again_after(
    agent: AgentHandle,
    etcd: EtcdServer,
    cluster_name: str,
    etcd_store: EtcdStore,
    keys: Keys,
    http: aiohttp.ClientSession,
) -> None:
    pool = pool_of(agent).pool
    [active] = pool.active()
    [warm] = pool.snapshot().urls(WARM)
    async with running_gateway(
        topology(etcd, cluster_name), REGION, prefix_tracking=False
    ) as gateway:
        async with borrow(etcd_store, keys, REGION, borrower="test", ttl_s=3) as url:
            assert url == warm and state_of(agent, url) is LENT
            assert not await is_sleeping(http, url)
            published = await members(etcd_store, keys)
            assert url not in published.active and list(published.lent.values()) == [url]
            assert published.active == (active,) and published.warm == 0
            await complete(http, url, "a probe's prompt")  # the borrower's requests work
            probe_queries = await queries(http, url)
            assert probe_queries > 0

            # The gateway routes the region's traffic to the ACTIVE replica only.
            assert gateway.balancers[REGION].replicas == (active,)
            for i in range(20):
                await complete(http, gateway.url, f"{i:04d} question about rockets")
            assert await queries(http, url) == probe_queries
            assert gateway.balancers[REGION].replicas == (active,)

            # Nothing WARM is left: a second loan is refused with the agent's reason.
            with pytest.raises(LoanRefused, match="no WARM replica to lend") as refused:
                async with borrow(etcd_store, keys, REGION, borrower="second", ttl_s=3):
                    pytest.fail("a second replica was lent")
            assert not isinstance(refused.value, LoanTimedOut)

        # borrow returned once the agent reported the replica back: asleep, WARM.
        assert state_of(agent, warm) is WARM and await is_sleeping(http, warm)
        after = await members(etcd_store, keys)
        assert after.lent == {} and after.loan_refusals == {} and after.warm == 1
        assert (await etcd_store.get_prefix(keys.pool_loans_prefix(REGION))).kvs == []
        assert gateway.balancers[REGION].replicas == (active,)


async def test_a_named_active_replica_is_refused_before_anything_is_written(
    agent: AgentHandle, etcd_store: EtcdStore, keys: Keys
) -> None:
    [active] = pool_of(agent).pool.active()
    store = RecordingStore(etcd_store)
    with pytest.raises(LoanRefused, match="ACTIVE in pools/east: in rotation"):
        async with borrow(store, keys, REGION, borrower="test", replica=active):  # type: ignore[arg-type]
            pytest.fail("an ACTIVE replica was lent")
    assert store.writes == []
    assert state_of(agent, active) is ReplicaState.ACTIVE


async def test_a_named_unknown_replica_is_refused_by_the_agent(
    agent: AgentHandle, etcd_store: EtcdStore, keys: Keys
) -> None:
    with pytest.raises(LoanRefused, match="is not a replica of this pool") as refused:
        async with borrow(
            etcd_store, keys, REGION, borrower="test", replica="http://127.0.0.1:9", ttl_s=3
        ):
            pytest.fail("an unknown replica was lent")
    assert refused.value.loan_id is not None  # the agent's answer, not the borrower's


async def test_a_dead_borrowers_replica_goes_back_to_sleep(
    agent: AgentHandle, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    """A borrower that dies keeps its lease alive no longer: it expires, the loan's key
    goes with it, and the agent returns the replica."""
    [warm] = pool_of(agent).pool.snapshot().urls(WARM)
    lease = await etcd_store.grant_lease(2)
    loan = PoolLoan(loan_id="dead-borrower", borrower="gone", since=0.0)
    await etcd_store.put(keys.pool_loan(REGION, loan.loan_id), encode(loan), lease=lease)

    async def lent() -> bool:
        return (await members(etcd_store, keys)).lent.get(loan.loan_id) == warm

    await until(lent, within=20, every=0.05, what="the agent lending the WARM replica")
    assert not await is_sleeping(http, warm)

    async def returned() -> bool:  # the lease expires ~2 s on: no one refreshes it
        return loan.loan_id not in (await members(etcd_store, keys)).lent

    await until(returned, within=20, every=0.1, what="the replica returned after the lease")
    assert state_of(agent, warm) is WARM and await is_sleeping(http, warm)
    assert (await members(etcd_store, keys)).warm == 1


async def test_no_agent_answering_times_out_and_says_so(etcd_store: EtcdStore, keys: Keys) -> None:
    stale = PoolMembers(region=REGION, active=("http://a",), warm=1, at=0.0, agent="agent:old")
    await etcd_store.put(keys.pool(REGION), encode(stale))
    with pytest.raises(LoanTimedOut, match=r"no agent answered within 0\.5 s"):
        async with borrow(etcd_store, keys, REGION, borrower="test", timeout_s=0.5, ttl_s=3):
            pytest.fail("lent without an agent")
    assert (await etcd_store.get_prefix(keys.pool_loans_prefix(REGION))).kvs == []  # revoked
    with pytest.raises(LoanRefused, match="pools/west is absent"):
        async with borrow(etcd_store, keys, "west", borrower="test"):
            pytest.fail("lent from a region without a pool")


async def test_a_lost_lease_cancels_the_borrowers_body(
    agent: AgentHandle, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    [warm] = pool_of(agent).pool.snapshot().urls(WARM)
    reached_the_end = False
    with pytest.raises(LoanLost, match=r"lost: lease 0x[0-9a-f]+ expired or was revoked"):
        async with borrow(etcd_store, keys, REGION, borrower="test", ttl_s=2) as url:
            [kv] = (await etcd_store.get_prefix(keys.pool_loans_prefix(REGION))).kvs
            await etcd_store.revoke_lease(kv.lease)  # e.g. expired while etcd was away
            await asyncio.sleep(30)  # a probe step: cut short by the lost lease
            reached_the_end = True
    assert url == warm and not reached_the_end
    assert state_of(agent, warm) is WARM and await is_sleeping(http, warm)


async def test_a_lent_replica_that_dies_cancels_the_borrowers_body(
    agent: AgentHandle, etcd_store: EtcdStore, keys: Keys
) -> None:
    launcher = pool_of(agent).launcher
    assert isinstance(launcher, SimulatorLauncher)
    reached_the_end = False
    with pytest.raises(LoanLost, match="went COLD while lent") as lost:
        async with borrow(etcd_store, keys, REGION, borrower="test", ttl_s=3, check_s=0.1) as url:
            proc = launcher.process(url)
            assert proc is not None
            proc.kill()
            await asyncio.sleep(30)  # a probe step: cut short once the agent says so
            reached_the_end = True
    assert lost.value.url == url and not reached_the_end
    assert (await members(etcd_store, keys)).loan_refusals == {}  # the loan is gone


async def test_loans_taken_together_that_are_not_all_lent_give_back_what_was(
    agent: AgentHandle, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    """One WARM replica for two loans on one lease: asked for both, the one lent goes
    back with the refusal; asked for at least one, the body gets it and the refused
    loan is dropped at once (the agent no longer reports it)."""
    [warm] = pool_of(agent).pool.snapshot().urls(WARM)
    with pytest.raises(LoanRefused, match=r"1 of 2 lent, 2 needed.*no WARM replica to lend"):
        async with borrow_together(
            etcd_store, keys, REGION, borrower="test", wanted=(None, None), ttl_s=3
        ):
            pytest.fail("two replicas lent from a pool with one WARM")
    assert state_of(agent, warm) is WARM and await is_sleeping(http, warm)
    assert (await members(etcd_store, keys)).lent == {}  # returned before borrow raised
    assert (await etcd_store.get_prefix(keys.pool_loans_prefix(REGION))).kvs == []

    async with borrow_together(
        etcd_store, keys, REGION, borrower="test", wanted=(None, None), at_least=1, ttl_s=3
    ) as got:
        assert got.urls == (warm,) and state_of(agent, warm) is LENT
        [why] = got.refused
        assert "no WARM replica to lend" in why
        [kv] = (await etcd_store.get_prefix(keys.pool_loans_prefix(REGION))).kvs
        assert kv.key.rsplit("/", 1)[-1] in (await members(etcd_store, keys)).lent

        async def refusal_dropped() -> bool:
            return (await members(etcd_store, keys)).loan_refusals == {}

        await until(refusal_dropped, within=20, every=0.05, what="the refused loan forgotten")
    assert state_of(agent, warm) is WARM and await is_sleeping(http, warm)
    assert (await members(etcd_store, keys)).lent == {}


async def test_a_replica_named_twice_is_refused_before_anything_is_written(
    agent: AgentHandle, etcd_store: EtcdStore, keys: Keys
) -> None:
    [warm] = pool_of(agent).pool.snapshot().urls(WARM)
    store = RecordingStore(etcd_store)
    with pytest.raises(LoanRefused, match="named twice"):
        async with borrow_together(store, keys, REGION, borrower="t", wanted=(warm, warm)):
            pytest.fail("one replica lent for two loans")
    with pytest.raises(ValueError, match=r"at_least must be within 1\.\.2"):
        async with borrow_together(
            store, keys, REGION, borrower="t", wanted=(None, None), at_least=3
        ):
            pytest.fail("more loans needed than asked for")
    assert store.writes == []
