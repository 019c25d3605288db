"""The leader's check of the agents as a background job beside the ticks (issue 35).

A sweep checks every agent (``controlplane/probe.py``, a bounded number at once) and
hands each report here as its check ends; the reports go to etcd in batches, each one
fenced transaction of at most ``MAX_TXN_OPS`` puts (etcd's default ``--max-txn-ops``):
one commit per report cost ~1.7 ms each, 856 ms a sweep at 512 regions. A batch is
written when it is full, when the sweep ends, or ``linger_s`` after its first report,
so that a dead agent's check, which waits out its timeout, holds back no other
region's report for longer than that. One write is in flight at a time; what arrives
meanwhile joins the next batch.

The tick never waits for a sweep: it reads the latest reports from its snapshot, as it
reads an agent's (docs/architecture.md §7.1). At most one sweep runs; any leading tick
starts one once the last has ended, a woken tick too (an agent's first bad report wakes
the loop, and the leader's own vote should follow at once: a quorum needs it), but not
within a quarter of ``probe_interval_s`` of the last start, so that a burst of woken
ticks does not run sweeps back to back. (Pacing at the whole interval cost detection
up to 2 s: periodic ticks a period apart land just inside it and skip every other
sweep, and woken ticks start none.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from controlplane.election import NotLeader
from controlplane.kernel.model import HealthReport
from controlplane.kernel.store.port import MAX_TXN_OPS, StoreError, StoreUnavailable

log = logging.getLogger("tectonic.loop")

Write = Callable[[Sequence[HealthReport]], Awaitable[None]]
MIN_GAP = 0.25  # of the probe interval, between two sweeps' starts


class Prober(Protocol):
    """The leader's own check of every region's agent (controlplane/probe.py)."""

    async def sweep(self, report: Callable[[HealthReport], None]) -> None:
        """Check every agent once, calling ``report`` with each region's report as its
        check ends."""


class ReportBatches:
    """Reports in, fenced batches out (group commit): ``add`` from the sweep, ``drain``
    writes until ``close`` and everything added is written."""

    def __init__(self, write: Write, *, linger_s: float, limit: int = MAX_TXN_OPS) -> None:
        self._write, self._linger_s, self._limit = write, linger_s, limit
        self._pending: list[HealthReport] = []
        self._wake = asyncio.Event()  # a full batch, or the end of the sweep
        self._closed = False
        self.batches = 0  # transactions written, for tests and benches

    def add(self, report: HealthReport) -> None:
        self._pending.append(report)
        # The first report of a batch starts its linger; a full batch goes at once.
        if len(self._pending) in (1, self._limit):
            self._wake.set()

    def close(self) -> None:
        """The sweep is over: write what is left and return."""
        self._closed = True
        self._wake.set()

    async def drain(self) -> None:
        while not (self._closed and not self._pending):
            lingered = False
            if not self._closed and len(self._pending) < self._limit:
                try:
                    # The linger starts when the batch gets its first report, not before:
                    # an empty wait (every check still running) writes nothing.
                    timeout = self._linger_s if self._pending else None
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                except TimeoutError:
                    lingered = True
            self._wake.clear()
            # Full batches always; a partial one at the end or once it has lingered.
            while len(self._pending) >= self._limit or (
                self._pending and (self._closed or lingered)
            ):
                batch = self._pending[: self._limit]
                del self._pending[: self._limit]
                self.batches += 1
                await self._write(batch)


class ProbeJob:
    """One sweep at a time, beside the ticks; ``refused`` is the last sweep's write
    refusal (the next tick counts it as its own, so status shows etcd refusing)."""

    def __init__(
        self,
        prober: Prober,
        write: Write,
        *,
        interval_s: float,
        now: Callable[[], float],
        linger_s: float | None = None,
    ) -> None:
        self._prober, self._write, self._interval_s, self._now = prober, write, interval_s, now
        # A tenth of the interval: a report written that late is still fresh for
        # report_stale_s (at least 2 x the interval, checked at load).
        self._linger_s = interval_s * 0.1 if linger_s is None else linger_s
        self._task: asyncio.Task[None] | None = None
        self._started_at: float | None = None
        self.refused: StoreError | None = None
        self.sweeps = 0

    def start(self) -> bool:
        """Start a sweep unless one runs or the last started less than a quarter of the
        interval ago (a clock that went back counts as due); True when one started."""
        if self._task is not None and not self._task.done():
            return False
        now, last = self._now(), self._started_at
        if last is not None and last <= now < last + self._interval_s * MIN_GAP:
            return False
        self._started_at = now
        self.sweeps += 1
        self._task = asyncio.create_task(self._sweep(), name="agent-probe")
        return True

    async def _sweep(self) -> None:
        batches = ReportBatches(self._write, linger_s=self._linger_s)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(batches.drain(), name="agent-probe-writes")
                try:
                    await self._prober.sweep(batches.add)
                finally:
                    batches.close()
            self.refused = None
        except* NotLeader:
            pass  # the next tick sees it and stops the checks
        except* StoreUnavailable as eg:
            log.warning("the agents' check was not stored (store unavailable): %s", eg.exceptions)
        except* StoreError as eg:
            self.refused = eg.exceptions[0]  # type: ignore[assignment]
        except* Exception:
            log.exception("the agents' check failed; a later tick starts another")

    async def stop(self) -> None:
        """Cancel a running sweep (leadership lost, or shutdown); the next leader's first
        tick starts one at once."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.refused = None
        self._started_at = None
