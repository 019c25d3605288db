"""The scaler's drills end to end, in labs of real processes (issue 31): every region's
agent runs a warm pool of slowed simulators (chaos/lab/surge.py) and the leader sizes
them (the topology's ``scaling:`` section), as the drill service's lab does for a
scenario with a surge (``lab_spec``).

With the scaler on, the ``traffic-surge`` drill passes: the surged pool grew ahead of
the ramp, every size the leader wrote is audited, and the pool is back at its
pre-surge ACTIVE count after the surge; with the scaler off (no ``scaling:`` section,
the pools keep their file's sizes) the same drill fails, on the surge's first-token
p99 and SLO attainment. The ``surge-during-failover`` drill (the region blacks out
mid-surge) passes with the scaler on, and fails with it off: the targets' replicas
woken for the failover are never given back."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest

from chaos.drills.result import DrillResult
from chaos.drills.scenario import find_scenario
from chaos.lab.run import drill_on, lab_spec, running_lab
from chaos.lab.surge import SURGE_SESSIONS
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from tests.drill_paths import blackout_path

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(420)]
# The scaler-off surge-during-failover drill's scaled_back window (the scenario's: 90 s):
# still longer than the scaler takes to give the replicas back with it on (12-13 s after
# this surge, 10-30 s after traffic-surge's: chaos/README.md), so the drill fails on
# what the scaler would have done within it.
SCALER_OFF_BACK_S = 30.0


async def drill(
    name: str, reports: Path, *, scaling: bool = True, scaled_back_within_s: float | None = None
) -> DrillResult:
    """One lab of the scenario's own shape (scaling on or off), the drill run on it;
    ``scaled_back_within_s`` replaces the scenario's window for ``scaled_back``."""
    scenario = find_scenario(name)
    if scaled_back_within_s is not None:
        measure = scenario.measure.model_copy(update={"scaled_back_within_s": scaled_back_within_s})
        scenario = scenario.model_copy(update={"measure": measure})
    spec = dataclasses.replace(lab_spec(scenario), scaling=scaling)
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-test-lab-"))
    async with running_lab(spec, workdir, say=lambda m: None) as dep:
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        try:
            return await drill_on(
                dep, store, scenario, reports=reports, sessions=SURGE_SESSIONS, say=lambda m: None
            )
        finally:
            await store.close()


def criterion(result: DrillResult, name: str) -> str:
    return next(f"{c.measured} {c.detail}" for c in result.criteria if c.name == name)


def grown(result: DrillResult, unit: str) -> int:
    """The most ACTIVE replicas the unit's pool published during the drill."""
    return max((v.active or 0) for s in result.samples if (v := s.regions.get(unit)) is not None)


async def test_traffic_surge_passes_with_the_scaler_on(tmp_path: Path) -> None:
    result = await drill("traffic-surge", tmp_path)
    assert result.passed, [c for c in result.criteria if not c.passed]
    names = {c.name for c in result.criteria}
    assert {"surge_ttft_p99", "slo_attainment", "scale_audited", "scaled_back"} <= names
    # measured, not assumed: the pool grew beyond its two ACTIVE, and its sizes were audited
    assert grown(result, "us-east") > 2
    assert "us-east " in criterion(result, "scaled_back")  # it grew, and went back in time
    assert ", 0 scale entries" not in criterion(result, "scale_audited")


async def test_traffic_surge_fails_with_the_scaler_off(tmp_path: Path) -> None:
    result = await drill("traffic-surge", tmp_path, scaling=False)
    assert not result.passed
    failed = set(result.failed_criteria())
    # the pool kept its two ACTIVE replicas: the surge queued on them
    assert failed & {"surge_ttft_p99", "scaled_back"}, result.criteria
    assert failed <= {"surge_ttft_p99", "slo_attainment", "scaled_back"}, result.criteria
    assert grown(result, "us-east") == 2
    p99 = next(c for c in result.criteria if c.name == "surge_ttft_p99")
    assert p99.passed or "over by" in p99.detail


async def test_surge_during_failover_passes_with_the_scaler_on(tmp_path: Path) -> None:
    result = await drill("surge-during-failover", tmp_path)
    assert result.passed, [c for c in result.criteria if not c.passed]
    assert blackout_path(result, "us-east") == ["FAILING_OVER", "RECOVERED", "NORMAL"]
    # a target took the moved surge on more replicas than it had, and gave them back
    assert max(grown(result, "us-west"), grown(result, "us-central")) > 2
    assert "not back" not in criterion(result, "scaled_back")


async def test_surge_during_failover_fails_with_the_scaler_off(tmp_path: Path) -> None:
    """Without the scaler a failover still wakes the targets' WARM replicas (the warm
    pool's one-way activation, as before the scaler): they carry the moved surge, and
    keep it all after the region is back. The drill fails on what the scaler adds.

    The drill watches for the pools to be back until ``scaled_back_within_s`` after the
    surge; with the scaler off they never are, so the scenario's 90 s are all waited
    out. A shorter window (SCALER_OFF_BACK_S) fails the same criterion sooner, for the
    same reason: "not back" (never at the pre-surge count again), not "over by"."""
    window = find_scenario("surge-during-failover").measure.scaled_back_within_s
    assert window is not None and window > SCALER_OFF_BACK_S  # the override shortens it
    result = await drill(
        "surge-during-failover",
        tmp_path,
        scaling=False,
        scaled_back_within_s=SCALER_OFF_BACK_S,
    )
    assert not result.passed
    failed = set(result.failed_criteria())
    assert "scaled_back" in failed, result.criteria
    assert failed <= {"scaled_back", "surge_ttft_p99", "slo_attainment"}, result.criteria
    assert "not back" in criterion(result, "scaled_back")
    back = next(c for c in result.criteria if c.name == "scaled_back")
    assert f"≤ {SCALER_OFF_BACK_S:g}s after" in back.required  # the override was judged
    assert ", 0 scale entries" in criterion(result, "scale_audited")  # nothing sized them
