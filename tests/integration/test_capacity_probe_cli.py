"""``failoverctl capacity probe`` without a drill service, and while it waits: it says at
once that none runs (exit 3, nothing queued), follows a queued request with JSON lines,
and stops waiting (exit 3) when the service's catalog goes silent. Plus the pure
helpers: the service's silence, where a request is, and T_recover as said."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.capacity.report import recovery_text as report_recovery
from controlplane.cli.capacity_cmds import (
    SERVICE_SILENT_S,
    progress_text,
    recovery_text,
    service_silence,
)
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology
from controlplane.kernel.drills import CAPACITY_PROBE, DrillCatalog, ScenarioInfo
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.cp_harness import fast_topology, running_replica
from tests.integration.test_failoverctl import ctl

LOCK = json.dumps(
    {
        "holder": "drills-h-1",
        "scenario": CAPACITY_PROBE,
        "region": "east",
        "trigger": "request",
        "started_at": 1000.0,
        "lease": 7,
    }
)


# ---- pure ------------------------------------------------------------------------------


def test_service_silence() -> None:
    none = pb.DrillsResponse()
    assert "no drill service is running" in service_silence(none)
    fresh = pb.DrillsResponse(service="drills-h-1", published_at=1000.0)
    assert service_silence(fresh, now=1000.0 + SERVICE_SILENT_S) == ""
    stale = service_silence(fresh, now=1000.0 + SERVICE_SILENT_S + 1)
    assert "drills-h-1 last published" in stale and "python -m chaos" in stale
    # a long drill publishes nothing meanwhile, but holds the lock on a live lease
    busy = pb.DrillsResponse(service="drills-h-1", published_at=1.0, running=LOCK)
    assert service_silence(busy, now=10_000.0) == ""


def test_progress_text() -> None:
    # asked for after the running drill started: queued behind it
    pending = pb.PendingDrill(id="r1", scenario=CAPACITY_PROBE, region="east", requested_at=2e3)
    assert progress_text(pb.DrillsResponse(pending=[pending]), "r1") == "queued"
    behind = progress_text(pb.DrillsResponse(pending=[pending], running=LOCK), "r1")
    assert behind.startswith("queued behind the drill running now: capacity-probe on east")
    running = progress_text(pb.DrillsResponse(running=LOCK), "r1")
    assert running.startswith("running: capacity-probe on east by drills-h-1 since ")
    assert running == progress_text(pb.DrillsResponse(running=LOCK), "r1")  # no ticking age
    step = "cold sustained step 4: 8.0 rps offered, p99 420 ms: elastic"
    at_step = progress_text(pb.DrillsResponse(running=LOCK, progress=step), "r1")
    assert at_step == f"{running}; {step}"  # the probe's latest step, as it publishes it
    # the service keeps a request queued until its run is recorded: a lock on the same
    # scenario and region taken since it was asked for is that request running
    asked = pb.PendingDrill(id="r1", scenario=CAPACITY_PROBE, region="east", requested_at=1.0)
    ours = progress_text(pb.DrillsResponse(pending=[asked], running=LOCK, progress=step), "r1")
    assert ours == at_step
    assert progress_text(pb.DrillsResponse(running="not json"), "r1") == "running: not json"


def test_t_recover_is_said_as_measured() -> None:
    assert recovery_text(3.25, 10.0) == "3.2 s"
    assert recovery_text(None, 10.0) == "did not recover within 10 s"
    assert recovery_text(None, None) == "not measured"


def test_the_report_says_not_measured_only_without_a_window() -> None:
    class Rec:  # the two fields recovery_text reads
        t_recover_s: float | None = None
        t_recover_window_s: float | None = None

    r = Rec()
    assert report_recovery(r) == "not measured"  # type: ignore[arg-type]
    r.t_recover_window_s = 10.0
    assert report_recovery(r) == "did not recover within 10 s"  # type: ignore[arg-type]
    r.t_recover_s = 1.5
    assert report_recovery(r) == "1.50 s"  # type: ignore[arg-type]


# ---- the CLI against a real control plane and etcd --------------------------------------


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"c{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


async def _catalog(topology: Topology, published_at: float) -> None:
    store = EtcdStore(topology.etcd)
    await store.connect()
    try:
        catalog = DrillCatalog(
            service="drills-h-1",
            published_at=published_at,
            scenarios=(ScenarioInfo(name=CAPACITY_PROBE),),
        )
        await store.put(Keys(topology.cluster).drill_catalog(), encode(catalog))
    finally:
        await store.close()


@pytest.mark.etcd
async def test_no_drill_service_exits_3_at_once_and_queues_nothing(topology: Topology) -> None:
    async with running_replica(topology) as run:
        # exit 3 (unreachable), not 1: a wait through --wait-s would end in 1 (refused)
        code, _, err = await ctl(run.target, "capacity", "probe", "east", "-r", "t")
        assert code == 3, err
        assert "no drill service is running" in err and "nothing was queued" in err
        # one that ran once and stopped: its catalog stays, old
        await _catalog(topology, time.time() - 3600)
        code, _, err = await ctl(run.target, "capacity", "probe", "east", "-r", "t")
        assert code == 3, err
        assert "drills-h-1 last published" in err and "python -m chaos" in err
        listed = await run.stub.ListDrills(pb.DrillsRequest())
        assert not listed.pending


@pytest.mark.etcd
async def test_json_lines_while_queued_then_exit_3_when_the_service_goes_silent(
    topology: Topology,
) -> None:
    async with running_replica(topology) as run:
        # A service that published just long enough ago to be judged alive, then never
        # again: the CLI queues, says so in a JSON line, and gives up when it goes silent.
        await _catalog(topology, time.time() - SERVICE_SILENT_S + 3)
        code, out, err = await ctl(
            run.target, "capacity", "probe", "east", "-r", "t", "--json", "--wait-s", "30"
        )
        assert code == 3, err
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert [x["state"] for x in lines] == ["queued", "service stopped"]
        assert lines[0]["request"] and "no drill service is running" in lines[1]["detail"]
