"""``/metrics`` is rendered off the event loop, one render at a time (issue 35: at 512
regions a render takes seconds, and on the loop it stalled every request for it)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import aiohttp
import pytest

from controlplane.kernel.config import parse_topology
from controlplane.kernel.store.memory import MemoryStore
from regions.dataplane.scrape import OffLoopRender
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer

BOUND_S = 10.0  # only so that a broken test fails instead of hanging: never reached


class Blocked:
    """A render that waits for ``release`` (set by the test), in its thread."""

    def __init__(self, body: bytes = b"rendered") -> None:
        self.body = body
        self.rendering, self.release = threading.Event(), threading.Event()
        self.calls = 0

    def __call__(self) -> bytes:
        self.calls += 1
        self.rendering.set()
        if not self.release.wait(BOUND_S):
            raise RuntimeError("never released")
        return self.body


@pytest.fixture
def blocked() -> Iterator[Blocked]:
    b = Blocked()
    yield b
    b.release.set()  # a failed test leaves no thread behind


async def test_scrapes_during_a_render_share_it(blocked: Blocked) -> None:
    render = OffLoopRender(blocked)
    first = asyncio.create_task(render())
    second = asyncio.create_task(render())
    assert await asyncio.to_thread(blocked.rendering.wait, BOUND_S)
    third = asyncio.create_task(render())
    await asyncio.sleep(0)  # it has asked, during the render
    blocked.release.set()
    assert await asyncio.gather(first, second, third) == [b"rendered"] * 3
    assert blocked.calls == render.renders == 1
    blocked.release.set()
    assert await render() == b"rendered"  # the next scrape renders anew
    assert blocked.calls == 2


async def test_a_scraper_that_goes_away_leaves_the_others_their_answer(
    blocked: Blocked,
) -> None:
    render = OffLoopRender(blocked)
    gone, stays = asyncio.create_task(render()), asyncio.create_task(render())
    assert await asyncio.to_thread(blocked.rendering.wait, BOUND_S)
    gone.cancel()
    blocked.release.set()
    assert await stays == b"rendered"
    assert gone.cancelled()


async def test_a_failed_render_fails_its_scrapes_and_the_next_renders_again() -> None:
    calls = 0

    def render() -> bytes:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("collector broke")
        return b"ok"

    scrape = OffLoopRender(render)
    with pytest.raises(ValueError, match="collector broke"):
        await scrape()
    assert await scrape() == b"ok"


def _gateway() -> GatewayServer:
    topology = parse_topology(
        {
            "cluster": "t",
            "regions": [
                {
                    "name": name,
                    "zone": "us",
                    "agent": "127.0.0.1:9",
                    "capacity_rps": 10,
                    "replicas": ["http://127.0.0.1:9"],
                }
                for name in ("east", "west")
            ],
        }
    )
    options = GatewayOptions(
        topology=topology,
        app=AppConfig(home="east"),
        grace_s=0.1,
        replica_poll_s=0,
        prefix_tracking=False,
    )
    return GatewayServer(options, store=MemoryStore())


async def test_the_gateway_answers_requests_while_a_scrape_renders(blocked: Blocked) -> None:
    gw = _gateway()
    real = gw.metrics.render
    blocked.body = b""

    def render() -> bytes:
        blocked()
        return real()

    gw.metrics.render = render  # type: ignore[method-assign]
    await gw.start()
    try:
        async with aiohttp.ClientSession() as http:

            async def scrape() -> bytes:
                async with http.get(gw.url + "/metrics") as resp:
                    assert resp.status == 200
                    return await resp.read()

            scraping = asyncio.create_task(scrape())
            assert await asyncio.to_thread(blocked.rendering.wait, BOUND_S)
            async with http.get(gw.url + "/health") as resp:
                assert resp.status == 200  # answered while the render is blocked
            assert not scraping.done()
            blocked.release.set()
            body = await scraping
        assert b"tectonic_gateway_requests_total" in body
    finally:
        blocked.release.set()
        await gw.stop()
