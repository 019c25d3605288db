"""The replica-load poller sized to what it can poll (issue 35): at most
``concurrency`` replicas asked at once, rounds that never overlap, and a period that
stretches when a round overruns its interval."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from regions.dataplane.replica_load import MAX_STRETCH, MIN_REST, ReplicaLoadPoller
from regions.dataplane.replicas import ReplicaBalancer

PAGE = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0"} 2.0\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{engine="0"} 0.0\n'
)


class Replicas:
    """Many replicas behind one server (``/<name>/metrics``), each held until as many
    as the poller may ask at once are waiting: a poller that asked more at once would
    be seen doing so, one that asked fewer would never be released (the test's bound)."""

    def __init__(self, at_once: int) -> None:
        self.at_once = at_once
        self.inflight = self.most = self.answered = 0
        self.full = asyncio.Event()

    async def page(self, _: web.Request) -> web.Response:
        self.inflight += 1
        self.most = max(self.most, self.inflight)
        if self.inflight >= self.at_once:
            self.full.set()
        try:
            await asyncio.wait_for(self.full.wait(), 10)
        finally:
            self.inflight -= 1
        self.answered += 1
        return web.Response(text=PAGE)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Replicas]]:
    replicas = Replicas(at_once=3)
    app = web.Application()
    app.router.add_get("/{name}/metrics", replicas.page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", replicas
    await runner.cleanup()


async def test_no_more_than_concurrency_replicas_are_asked_at_once(
    server: tuple[str, Replicas],
) -> None:
    url, replicas = server
    balancers = {
        region: ReplicaBalancer([f"{url}/{region}-{i}" for i in range(5)])
        for region in ("east", "west")
    }
    poller = ReplicaLoadPoller(balancers, concurrency=3, timeout_s=30)
    async with aiohttp.ClientSession() as http:
        await poller.poll(http)
    assert replicas.answered == 10  # every replica of every region, in one round
    assert replicas.most == 3


async def test_rounds_never_overlap_and_rest_between() -> None:
    events: list[str] = []

    class Recording(ReplicaLoadPoller):
        async def poll(self, http: aiohttp.ClientSession) -> None:
            events.append("start")
            await asyncio.sleep(0)  # others may run meanwhile: no second round must
            events.append("end")
            if events.count("end") == 3:
                raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await Recording({}, interval_s=0.001).run()
    assert events == ["start", "end"] * 3


def test_a_round_that_overruns_stretches_the_period() -> None:
    poller = ReplicaLoadPoller({}, interval_s=2.0)
    assert poller.rest_s(0.5) == 1.5  # the period stays 2 s
    assert poller.rest_s(5.0) == 2.0 * MIN_REST  # 5.5 s: as often as it can, not back to back


def test_a_round_that_costs_more_than_its_cpu_share_stretches_the_period() -> None:
    poller = ReplicaLoadPoller({}, interval_s=1.0, cpu_share=0.1)
    assert poller.rest_s(0.05, cpu_s=0.05) == pytest.approx(0.95)  # 5 %: 1 s period
    assert poller.rest_s(0.4, cpu_s=0.3) == pytest.approx(2.6)  # a 3 s period: 10 %
    # a loop busy with requests: its CPU counts too, the period stops at 10 intervals
    assert poller.rest_s(2.0, cpu_s=2.0) == pytest.approx(1.0 * MAX_STRETCH - 2.0)


def test_a_round_that_fits_is_not_called_an_overrun(caplog: pytest.LogCaptureFixture) -> None:
    poller = ReplicaLoadPoller({}, interval_s=1.0)
    with caplog.at_level(logging.INFO, logger="tectonic.gateway"):
        for round_s in (0.3, 0.7, 0.1, 0.75):  # each leaves its quarter-interval rest
            poller.round_s, poller.round_cpu_s = round_s, round_s * 0.1
            poller._say_if_overran()
    assert caplog.records == []


def test_an_overrun_is_logged_once_and_its_end_too(caplog: pytest.LogCaptureFixture) -> None:
    poller = ReplicaLoadPoller({"east": ReplicaBalancer(["http://r:1"])}, interval_s=1.0)
    with caplog.at_level(logging.INFO, logger="tectonic.gateway"):
        for round_s in (3.0, 3.0, 0.1):
            poller.round_s, poller.round_cpu_s = round_s, 0.01
            poller._say_if_overran()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert "took 3.00 s (0.01 s of CPU), more than its 1.00 s interval allows" in said[0]
    assert "(1 replicas, 100 at once, at most 10% of a core)" in said[0]
    assert "every 3.25 s" in said[0]
    assert "fit their 1.00 s interval again" in said[1]


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="concurrency must be at least 1, not 0"):
        ReplicaLoadPoller({}, concurrency=0)
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match=f"cpu_share must be in \\(0, 1\\], not {share}"):
            ReplicaLoadPoller({}, cpu_share=share)
