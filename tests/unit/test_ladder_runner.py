"""The leader's ladder, in its cycle, honours the operators' pause: while automation is
paused no step is applied (or restored), and the next tick after resume acts. The
tick is the real one: ``decide`` with the ladder, applied by the orchestrator over the
in-memory store."""

from __future__ import annotations

from pathlib import Path

from controlplane.cluster import Cluster
from controlplane.core.decide import decide
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.file import load_ladder
from controlplane.kernel.model import (
    ControlFlags,
    Health,
    RegionHealth,
    RegionHold,
    RegionRecord,
    RegionState,
)
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.kernel.store.memory import MemoryStore
from controlplane.orchestrator import Orchestrator
from controlplane.prewarm import NoPrefixData
from tests.unit.world import topology

RUNBOOK = Path(__file__).resolve().parents[2] / "runbooks" / "degradation.yaml"


def degraded_snapshot(now: float, paused: bool, ladder_rev: int = 0) -> Snapshot:
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
            ladder_rev=ladder_rev if r == "us-east" else 0,
        )
    control = ControlFlags(paused=paused, reason="INC-1 investigating", actor="op", at=now)
    return Snapshot(now=now, regions=views, control=control)


async def test_no_ladder_step_while_paused_and_the_first_step_after_resume() -> None:
    store, keys, ladder, topo = MemoryStore(), Keys("test"), load_ladder(RUNBOOK), topology()
    orch = Orchestrator(Cluster(store, keys, topo, FakeClock(1000.0)), list, NoPrefixData(), "cp-1")
    paused = decide(degraded_snapshot(1000.0, paused=True), topo, "cp-1", ladder=ladder)
    assert paused.ladder == () and paused.ladder_holds == {
        "*": "paused with automation: INC-1 investigating"
    }
    await orch.apply(paused)
    assert await store.get(keys.degradation("us-east")) is None
    resumed = decide(degraded_snapshot(1001.0, paused=False), topo, "cp-1", ladder=ladder)
    assert [m.step for m in resumed.ladder] == [ladder.names[0]]
    await orch.apply(resumed)
    assert await store.get(keys.degradation("us-east")) is not None


def test_an_unreadable_degradation_record_holds_that_regions_ladder() -> None:
    # The reader gives no record but its revision: nothing is written over it.
    res = decide(
        degraded_snapshot(1000.0, paused=False, ladder_rev=7),
        topology(),
        "cp-1",
        ladder=load_ladder(RUNBOOK),
    )
    assert res.ladder == () and "unreadable" in res.ladder_holds["us-east"]


def test_a_held_unit_walks_no_ladder_step_until_its_hold_ends() -> None:
    snap = degraded_snapshot(1000.0, paused=False)
    hold = RegionHold(unit="us-east", reason="INC-2", actor="op", at=990.0, until=1010.0)
    east = snap.regions["us-east"].model_copy(update={"hold": hold, "hold_rev": 3})
    held = snap.model_copy(update={"regions": {**snap.regions, "us-east": east}})
    ladder, topo = load_ladder(RUNBOOK), topology()
    res = decide(held, topo, "cp-1", ladder=ladder)
    assert res.ladder == () and res.ladder_holds["us-east"] == "held by op: INC-2"
    later = held.model_copy(update={"now": 1010.0})  # at its end: released, and it walks
    res = decide(later, topo, "cp-1", ladder=ladder)
    assert [m.step for m in res.ladder] == [ladder.names[0]]
    assert [r.unit for r in res.releases] == ["us-east"] and res.releases[0].expected_rev == 3
