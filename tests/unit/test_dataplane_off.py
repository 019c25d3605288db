"""A data plane's parts that a setting turns off are explicit stand-ins, never None,
and the core says once, at start, which are off and why (``regions/dataplane/off.py``)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from controlplane.kernel.config import parse_topology
from controlplane.kernel.store.memory import MemoryStore
from regions.dataplane.admission_gate import AdmissionGates, AdmissionOff, AdmissionOptions
from regions.dataplane.capacity_bounds import CapacityBounds
from regions.dataplane.core import DataPlaneCore
from regions.dataplane.observe import NoopObserver, TrackerObserver
from regions.dataplane.off import CapacityOff, ExportOff, Off, ReportsOff
from regions.dataplane.options import DataPlaneOptions, RequestConfig
from regions.dataplane.prefix_export import PrefixExporter
from regions.dataplane.replica_load import ReplicaLoadPoller
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.report import HealthReporter

LOG = "tectonic.gateway"


def _options(**more: object) -> DataPlaneOptions:
    topology = parse_topology(
        {
            "cluster": "t",
            "regions": [
                {
                    "name": "east",
                    "zone": "us",
                    "agent": "127.0.0.1:9",
                    "capacity_rps": 10,
                    "replicas": ["http://127.0.0.1:8001"],
                }
            ],
        }
    )
    return DataPlaneOptions(topology=topology, app=RequestConfig(home="east"), **more)


def _off_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if ": off: " in r.getMessage()]


# async, though nothing is awaited: the core makes asyncio parts, which want the running
# loop (a sync test finds none once another test has closed the main thread's)
async def test_every_part_off_is_a_stand_in_named_once_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = _options(replica_poll_s=0, prefix_tracking=False)
    with caplog.at_level(logging.INFO, LOG):
        core = DataPlaneCore(options, store=MemoryStore(), kind="picker")
    assert isinstance(core.replica_load, Off)
    assert isinstance(core.admission, AdmissionOff)
    assert isinstance(core.capacity, CapacityOff)
    assert isinstance(core.reporter, ReportsOff)
    assert isinstance(core.exporter, ExportOff)
    assert isinstance(core.observer, NoopObserver)
    assert core.tracker is None
    [line] = _off_lines(caplog)
    assert line.startswith("picker: off: ")
    for part in (
        "replica load polling",
        "admission control (--admission not given)",
        "the capacity/ watch",
        "health reports (no --control-plane given)",
        "prefix tracking (--no-prefix-tracking",
    ):
        assert part in line, line


async def test_a_core_with_every_part_on_says_nothing_is_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = _options(control_planes=("127.0.0.1:9",), admission=AdmissionOptions(enabled=True))
    with caplog.at_level(logging.INFO, LOG):
        core = DataPlaneCore(options, store=MemoryStore())
    assert isinstance(core.replica_load, ReplicaLoadPoller)
    assert isinstance(core.admission, AdmissionGates)
    assert isinstance(core.capacity, CapacityBounds)
    assert isinstance(core.reporter, HealthReporter)
    assert isinstance(core.exporter, PrefixExporter)
    assert isinstance(core.observer, TrackerObserver)
    assert _off_lines(caplog) == []


async def test_the_operators_bound_turns_the_capacity_watch_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admission = AdmissionOptions(enabled=True, max_inflight=6)
    with caplog.at_level(logging.INFO, LOG):
        core = DataPlaneCore(_options(admission=admission), store=MemoryStore())
    assert isinstance(core.admission, AdmissionGates)
    assert isinstance(core.capacity, CapacityOff)
    [line] = _off_lines(caplog)
    assert "the capacity/ watch (--admission-max-inflight bounds each replica at 6)" in line


async def test_a_callers_observer_leaves_the_export_off() -> None:
    observer = NoopObserver()
    core = DataPlaneCore(_options(), store=MemoryStore(), observer=observer)
    assert core.observer is observer
    assert isinstance(core.exporter, ExportOff)


async def test_parts_that_are_off_run_nothing_and_answer_nothing() -> None:
    options = _options(replica_poll_s=0, prefix_tracking=False)
    core = DataPlaneCore(options, store=MemoryStore())
    core.name("gateway:east:1", "gateway:east:host:1")
    assert core.reporter.observer == "gateway:east:1"
    assert core.exporter.gateway_id == core.moves.gateway_id == "gateway:east:host:1"
    core.reporter.record("east", False, 503)
    balancer = ReplicaBalancer(("http://127.0.0.1:8001",))
    entered = await core.admission.enter("east", {}, balancer, 1, "http://127.0.0.1:8001", set(), 0)
    assert entered is None  # let through at once, as a region no gate covers
    supervisor = asyncio.create_task(core.supervise())
    await asyncio.wait_for(core.loaded(), 5)
    assert not supervisor.done()  # the watches run on; the parts that are off ended
    supervisor.cancel()
    await asyncio.wait({supervisor})
    await core.close()
