"""A collaborator left out is a feature off, and the log says so once: not a silent
``None`` that skips work while the cycle keeps scheduling it. A real loop and
orchestrator on the in-memory store."""

from __future__ import annotations

import asyncio
import logging

import pytest

from controlplane.cluster import Cluster
from controlplane.core.actions import JobKind
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.memory import MemoryStore
from controlplane.loop import ReconcileLoop
from controlplane.orchestrator import Orchestrator
from controlplane.prewarm import NoPrefixData
from tests.unit.test_loop_tick_duration import Leadership
from tests.unit.world import topology

TOPO = topology()


async def test_the_first_leading_tick_names_what_is_off_and_later_ticks_do_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(1000.0)
    orch = Orchestrator(Cluster(MemoryStore(), Keys("t"), TOPO, clock), list, NoPrefixData(), "cp")
    loop = ReconcileLoop(orch, Leadership(True))
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            result = await loop.tick()
            for _ in range(10):  # the aggregation job's turns of the event loop
                await asyncio.sleep(0)
            clock.advance(TOPO.prefixes.aggregate_interval_s)
    said = [r.getMessage() for r in caplog.records]
    off = [m for m in said if m.startswith("off in this control plane")]
    assert len(off) == 1
    assert "check of the agents" in off[0] and "degradation ladder" in off[0]
    assert "cluster spec" in off[0]
    # the cycle schedules the catalogs' merge; with no catalogs writer it says so once
    assert result is not None and any(j.kind is JobKind.PREFIX_AGGREGATE for j in result.jobs)
    assert sum(m.startswith("prefix catalogs are off") for m in said) == 1
    await orch.stop_failovers()
