"""The reconcile loop times each tick: a leader's ticks go into
``tectonic_loop_tick_duration_seconds``, and a tick longer than its period is logged
as a warning (before, an overrunning tick was silent until the bound of period + 2 x
retry timeout cut it).

A real loop on a real in-memory store, orchestrator and metrics; the tick is timed on
a fake clock that the store moves forward as it answers (a slow store), so nothing
here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from controlplane.cluster import Cluster
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.memory import ManualClock, MemoryStore
from controlplane.kernel.store.port import Compare, Page
from controlplane.loop import ReconcileLoop
from controlplane.metrics import ControlPlaneMetrics
from controlplane.orchestrator import Orchestrator
from controlplane.prewarm import NoPrefixData
from tests.unit.world import topology

PERIOD = 1.0
TOPO = topology(loop_period_s=PERIOD)


class SlowStore(MemoryStore):
    """Each read takes ``delay`` seconds of the fake clock ``elapsed``."""

    def __init__(self, elapsed: ManualClock) -> None:
        super().__init__()
        self.elapsed = elapsed
        self.delay = 0.0

    async def get_prefix(self, prefix: str, *, page_size: int = 10_000, revision: int = 0) -> Page:
        self.elapsed.advance(self.delay)
        return await super().get_prefix(prefix, page_size=page_size, revision=revision)


class Leadership:
    def __init__(self, leading: bool) -> None:
        self.leading = leading

    @property
    def is_leader(self) -> bool:
        return self.leading

    def fence(self) -> list[Compare]:
        return []

    async def wait_changed(self) -> bool:
        await asyncio.Event().wait()
        return True


def reconcile_loop(
    store: SlowStore, leadership: Leadership, metrics: ControlPlaneMetrics
) -> ReconcileLoop:
    keys, clock = Keys(TOPO.cluster), FakeClock()
    orchestrator = Orchestrator(Cluster(store, keys, TOPO, clock), list, NoPrefixData(), "cp-test")
    return ReconcileLoop(orchestrator, leadership, observer=metrics, monotonic=store.elapsed)


def overruns(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "longer than its period" in r.getMessage()
    ]


async def test_a_leaders_ticks_are_timed_and_an_overrun_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tectonic.loop")
    store, metrics = SlowStore(ManualClock()), ControlPlaneMetrics(TOPO.names)
    loop = reconcile_loop(store, Leadership(True), metrics)
    get = metrics.registry.get_sample_value

    await loop.tick_once()  # a fast store: no time passes
    assert loop.ticks == 1
    assert get("tectonic_loop_tick_duration_seconds_count") == 1
    assert get("tectonic_loop_tick_duration_seconds_sum") == 0
    assert overruns(caplog) == []

    store.delay = 0.75  # the snapshot reads take longer than the period together
    await loop.tick_once()
    assert loop.ticks == 2  # it completed: too slow, but not cut
    assert get("tectonic_loop_tick_duration_seconds_count") == 2
    took = get("tectonic_loop_tick_duration_seconds_sum")
    assert took is not None and took > PERIOD
    assert get("tectonic_loop_tick_duration_seconds_bucket", {"le": "1.0"}) == 1
    [warning] = overruns(caplog)
    assert f"tick took {took:.2f}s" in warning


async def test_a_followers_ticks_are_not_in_the_leaders_histogram() -> None:
    store, metrics = SlowStore(ManualClock()), ControlPlaneMetrics(TOPO.names)
    loop = reconcile_loop(store, Leadership(False), metrics)
    await loop.tick_once()
    assert loop.ticks == 1
    assert metrics.registry.get_sample_value("tectonic_loop_tick_duration_seconds_count") == 0
