"""The agent follows the leader's ``scale/<unit>`` on a real etcd: a simulator pool
(1 ACTIVE + 1 WARM in its pool file, 4 slots) grows to what the record asks (COLD
slots launched to WARM, then woken), shrinks through IDLE after its ACTIVE dwell, is
held to its slots, ignores another unit's record under the same prefix, and keeps its
sizes when the record goes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import until
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.loans import read_members
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.store.port import Store
from regions.agent.pool_config import AgentPoolConfig
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from regions.agent.warm_pool import AgentPool
from regions.pool.states import ReplicaState

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
REGION = "east"


@pytest.fixture
async def agent(etcd: EtcdServer, cluster_name: str) -> AsyncIterator[AgentHandle]:
    pool = AgentPoolConfig.model_validate(
        {
            "launcher": {"kind": "simulator"},
            "active": 1,
            "warm": 1,
            "size": 4,
            "reconcile_interval_s": 0.3,
            "dwell": {"active_min_s": 0, "idle_min_s": 3600, "warm_min_s": 3600},
        }
    )
    config = AgentConfig(
        region=REGION, pool=pool, etcd=etcd.endpoints, cluster=cluster_name, interval=0.5
    )
    handle = await serve_agent(config)
    try:
        yield handle
    finally:
        await handle.stop(grace=0)


def pool_of(handle: AgentHandle) -> AgentPool:
    assert handle.pool is not None
    return handle.pool


def record(active: int, warm: int, unit: str = REGION) -> bytes:
    return encode(
        ScaleRecord(
            unit=unit, active=active, warm=warm, decided_at=1.0, changed_at=1.0, reasons=("test",)
        )
    )


async def published_active(store: Store, keys: Keys, n: int) -> None:
    async def there() -> bool:
        m = await read_members(store, keys, REGION)
        return m is not None and len(m.active) == n

    await until(there, within=30, every=0.1, what=f"{n} ACTIVE published in pools/{REGION}")


async def test_the_pool_follows_its_scale_record_and_only_its_own(
    agent: AgentHandle, cluster_name: str
) -> None:
    pool = pool_of(agent)
    store, keys = pool.store, Keys(cluster_name)
    await published_active(store, keys, 1)
    await store.put(keys.scale("east2"), record(4, 0, unit="east2"))  # another unit's
    await store.put(keys.scale(REGION), record(3, 1))
    await published_active(store, keys, 3)  # two COLD slots launched, then woken
    assert pool.scale.applied == (3, 1)
    assert pool.signals()["scale_desired_active"] == 3.0
    assert pool.signals()["activation_p95_s"] > 0  # its wakes, for the scaler's horizon

    await store.put(keys.scale(REGION), record(6, 2))  # more than the pool holds
    await published_active(store, keys, 4)
    assert pool.scale.applied == (4, 0)

    await store.put(keys.scale(REGION), record(1, 1))
    await published_active(store, keys, 1)  # drained, not stopped: IDLE, awake
    states = [r.state for r in pool.pool.snapshot().replicas]
    assert states.count(ReplicaState.ACTIVE) == 1
    assert states.count(ReplicaState.IDLE) == 3

    await store.delete(keys.scale(REGION))  # scaling switched off: the sizes stay

    async def forgotten() -> bool:
        return pool.scale.record is None

    await until(forgotten, within=10, every=0.1, what="the record gone from the copy")
    await published_active(store, keys, 1)
