"""The capacity probe's reads of its replicas' ``/metrics`` between steps: is each one
idle (a step starts from an empty queue, so the probe waits for it to drain, timed),
has it restarted (its start time moved: every figure since is another server's), and
what its prefix-cache counters say (the hit rate, :mod:`chaos.capacity.prefix_cache`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from chaos.capacity.prefix_cache import Scrape, prefix_caching
from chaos.capacity.verdicts import AbortCause, Phase, ProbeAborted
from controlplane.kernel.vllm.metrics import RUNNING, WAITING, parse_metrics


@dataclass
class ReplicaWatch:
    """Scrapes the probed replicas; every surprise is a :class:`ProbeAborted`."""

    http: aiohttp.ClientSession
    drain_timeout_s: float
    poll_s: float
    # each replica's start time at its first scrape: a later one that differs restarted
    _since: dict[str, float | None] = field(default_factory=dict)

    async def scrape(self, url: str) -> Scrape:
        try:
            async with self.http.get(url + "/metrics") as r:
                if r.status != 200:
                    raise ProbeAborted(
                        AbortCause.UNREADABLE, None, f"{url}/metrics answered {r.status}"
                    )
                text = await r.text()
            gauges, metrics = parse_metrics(text, time.monotonic())
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise ProbeAborted(AbortCause.UNREADABLE, None, f"{url}/metrics: {e}") from e
        known = self._since.setdefault(url, metrics.since)
        if metrics.since is not None and known is not None and metrics.since != known:
            raise ProbeAborted(AbortCause.RESTARTED, None, f"{url} restarted during the probe")
        return Scrape(gauges, metrics, prefix_caching(text))

    async def drain(self, urls: Sequence[str], phase: Phase | None) -> float:
        """Wait until every replica in ``urls`` is idle; the seconds it took. ``phase``
        None: before the first step, where a busy replica is serving someone else."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            busy = []
            for url in urls:
                gauges = (await self.scrape(url)).gauges
                if gauges.get(RUNNING, 0) + gauges.get(WAITING, 0) > 0:
                    busy.append(
                        f"{url} (running {gauges.get(RUNNING, 0):g}, "
                        f"waiting {gauges.get(WAITING, 0):g})"
                    )
            if not busy:
                return loop.time() - start
            if loop.time() - start > self.drain_timeout_s:
                # before the first step a busy replica serves someone else's requests
                cause, what = (
                    (AbortCause.BUSY, "is serving other requests: is it in rotation?")
                    if phase is None
                    else (AbortCause.STUCK, "did not drain")
                )
                raise ProbeAborted(
                    cause,
                    phase,
                    f"{', '.join(busy)} {what} (waited {self.drain_timeout_s:g} s)",
                )
            await asyncio.sleep(self.poll_s)

    async def counters(self, url: str, phase: Phase) -> Scrape:
        """A scrape that holds the prefix-cache counters (a probe's hit rate needs them)."""
        scrape = await self.scrape(url)
        m = scrape.metrics
        if m.prefix_queries is None or m.prefix_hits is None:
            raise ProbeAborted(
                AbortCause.UNREADABLE,
                phase,
                f"{url} exposes no prefix-cache counters: the hit rate cannot be read",
            )
        return scrape
