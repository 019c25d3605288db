"""The leader's compaction of etcd's history (core/compaction.py, compactor.py), with a
fake clock on the in-memory store: which revision it compacts to, who compacts, and
that a watcher further behind than the retention is told to relist."""

from __future__ import annotations

import pytest

from controlplane.compactor import Compactor
from controlplane.core.compaction import RevisionWindow
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import StoreError
from controlplane.kernel.store.settings import EtcdConfig


def test_nothing_is_compacted_before_a_sample_is_a_retention_old() -> None:
    w = RevisionWindow(retention_s=300)
    w.observe(0, 10)
    assert w.target(299) is None
    w.observe(60, 50)
    assert w.target(299.9) is None
    assert w.target(300) == 10


def test_the_target_is_the_newest_revision_at_least_a_retention_old() -> None:
    w = RevisionWindow(retention_s=300)
    for t, rev in [(0, 10), (60, 20), (120, 30), (180, 40), (240, 50), (300, 60), (360, 70)]:
        w.observe(t, rev)
    # At 360 the store was at 20 (t=60) exactly a retention ago, and at 30 after it.
    assert w.target(360) == 20
    w.done(20)
    assert w.target(360) is None  # nothing newer is old enough yet
    w.observe(420, 80)
    assert w.target(420) == 30


def test_a_store_that_went_back_in_revisions_starts_the_window_over() -> None:
    w = RevisionWindow(retention_s=10)
    w.observe(0, 1000)
    w.observe(20, 1100)
    w.done(1000)
    w.observe(30, 5)  # restored from a backup: another history
    assert w.compacted == 0
    assert w.target(35) is None
    w.observe(45, 9)
    assert w.target(45) == 5


class _Leader:
    def __init__(self, leading: bool) -> None:
        self.leading = leading

    def __call__(self) -> bool:
        return self.leading


async def test_the_leader_compacts_behind_the_retention_and_followers_only_sample(
    keys: Keys,
) -> None:
    clock = FakeClock(0.0)
    store = MemoryStore(clock=clock.now)
    config = EtcdConfig(compact_retention_s=300, compact_interval_s=60)
    compacted: list[int] = []
    leader = _Leader(False)
    c = Compactor(store, keys, config, leader, on_compacted=compacted.append, now=clock.now)
    first = await store.put(keys.routing("us-east"), b"1")
    for _ in range(10):  # 10 minutes of writes, sampled every minute
        assert await c.once() is None  # a follower: never compacts
        for i in range(5):
            await store.put(keys.routing("us-east"), str(i).encode())
        clock.advance(60)
    leader.leading = True  # leadership moves here: it compacts at once
    target = await c.once()
    assert target is not None and compacted == [target]
    assert target < store.revision  # the last retention of history is kept
    # A watcher further behind than the retention must relist ...
    with pytest.raises(StoreError):
        async for _ in store.watch_prefix(keys.routing("us-east"), start_revision=first):
            break
    # ... and the values themselves are all there.
    kv = await store.get(keys.routing("us-east"))
    assert kv is not None and kv.value == b"4"
    assert await c.once() is None  # nothing newer is a retention old yet
