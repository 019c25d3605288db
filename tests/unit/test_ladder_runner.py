"""The leader's ladder adapter honours the operators' pause: while automation is
paused no step is applied (or restored), and the next tick after resume acts."""

from __future__ import annotations

from pathlib import Path

from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder_file import load_ladder
from controlplane.kernel.model import ControlFlags, Health, RegionHealth, RegionRecord, RegionState
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.kernel.store.memory import MemoryStore
from controlplane.ladder_runner import LadderRunner
from tests.unit.world import topology

RUNBOOK = Path(__file__).resolve().parents[2] / "runbooks" / "degradation.yaml"


def degraded_snapshot(now: float, paused: bool) -> Snapshot:
    topo = topology()
    views = {}
    for r in topo.names:
        state = RegionState.DEGRADED if r == "us-east" else RegionState.NORMAL
        verdict = Health.DEGRADED if r == "us-east" else Health.HEALTHY
        signals = {"ttft_p99_s": 10.0, "error_rate": 0.2} if r == "us-east" else {}
        views[r] = RegionView(
            name=r,
            record=RegionRecord(region=r, state=state, since=now - 30),
            health=RegionHealth(region=r, verdict=verdict, since=now - 30, signals=signals),
        )
    control = ControlFlags(paused=paused, reason="INC-1 investigating", actor="op", at=now)
    return Snapshot(now=now, regions=views, control=control)


async def test_no_ladder_step_while_paused_and_the_first_step_after_resume() -> None:
    store, keys = MemoryStore(), Keys("test")
    runner = LadderRunner(store, keys, topology(), load_ladder(RUNBOOK), lambda: [], "cp-1")
    assert await runner.tick(degraded_snapshot(1000.0, paused=True)) == []
    assert await store.get(keys.degradation("us-east")) is None
    written = await runner.tick(degraded_snapshot(1001.0, paused=False))
    assert [a.step for a in written] == [load_ladder(RUNBOOK).names[0]]
    assert await store.get(keys.degradation("us-east")) is not None
