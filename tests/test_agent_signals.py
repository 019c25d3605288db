"""The agent's window signals end to end: a simulator under steady load, faults injected
through its admin endpoint, the agent's verdict and its reports to a (recording)
ControlPlane gRPC server. Asserts figures against injected faults, never wall-clock
timing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.procs import start_simulator, until
from controlplane.kernel.model import Health
from regions.agent.cli import parse_args
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from regions.agent.verdict import RegionVerdict
from tests.test_agent import control_plane

INJECTED_LATENCY_S = 1.5  # TTFT bucket (1.0, 2.5]: far above the threshold below
MAX_TTFT_P99_S = 1.0
MAX_ERROR_RATE = 0.2
PROMPT = "the region is healthy and traffic flows to the warm replicas " * 8  # full blocks


@asynccontextmanager
async def load(url: str, workers: int = 3) -> AsyncIterator[None]:
    """Steady traffic (the same prompt, so the prefix cache hits) until the block ends."""

    async def worker(http: aiohttp.ClientSession) -> None:
        while True:
            body = {"prompt": PROMPT, "max_tokens": 1}
            async with http.post(url + "/v1/completions", json=body) as r:
                await r.read()  # 200, or the injected 503
            await asyncio.sleep(0.05)  # a 503 is instant: do not spin

    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.create_task(worker(http)) for _ in range(workers)]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t


async def set_fault(http: aiohttp.ClientSession, url: str, **spec: float) -> None:
    method = http.post if spec else http.delete
    async with method(url + "/_sim/fault", json=spec or None) as r:
        assert r.status == 200, await r.text()


async def a_view(
    h: AgentHandle, holds: Callable[[RegionVerdict], bool], what: str
) -> RegionVerdict:
    """The first region view (one per probe round) for which ``holds`` is true."""
    seen: list[RegionVerdict] = []

    async def check() -> bool:
        if holds(h.view):
            seen.append(h.view)
        return bool(seen)

    await until(check, within=30, what=f"{what} (last view: {h.view.detail} {h.view.signals})")
    return seen[0]


@pytest.mark.slow
async def test_injected_latency_and_errors_move_the_signals_and_the_verdict() -> None:
    sim = start_simulator()
    try:
        cfg = AgentConfig(region="eu", replicas=(sim.url,), interval=0.5, timeout=0.5)
        # The thresholds reach the agent in the control plane's answers to its reports.
        thresholds = pb.RegionThresholds(
            ttft_p99_over_s=MAX_TTFT_P99_S, error_rate_over=MAX_ERROR_RATE
        )
        async with (
            control_plane(thresholds) as (cp, _, target),
            aiohttp.ClientSession() as http,
            load(sim.url),
        ):
            h = await serve_agent(cfg.model_copy(update={"control_planes": (target,)}))
            try:
                calm = await a_view(
                    h,
                    lambda v: "ttft_p99_s" in v.signals and "prefix_hit_rate" in v.signals,
                    "a window with requests",
                )
                assert calm.health is Health.HEALTHY, calm.detail
                # measured, and the verdict agrees with the threshold it was judged by
                assert calm.signals["ttft_p99_s"] > 0
                assert (calm.signals["ttft_p99_s"] <= MAX_TTFT_P99_S) == (
                    calm.health is Health.HEALTHY
                )
                assert calm.signals["error_rate"] == 0.0 and calm.signals["request_rate"] > 0
                assert calm.signals["prefix_hit_rate"] > 0  # the same prompt, again and again
                assert 0.0 <= calm.signals["kv_usage_max"] <= 1.0

                await set_fault(http, sim.url, added_latency_s=INJECTED_LATENCY_S)
                slow = await a_view(
                    h, lambda v: "ttft p99" in v.detail, "a DEGRADED view for latency"
                )
                assert slow.health is Health.DEGRADED
                assert slow.signals["ttft_p99_s"] > INJECTED_LATENCY_S

                await set_fault(http, sim.url, unavailable_rate=0.5)
                failing = await a_view(
                    h, lambda v: "error rate" in v.detail, "a DEGRADED view for 503s"
                )
                assert failing.health is Health.DEGRADED
                assert failing.signals["error_rate"] > MAX_ERROR_RATE

                await set_fault(http, sim.url)  # cleared
                await a_view(
                    h,
                    lambda v: v.health is Health.HEALTHY and v.signals.get("error_rate") == 0.0,
                    "a HEALTHY view once the faults are cleared",
                )

                async def reported() -> bool:
                    return any(
                        r.health == pb.HEALTH_DEGRADED and r.signals["error_rate"] > MAX_ERROR_RATE
                        for r in cp.reports
                        if "error_rate" in r.signals
                    )

                await until(reported, what="a DEGRADED report carrying the error rate")
            finally:
                await h.stop()
    finally:
        sim.kill()


@pytest.mark.parametrize("flag", ["--max-queue", "--max-ttft-p99", "--max-error-rate"])
def test_the_thresholds_are_no_flags_of_the_agent(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # They live in the topology (regions[].degraded_when), delivered by the control plane.
    base = ["--region", "eu", "--control-plane", "127.0.0.1:1", "--replica", "http://a"]
    with pytest.raises(SystemExit) as e:
        parse_args([*base, flag, "1"])
    assert e.value.code == 2 and flag in capsys.readouterr().err


def test_cli_takes_the_prewarm_settings(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--region", "eu", "--control-plane", "127.0.0.1:1", "--replica", "http://a"]
    cfg = parse_args([*base, "--prefill-tokens-per-s", "30000", "--prewarm-concurrency", "4"])
    assert (cfg.prewarm.prefill_tokens_per_s, cfg.prewarm.per_replica_concurrency) == (30000, 4)
    assert parse_args(base).prewarm.per_replica_concurrency == 2  # the default
    with pytest.raises(SystemExit) as e:
        parse_args([*base, "--prewarm-concurrency", "0"])
    assert e.value.code == 2 and "per_replica_concurrency" in capsys.readouterr().err
