"""The region agent: the pure fold, then the real thing against simulator processes and
a real (recording) ControlPlane gRPC server."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import given
from hypothesis import strategies as st
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.lab.procs import start_agent, start_simulator, start_simulators, until
from controlplane.kernel.model import Health
from controlplane.kernel.vllm.metrics import parse_gauges
from regions.agent.probe_vllm import ReplicaProbe
from regions.agent.server import SERVICE, AgentConfig, AgentHandle, serve_agent
from regions.agent.verdict import fold_verdict
from regions.pool.processes import free_port

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def up(url: str, waiting: float = 0, running: float = 0) -> ReplicaProbe:
    return ReplicaProbe(url=url, up=True, waiting=waiting, running=running)


def down(url: str, reason: str = "connection refused") -> ReplicaProbe:
    return ReplicaProbe(url=url, up=False, reason=reason)


# ---- the pure fold ------------------------------------------------------------------


def test_fold_all_up_is_healthy_and_sums_signals() -> None:
    view = fold_verdict("eu", [up("http://a", 2, 3), up("http://b", 1, 4)])
    assert view.health is Health.HEALTHY
    assert view.signals == {"replicas_up": 2, "replicas_total": 2, "queue_depth": 3, "running": 7}
    assert view.detail == "2/2 replicas up"


def test_fold_some_down_is_degraded_and_says_why() -> None:
    view = fold_verdict("eu", [up("http://a"), down("http://b")])
    assert view.health is Health.DEGRADED
    assert view.signals["replicas_up"] == 1
    assert "http://b down (connection refused)" in view.detail


def test_fold_none_up_is_unhealthy() -> None:
    view = fold_verdict("eu", [down("http://a"), down("http://b", "timeout after 0.5s")])
    assert view.health is Health.UNHEALTHY
    assert view.signals == {"replicas_up": 0, "replicas_total": 2, "queue_depth": 0, "running": 0}
    assert view.detail.startswith("0/2 replicas up")


def test_fold_queue_over_bound_is_degraded() -> None:
    probes = [up("http://a", waiting=3), up("http://b", waiting=2)]
    assert fold_verdict("eu", probes, max_queue=5).health is Health.HEALTHY
    view = fold_verdict("eu", probes, max_queue=4)
    assert view.health is Health.DEGRADED and "queue 5 > 4" in view.detail


def test_fold_ignores_queue_of_down_replicas_and_missing_metrics() -> None:
    probes = [
        ReplicaProbe(url="http://a", up=True, reason="metrics unavailable (HTTP 500)"),
        ReplicaProbe(url="http://b", up=False, reason="HTTP 503", waiting=99),
    ]
    view = fold_verdict("eu", probes, max_queue=0)
    assert view.health is Health.DEGRADED and view.signals["queue_depth"] == 0


@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 50)), min_size=1, max_size=8),
    st.none() | st.integers(0, 100),
)
def test_fold_properties(states: list[tuple[bool, int]], max_queue: int | None) -> None:
    probes = [
        ReplicaProbe(url=f"http://r{i}", up=ok, waiting=w) for i, (ok, w) in enumerate(states)
    ]
    view = fold_verdict("eu", probes, max_queue)
    n_up = sum(ok for ok, _ in states)
    queue = sum(w for ok, w in states if ok)
    assert (view.health is Health.UNHEALTHY) == (n_up == 0)
    within = max_queue is None or queue <= max_queue
    assert (view.health is Health.HEALTHY) == (n_up == len(states) and within)
    assert view.signals["replicas_up"] == n_up and view.signals["queue_depth"] == queue
    assert len(view.detail) <= 1024


def test_parse_gauges_sums_label_sets() -> None:
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0\n'
        "vllm:num_requests_waiting_other 7\n"
        "vllm:num_requests_running 1e+00\n"
    )
    got = parse_gauges(text, frozenset({"vllm:num_requests_waiting", "vllm:num_requests_running"}))
    assert got == {"vllm:num_requests_waiting": 5.0, "vllm:num_requests_running": 1.0}


def test_config_rejects_timeout_longer_than_interval() -> None:
    with pytest.raises(ValueError, match="must not exceed interval"):
        AgentConfig(region="eu", replicas=("http://a",), interval=0.5, timeout=1.0)


# ---- a real ControlPlane server that records reports ------------------------------


class RecordingControlPlane(pb_grpc.ControlPlaneServicer):
    """Records each report and answers, as the control plane does, with the region's
    DEGRADED thresholds (``thresholds``; None: a region without any)."""

    def __init__(self, thresholds: pb.RegionThresholds | None = None) -> None:
        self.reports: list[pb.HealthReport] = []
        self.thresholds = thresholds

    async def ReportHealth(
        self, request: pb.HealthReport, context: grpc.aio.ServicerContext
    ) -> pb.ReportHealthResponse:
        self.reports.append(request)
        return pb.ReportHealthResponse(accepted=True, thresholds=self.thresholds)


@asynccontextmanager
async def control_plane(
    thresholds: pb.RegionThresholds | None = None,
) -> AsyncIterator[tuple[RecordingControlPlane, grpc.aio.Server, str]]:
    servicer = RecordingControlPlane(thresholds)
    server = grpc.aio.server()
    pb_grpc.add_ControlPlaneServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, server, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@asynccontextmanager
async def agent(**kw: object) -> AsyncIterator[AgentHandle]:
    cfg = AgentConfig.model_validate({"region": "eu", "interval": 0.25, "timeout": 0.25, **kw})
    handle = await serve_agent(cfg)
    try:
        yield handle
    finally:
        await handle.stop()


async def check(port: int, service: str = "") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(resp.status)


async def view_is(
    handle: AgentHandle, health: Health, extra: Callable[[], bool] = lambda: True
) -> None:
    async def holds() -> bool:
        return handle.view.health is health and extra()

    await until(holds, what=f"region view {health.value} ({handle.view.detail})")


async def reported(cp: RecordingControlPlane, health: int, replicas_up: float) -> None:
    async def holds() -> bool:
        return any(
            r.health == health and r.signals["replicas_up"] == replicas_up for r in cp.reports
        )

    await until(holds, what=f"a report with health {health} and {replicas_up} replicas up")


# ---- the agent against real simulators ---------------------------------------------


@pytest.mark.slow
async def test_agent_follows_replicas_and_serves_health(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tectonic.agent")
    a, b = start_simulators(2)
    try:
        async with (
            control_plane() as (cp, _, target),
            agent(control_planes=(target,), replicas=(a.url, b.url)) as h,
        ):
            assert h.view.health is Health.HEALTHY  # probed before serving
            await reported(cp, pb.HEALTHY, 2)
            first = cp.reports[0]
            assert first.kind == pb.AGENT and first.region == "eu"
            assert first.observer == "agent:eu"
            # the window signals (tests/test_agent_signals.py) come on top when known
            assert {"replicas_up", "replicas_total", "queue_depth", "running"} <= set(first.signals)
            assert await check(h.port) == SERVING and await check(h.port, SERVICE) == SERVING

            a.kill()
            await view_is(h, Health.DEGRADED, lambda: h.view.signals["replicas_up"] == 1)
            await reported(cp, pb.HEALTH_DEGRADED, 1)
            assert f"{a.url} down (connection refused)" in h.view.detail
            assert await check(h.port) == SERVING

            b.kill()
            await view_is(h, Health.UNHEALTHY)
            await reported(cp, pb.UNHEALTHY, 0)
            assert h.thresholds is not None and h.thresholds.describe() == "none"
            assert await check(h.port) == NOT_SERVING
            assert await check(h.port, SERVICE) == NOT_SERVING

            a = start_simulator(port=a.port)  # the replica comes back on its address
            await view_is(h, Health.DEGRADED, lambda: h.view.signals["replicas_up"] == 1)
            assert await check(h.port, SERVICE) == SERVING
    finally:
        a.kill()
        b.kill()
    story = caplog.text
    assert f"replica {b.url} down (connection refused)" in story
    assert "region view DEGRADED -> UNHEALTHY (0/2 replicas up" in story
    assert f"replica {a.url} up" in story


@pytest.mark.slow
async def test_reports_skip_a_dead_control_plane() -> None:
    sim = start_simulator()
    try:
        async with control_plane() as (cp1, server1, t1), control_plane() as (cp2, _, t2):
            dead = f"127.0.0.1:{free_port()}"
            async with agent(control_planes=(dead, t1, t2), replicas=(sim.url,)) as h:
                await reported(cp1, pb.HEALTHY, 1)
                assert h.report_target == t1 and not cp2.reports
                await server1.stop(0)  # the first live one goes away too
                await reported(cp2, pb.HEALTHY, 1)
                assert h.report_target == t2
    finally:
        sim.kill()


@pytest.mark.slow
async def test_an_agent_started_before_its_control_planes_waits_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The usual start order (a lab, a rollout): the agent probes and serves its
    health, and says once, at INFO, that it waits for a control plane. A wait past the
    start-up grace, or an outage after a report was taken, is the warning
    (tests/unit/test_health_report.py, on a fake clock)."""
    caplog.set_level(logging.INFO, logger="tectonic.agent")
    sim = start_simulator()
    dead = (f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
    try:
        async with agent(control_planes=dead, replicas=(sim.url,)) as h:
            ticks = h.ticks

            async def three_more_ticks() -> bool:
                return h.ticks >= ticks + 3

            await until(three_more_ticks, what="three probe ticks")
            assert h.view.health is Health.HEALTHY and h.reports_sent == 0
            assert await check(h.port) == SERVING
    finally:
        sim.kill()
    lines = [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "tectonic.agent"
        and ("no control plane took" in r.getMessage() or "control plane to take" in r.getMessage())
    ]
    assert lines == [
        (logging.INFO, f"waiting for a control plane to take the report ({', '.join(dead)})")
    ]


@pytest.mark.slow
async def test_queue_over_bound_degrades_the_region(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tectonic.agent")
    sim = start_simulator(extra_args=["--max-num-seqs", "1"])
    try:
        async with (
            # The bound comes from the control plane's answer, not from the agent.
            control_plane(pb.RegionThresholds(queue_over=1)) as (cp, _, target),
            agent(control_planes=(target,), replicas=(sim.url,)) as h,
            aiohttp.ClientSession() as http,
        ):
            await reported(cp, pb.HEALTHY, 1)
            async with http.post(sim.url + "/sleep?level=1") as r:
                assert r.status == 200
            reqs = [
                asyncio.create_task(
                    http.post(sim.url + "/v1/completions", json={"prompt": "q", "max_tokens": 1})
                )
                for _ in range(2)
            ]
            await view_is(h, Health.DEGRADED)
            assert h.view.signals["queue_depth"] == 2 and "queue 2 > 1" in h.view.detail
            await reported(cp, pb.HEALTH_DEGRADED, 1)
            async with http.post(sim.url + "/wake_up") as r:
                assert r.status == 200
            for resp in await asyncio.gather(*reqs):
                assert resp.status == 200
                resp.release()
            await view_is(h, Health.HEALTHY)
    finally:
        sim.kill()
    adopted = [r for r in caplog.records if "thresholds from the control plane" in r.message]
    assert [r.message for r in adopted] == ["thresholds from the control plane: queue over 1"]


@pytest.mark.slow
async def test_agent_process_cli_and_sigterm() -> None:
    sims = start_simulators(2)
    try:
        async with control_plane() as (cp, _, target):
            dead = f"127.0.0.1:{free_port()}"
            proc = await asyncio.to_thread(
                start_agent,
                region="us",
                control_planes=(dead, target),
                replicas=(sims[0].url, sims[1].url),
            )
            try:
                await reported(cp, pb.HEALTHY, 2)
                assert {r.observer for r in cp.reports} == {"agent:us"}
                assert await check(proc.port) == SERVING
                assert "grpc.health.v1.Health" in await _reflected_services(proc.port)
                sims[0].kill()
                await reported(cp, pb.HEALTH_DEGRADED, 1)
                proc.popen.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(proc.popen.wait, 20) == 0
            finally:
                proc.kill()
            log = proc.log()
            assert f"replica {sims[0].url} down (connection refused)" in log
            assert "region view HEALTHY -> DEGRADED (1/2 replicas up" in log
            assert "signal received; shutting down" in log
    finally:
        for s in sims:
            s.kill()


async def _reflected_services(port: int) -> set[str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        async for resp in stub.ServerReflectionInfo(iter([req]), timeout=5):
            return {s.name for s in resp.list_services_response.service}
    return set()
