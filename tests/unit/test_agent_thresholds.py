"""The agent adopts the DEGRADED thresholds a control plane answers its reports with
(regions/agent/server.py): none before the first answer, each change said once, and
an out-of-bounds answer refused with the ones in effect kept."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.kernel.config import DegradedWhen
from controlplane.kernel.model import Health
from regions.agent.server import AgentConfig, AgentHandle, serve_agent


def adopted(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "thresholds from" in r.getMessage()]


async def test_the_agent_judges_by_the_last_thresholds_it_was_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tectonic.agent")
    h = AgentHandle(AgentConfig(region="eu", replicas=("http://127.0.0.1:1",)))
    try:
        assert h.thresholds is None  # before any answer: none judged
        five = pb.RegionThresholds(ttft_p99_over_s=5, error_rate_over=0.05)
        h._adopt(five)
        h._adopt(five)  # the same again: no news
        assert h.thresholds == DegradedWhen(ttft_p99_over_s=5, error_rate_over=0.05)
        h._adopt(pb.RegionThresholds(error_rate_over=2.0))  # cannot fire: refused
        assert h.thresholds == DegradedWhen(ttft_p99_over_s=5, error_rate_over=0.05)
        h._adopt(pb.RegionThresholds())  # the topology dropped them
        assert h.thresholds == DegradedWhen()
    finally:
        await h.stop(grace=0)
    first, refused, dropped = adopted(caplog)
    assert first == "thresholds from the control plane: ttft p99 over 5s, error rate over 5%"
    assert refused.startswith("thresholds from the control plane refused, keeping the last")
    assert "error_rate_over" in refused
    assert dropped == "thresholds from the control plane: none"


async def test_the_next_probe_round_judges_by_them() -> None:
    # One vLLM stand-in with three requests waiting: HEALTHY with no thresholds,
    # DEGRADED once the control plane says a queue over 2 is.
    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting 3\nvllm:num_requests_running 1\n")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    h = await serve_agent(AgentConfig(region="eu", replicas=(f"http://127.0.0.1:{port}",)))
    try:
        assert h.view.health is Health.HEALTHY and h.view.signals["queue_depth"] == 3
        h._adopt(pb.RegionThresholds(queue_over=2))
        await h._tick()
        assert h.view.health is Health.DEGRADED and "queue 3 > 2" in h.view.detail
    finally:
        await h.stop(grace=0)
        await runner.cleanup()
