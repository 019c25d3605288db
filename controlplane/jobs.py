"""The leader's job executor: the only slow I/O of its cycle, in the background.

The pure core asks for jobs (``controlplane.core.actions.Job``: a failover's pre-warm, a
recovery's pre-warm, the periodic prefix aggregation); the executor runs at most one of
each kind per region at a time and keeps each pre-warm's figures until a tick records
them, and when the last aggregation ended (``jobs()`` is that tick's input). A job never
writes the region's record itself, so a leader's writes all come from one place
(controlplane/orchestrator.py). On leadership loss everything running is cancelled and
every result forgotten: a new leader starts the pre-warm again under the same id, and
the agents do not warm twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from controlplane.core.actions import Job, JobKind, Jobs
from controlplane.kernel.model import PrewarmFigures

log = logging.getLogger("tectonic.jobs")

Run = Callable[[Job], Awaitable[PrewarmFigures | None]]


class JobExecutor:
    """``run`` carries out one job and returns its figures (None: nothing to record, as
    for an aggregation); ``on_done`` is called when one with figures finishes (it wakes
    the loop, so the result is recorded at once rather than at the next periodic tick);
    ``now`` is the clock the tick's snapshot uses."""

    def __init__(
        self,
        run: Run,
        on_done: Callable[[], None] = lambda: None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._run, self._on_done, self._now = run, on_done, now
        self._tasks: dict[tuple[str, JobKind], tuple[str, asyncio.Task[None]]] = {}
        self._results: dict[str, PrewarmFigures] = {}
        self._aggregated_at: float | None = None

    def jobs(self) -> Jobs:
        running = frozenset(i for i, t in self._tasks.values() if not t.done())
        return Jobs(results=dict(self._results), running=running, aggregated_at=self._aggregated_at)

    def start(self, job: Job) -> None:
        """Start ``job`` unless it runs or has a result; while another of its kind runs
        for the same region, it waits its turn (a later tick asks again)."""
        if job.id in self._results:
            return
        slot = (job.region, job.kind)
        current = self._tasks.get(slot)
        if current is not None and not current[1].done():
            return
        log.info("%s", job.describe())
        task = asyncio.create_task(self._carry_out(job), name=f"{job.kind.value}-{job.region}")
        self._tasks[slot] = (job.id, task)

    async def _carry_out(self, job: Job) -> None:
        try:
            figures = await self._run(job)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Nothing recorded: the next tick sees the step still pending and asks again
            # (an aggregation, once its interval has passed again).
            log.exception("%s: %s failed; a later tick retries", job.region, job.kind.value)
            figures = None
        finally:
            if job.kind is JobKind.PREFIX_AGGREGATE:
                self._aggregated_at = self._now()
        if figures is not None:
            self._results[job.id] = figures
            self._on_done()

    def recorded(self, ids: Iterable[str]) -> None:
        """These results are in etcd now: forget them."""
        for i in ids:
            self._results.pop(i, None)

    def keep_only(self, wanted: Iterable[str]) -> None:
        """Forget results no pending step asks for any more (a failover cancelled, a
        region that relapsed): they would never be recorded."""
        keep = set(wanted)
        for i in [i for i in self._results if i not in keep]:
            del self._results[i]

    async def stop(self) -> None:
        """Cancel every job and forget every result (leadership lost, or shutdown)."""
        tasks = [t for _, t in self._tasks.values() if not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._results.clear()
        self._aggregated_at = None
