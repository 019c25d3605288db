"""``etcd.balance``: spread calls over every member, or keep them on the first that
answers (an etcd across regions: the local member), on a real 3-member etcd; each
member's own gRPC counters say where the calls went."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest

from chaos.lab.local_etcd import EtcdCluster
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig

pytestmark = [pytest.mark.etcd]
CALLS = 30


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(3) as c:  # started on enter, stopped on exit
        yield c


def ranges_served(endpoint: str) -> float:
    """The member's count of Range calls it answered (etcd's own /metrics)."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("grpc_server_handled_total{") and 'grpc_method="Range"' in line
    )


async def calls_per_member(cluster: EtcdCluster, balance: str) -> list[float]:
    before = [ranges_served(e) for e in cluster.endpoints]
    config = EtcdConfig(endpoints=cluster.endpoints, balance=balance)  # type: ignore[arg-type]
    async with EtcdStore(config) as store:
        for _ in range(CALLS):
            await store.get("/balance-probe")
    return [ranges_served(e) - b for e, b in zip(cluster.endpoints, before, strict=True)]


async def test_first_keeps_every_call_on_the_first_member(cluster: EtcdCluster) -> None:
    got = await calls_per_member(cluster, "first")
    assert got[0] >= CALLS and got[1:] == [0, 0], got


async def test_round_robin_spreads_the_calls(cluster: EtcdCluster) -> None:
    got = await calls_per_member(cluster, "round_robin")
    assert sum(got) >= CALLS and all(n > 0 for n in got), got


async def test_first_goes_on_to_the_next_member_when_the_first_is_gone(
    cluster: EtcdCluster,
) -> None:
    config = EtcdConfig(endpoints=("127.0.0.1:1", *cluster.endpoints[1:]), balance="first")
    async with EtcdStore(config) as store:
        await store.put("/balance-probe", b"here")
        kv = await store.get("/balance-probe")
    assert kv is not None and kv.value == b"here"
