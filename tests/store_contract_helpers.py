"""Helpers for the Store contract suite (tests/test_store_contract*.py): the harness on
each adapter, MemoryStore on a manual clock and EtcdStore on the session's real etcd,
and ``h``, the fixture that runs a test once on each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.memory import ManualClock, MemoryStore
from controlplane.kernel.store.port import Store, WatchEvent

LIVENESS_S = 10.0  # generous bound for "eventually"; machines here are noisy


@dataclass
class Harness:
    store: Store
    prefix: str
    kind: str
    # Let ``seconds`` of lease time pass: a manual clock jump, or real sleep on etcd.
    let_time_pass: Callable[[float], Awaitable[None]]

    def k(self, name: str) -> str:
        return self.prefix + name


@pytest.fixture
async def memory_harness(keys: Keys) -> AsyncIterator[Harness]:
    clock = ManualClock()
    store = MemoryStore(clock=clock)

    async def let_time_pass(seconds: float) -> None:
        clock.advance(seconds)

    yield Harness(store, keys.root, "memory", let_time_pass)
    await store.close()


@pytest.fixture
async def etcd_harness(etcd_store: EtcdStore, keys: Keys) -> Harness:
    return Harness(etcd_store, keys.root, "etcd", asyncio.sleep)


@pytest.fixture(name="h", params=["memory", pytest.param("etcd", marks=pytest.mark.etcd)])
def fixture_h(request: pytest.FixtureRequest) -> Harness:
    """The test's harness, once on each adapter. A module using it imports this and
    both ``*_harness`` fixtures (they are asked for by name)."""
    harness: Harness = request.getfixturevalue(f"{request.param}_harness")
    return harness


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    async with asyncio.timeout(LIVENESS_S):
        while not await check():  # noqa: ASYNC110 - polling the store is the point
            await asyncio.sleep(0.05)
    assert await check(), what


async def next_events(events: AsyncIterator[WatchEvent], n: int) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    async with asyncio.timeout(LIVENESS_S):
        while len(out) < n:
            out.append(await anext(events))
    return out
