"""The kernel's health-report client against real ControlPlane gRPC servers on 127.0.0.1
(each one accepting, refusing or gone), and the one Health <-> protobuf map."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from controlplane.api import convert, grpc_service
from controlplane.api.grpc_service import ControlPlaneService
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.config import DegradedWhen, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Health
from controlplane.kernel.rpc.health_report import (
    HEALTH_TO_PB,
    HealthReportClient,
    health_from_pb,
    health_to_pb,
    thresholds_from_pb,
    thresholds_to_pb,
)
from controlplane.kernel.store.memory import MemoryStore
from regions.pool.processes import free_port

LOG = logging.getLogger("tectonic.test.report")


class Recorder(pb_grpc.ControlPlaneServicer):
    def __init__(self, accept: bool) -> None:
        self.accept = accept
        self.reports: list[pb.HealthReport] = []
        self.tokens: list[str] = []

    async def ReportHealth(
        self, request: pb.HealthReport, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ReportHealthResponse:
        self.reports.append(request)
        md = dict(context.invocation_metadata() or ())
        self.tokens.append(str(md.get("authorization", "")))
        return pb.ReportHealthResponse(accepted=self.accept)


@asynccontextmanager
async def control_plane(
    accept: bool = True,
) -> AsyncIterator[tuple[Recorder, grpc.aio.Server, str]]:
    recorder = Recorder(accept)
    server = grpc.aio.server()
    pb_grpc.add_ControlPlaneServicer_to_server(recorder, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield recorder, server, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


def report(health: Health = Health.HEALTHY) -> pb.HealthReport:
    return pb.HealthReport(
        region="eu", observer="test:eu", kind=pb.AGENT, health=health_to_pb(health)
    )


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOG.name and r.levelno == logging.WARNING
    ]


# ---- the map ----------------------------------------------------------------------------


def test_every_health_maps_to_its_own_enum_value_and_back() -> None:
    assert set(HEALTH_TO_PB) == set(Health)
    assert len(set(HEALTH_TO_PB.values())) == len(Health)
    for h in Health:
        assert health_from_pb(health_to_pb(h)) is h
    assert health_to_pb(Health.DEGRADED) == pb.HEALTH_DEGRADED
    assert health_from_pb(999) is None


def test_the_control_planes_api_reads_health_with_the_same_map() -> None:
    assert convert.health_to_pb is health_to_pb
    assert grpc_service.health_from_pb is health_from_pb


# ---- the client -------------------------------------------------------------------------


async def test_reports_go_to_the_first_live_endpoint_and_stay_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    dead = f"127.0.0.1:{free_port()}"
    async with control_plane() as (cp1, server1, t1), control_plane() as (cp2, _, t2):
        client = HealthReportClient((dead, t1, t2), None, log=LOG, timeout_s=1.0)
        try:
            assert client.target is None
            assert await client.send(report()) and client.target == t1
            assert await client.send(report(Health.DEGRADED)) and client.target == t1
            # The one that took the last report is asked first: no second try of `dead`.
            assert [r.health for r in cp1.reports] == [pb.HEALTHY, pb.HEALTH_DEGRADED]
            assert not cp2.reports
            await server1.stop(0)
            assert await client.send(report()) and client.target == t2
            assert len(cp2.reports) == 1
        finally:
            await client.close()
    moves = [
        r.getMessage() for r in caplog.records if "reporting to control plane" in r.getMessage()
    ]
    assert moves == [f"reporting to control plane {t2}"]  # the first target is no news
    assert not warnings(caplog)


async def test_a_refusing_endpoint_is_skipped() -> None:
    async with control_plane(accept=False) as (no, _, t1), control_plane() as (yes, _, t2):
        client = HealthReportClient((t1, t2), None, log=LOG, timeout_s=1.0)
        try:
            assert await client.send(report()) and client.target == t2
            assert len(no.reports) == 1 and len(yes.reports) == 1
        finally:
            await client.close()


async def test_no_taker_is_one_warning_per_period_naming_each_endpoint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    dead = f"127.0.0.1:{free_port()}"
    async with control_plane(accept=False) as (_, _, refusing):
        client = HealthReportClient(
            (dead, refusing),
            None,
            log=LOG,
            timeout_s=1.0,
            warn_every_s=30.0,
            startup_grace_s=0.0,  # the throttle alone (the grace: the tests below)
            now=clock.now,
        )
        try:
            assert not await client.send(report())
            clock.advance(10)
            assert not await client.send(report())
            assert len(warnings(caplog)) == 1
            clock.advance(20)
            assert not await client.send(report())
            assert client.target is None
        finally:
            await client.close()
    got = warnings(caplog)
    assert len(got) == 2
    assert got[0].startswith("no control plane took the report (")
    assert f"{dead}: UNAVAILABLE" in got[0] and f"{refusing}: report not accepted" in got[0]


def levels(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOG.name]


async def test_before_any_control_plane_is_up_the_reporter_waits_quietly_then_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Agents and gateways start before the control plane: the first misses are one
    INFO line (and DEBUG each), not warnings; still missing after the grace is one."""
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    clock = FakeClock()
    async with control_plane(accept=False) as (_, _, refusing):
        client = HealthReportClient(
            (refusing,), None, log=LOG, timeout_s=1.0, startup_grace_s=30.0, now=clock.now
        )
        try:
            for _ in range(4):  # 0, 9, 18, 27 s: within the grace
                assert not await client.send(report())
                clock.advance(9)
            assert warnings(caplog) == []
            info = [m for lvl, m in levels(caplog) if lvl == logging.INFO]
            assert info == [f"waiting for a control plane to take the report ({refusing})"]
            debug = [m for lvl, m in levels(caplog) if lvl == logging.DEBUG]
            assert (
                debug
                == [f"still waiting for a control plane ({refusing}: report not accepted)"] * 4
            )
            assert not await client.send(report())  # 36 s: past it, and nothing took one
        finally:
            await client.close()
    assert warnings(caplog) == [
        f"no control plane took the report ({refusing}: report not accepted)"
    ]


async def test_once_a_report_was_taken_a_miss_warns_at_once_even_within_the_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    clock = FakeClock()
    async with control_plane(accept=False) as (cp, _, target):
        client = HealthReportClient(
            (target,), None, log=LOG, timeout_s=1.0, what="probe's", now=clock.now
        )
        try:
            assert not await client.send(report())  # the start: the control plane not ready
            cp.accept = True
            assert await client.send(report()) and client.target == target
            cp.accept = False
            clock.advance(1)  # well within the 30 s grace: an outage all the same
            assert not await client.send(report())
            cp.accept = True
            assert await client.send(report()) and client.target == target
        finally:
            await client.close()
    assert levels(caplog) == [
        (logging.INFO, f"waiting for a control plane to take the probe's ({target})"),
        (logging.INFO, f"reporting to control plane {target}"),
        (logging.WARNING, f"no control plane took the probe's ({target}: report not accepted)"),
        (logging.INFO, f"reporting to control plane {target}"),
    ]


async def test_the_processes_token_goes_with_each_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TECTONIC_TOKEN", "tct_test_token")
    async with control_plane() as (cp, _, target):
        client = HealthReportClient((target,), None, log=LOG, timeout_s=1.0)
        try:
            assert await client.send(report())
        finally:
            await client.close()
    assert cp.tokens == ["Bearer tct_test_token"]


# ---- the thresholds in the answer -------------------------------------------------------


def test_thresholds_cross_the_wire_and_an_unset_one_stays_unset() -> None:
    when = DegradedWhen(queue_over=0, error_rate_over=0.05)
    msg = thresholds_to_pb(when)
    assert msg.HasField("queue_over") and not msg.HasField("ttft_p99_over_s")
    assert thresholds_from_pb(msg) == when
    assert thresholds_from_pb(pb.RegionThresholds()) == DegradedWhen()
    with pytest.raises(ValueError, match="error_rate_over"):
        thresholds_from_pb(pb.RegionThresholds(error_rate_over=1.5))


async def test_the_control_plane_answers_a_report_with_the_regions_thresholds() -> None:
    regions = [
        {"name": "eu", "zone": "eu", "agent": "127.0.0.1:1", "capacity_rps": 1},
        {"name": "us", "zone": "us", "agent": "127.0.0.1:2", "capacity_rps": 1},
    ]
    regions[0]["degraded_when"] = {"ttft_p99_over_s": 5, "error_rate_over": 0.05}
    topology = parse_topology({"cluster": "t", "regions": regions})
    store, keys = MemoryStore(), Keys("t")
    service = ControlPlaneService(store, keys, topology, FakeClock(100.0), "cp-1", lambda: True)
    server = grpc.aio.server()
    pb_grpc.add_ControlPlaneServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = HealthReportClient((f"127.0.0.1:{port}",), None, log=LOG, timeout_s=5.0)
    try:
        resp = await client.send(report())
        assert resp is not None and resp.accepted
        got = thresholds_from_pb(resp.thresholds)
        assert got == DegradedWhen(ttft_p99_over_s=5, error_rate_over=0.05)
        assert got.describe() == "ttft p99 over 5s, error rate over 5%"
        other = pb.HealthReport(region="us", observer="agent:us", kind=pb.AGENT, health=pb.HEALTHY)
        resp = await client.send(other)
        assert resp is not None and thresholds_from_pb(resp.thresholds) == DegradedWhen()
        assert await store.get(keys.report("eu", "test:eu")) is not None  # stored as before
    finally:
        await client.close()
        await server.stop(0)
