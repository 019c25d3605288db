"""``/metrics`` rendered off the event loop, one render at a time.

At 512 regions a data plane's exposition is tens of thousands of samples: rendered on
the event loop, every request waits for the whole scrape (2.5 s at 14 MB, issue 35).
``OffLoopRender`` runs the render in a worker thread (``asyncio.to_thread``: the
registry's metrics lock their own values, so counting goes on meanwhile), and a
scrape that arrives while one renders shares that render's answer instead of starting
another: scrapers (Prometheus, a second one, a person with curl) never pile renders
up, and what they get is at most one render old.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class OffLoopRender:
    """Awaits ``render()`` in a thread; concurrent callers share one call."""

    def __init__(self, render: Callable[[], bytes]) -> None:
        self._render = render
        self._running: asyncio.Future[bytes] | None = None
        self.renders = 0  # calls of ``render`` so far

    async def __call__(self) -> bytes:
        running = self._running
        if running is None:
            self.renders += 1
            running = self._running = asyncio.ensure_future(asyncio.to_thread(self._render))
            running.add_done_callback(self._done)
        # shielded: a scraper that goes away must not cancel the others' answer
        return await asyncio.shield(running)

    def _done(self, running: asyncio.Future[bytes]) -> None:
        self._running = None
        if not running.cancelled():
            running.exception()  # retrieved here too: every waiter may have gone
