"""The drill-runner service: runs the drills of ``chaos/schedule.yaml`` when they are due,
never two at once in one deployment, and keeps their history in etcd.

* **Lock.** ``drills/lock`` is created (txn on ``create_revision == 0``, as leader
  election does) on a lease of this run's own, holding who runs what since when. If it
  exists, ``run_once`` raises ``DrillBusy`` naming the holder and its drill. The lease
  is kept alive while the drill runs; if it is lost (etcd unreachable past the lease,
  or revoked), the drill is cancelled (its rollbacks run) and ``LockLost`` is raised:
  someone else may start a drill now. Released by revoking the lease when the run
  ends, however it ends; if this process dies, the lease expires after ``lock_ttl_s``.
* **History.** Each finished run writes a ``DrillSummary`` to ``drills/history/<id>``
  (no lease: kept) and an audit entry (``drill_run``) with the same sortable id, in
  one transaction that also deletes the lock if it is still ours. A run whose drill
  raised is recorded as failed (``passed: false``, ``aborted: "error: ..."``) and the
  error re-raised, so that history shows the attempt and the scheduler does not retry
  a crashing drill all night. A cancelled run records nothing.
* **Schedule.** ``serve()`` ticks every ``tick_s``: it reads the history (the last
  scheduled run of each entry), asks ``chaos.drills.schedule.check_due`` what is due, and runs
  at most one drill per tick. Under the lock it checks again, so that two services
  sharing a schedule run each occurrence once.

    .venv/bin/python -m chaos --schedule chaos/schedule.yaml \\
        --etcd 127.0.0.1:2379 --cluster demo

The lock and the recording of a run are in ``chaos/drills/lock.py``; the command line
(``python -m chaos``) is in ``chaos/drills/cli.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from chaos.drills import requests as requests
from chaos.drills.lock import DrillBusy, DrillLocker, HeldLock, LockLost
from chaos.drills.result import DrillResult, DrillSummary, summarize
from chaos.drills.schedule import PlannedRun, Schedule, ScheduleEntry, Skipped, check_due, next_runs
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.drills import CAPACITY_PROBE, DrillLock, DrillRequest, ScenarioInfo
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Frozen
from controlplane.kernel.store.port import Put, Store, StoreError

# DrillBusy and LockLost (chaos/drills/lock.py) and DrillLock (controlplane/kernel/drills.py)
# are importable from here too.
__all__ = [
    "MANUAL",
    "REQUEST",
    "SCHEDULE",
    "DrillBusy",
    "DrillLock",
    "DrillService",
    "LockLost",
    "RunDrill",
    "TickReport",
    "default_holder",
    "history",
]

log = logging.getLogger("tectonic.drills")


class RunDrill(Protocol):
    """Runs the named scenario on ``region`` (None: the scenario's default)."""

    def __call__(
        self, name: str, region: str | None, *, dry_run: bool = False
    ) -> Awaitable[DrillResult]: ...


def default_holder() -> str:
    """Who the lock, the history and the audit name: drills-HOST-PID."""
    return f"drills-{socket.gethostname()}-{os.getpid()}"


class ProbeOutcome(Frozen):
    """A capacity probe's run: its result as a drill's, and the writes (``capacity/<r>``
    and its audit entry) recorded with its history row, in the same transaction."""

    result: DrillResult
    writes: tuple[Put, ...] = ()


class RunProbe(Protocol):
    """Runs a capacity probe of ``region`` (``replica``: the one named, else any WARM)."""

    def __call__(
        self, region: str, replica: str | None, *, dry_run: bool = False
    ) -> Awaitable[ProbeOutcome]: ...


SCHEDULE = "schedule"
MANUAL = "manual"
PROBE_TITLE = "Capacity probe: the region's bearing capacity, on a replica out of rotation"
REQUEST = "request"


class TickReport(Frozen):
    """What one tick of ``serve()`` decided, for the log and the tests."""

    at: float
    due: tuple[str, ...] = ()  # entry keys due at ``at``, oldest occurrence first
    ran: str = ""  # the entry run (or tried) this tick
    outcome: str = "idle"  # idle | passed | failed | busy | already run | error: ...


class DrillService:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        schedule: Schedule,
        run_drill: RunDrill,
        clock: Clock,
        *,
        holder: str | None = None,
        tick_s: float = 30.0,
        lock_ttl_s: int = 15,
        store_deadline_s: float = 10.0,
        default_regions: Mapping[str, str] | None = None,
        scenarios: Sequence[ScenarioInfo] = (),
        probe: RunProbe | None = None,
    ) -> None:
        # The keep-alive runs every ttl/3 and gives up at ttl - ttl/5: needs ttl >= 2.
        if lock_ttl_s < 2:
            raise ValueError(f"lock_ttl_s must be at least 2 s, got {lock_ttl_s}")
        if tick_s <= 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s}")
        self._store = store
        self._keys = keys
        self._schedule = schedule
        self._run_drill = run_drill
        self._clock = clock
        self.holder = holder or default_holder()
        self._tick_s = tick_s
        self._default_regions = dict(default_regions or {})
        self._probe = probe  # runs CAPACITY_PROBE; None: this service has no prober
        if probe is not None and scenarios:
            scenarios = (*scenarios, ScenarioInfo(name=CAPACITY_PROBE, title=PROBE_TITLE))
        self._scenarios = tuple(scenarios)  # published in drills/catalog; () = unchecked
        self._wake = asyncio.Event()  # set by the watch on drills/requests/
        self._lock = DrillLocker(store, keys, clock, self.holder, lock_ttl_s, store_deadline_s)
        self._announced: PlannedRun | None = None
        self._told: set[tuple[str, datetime]] = set()  # (what, occurrence) already logged

    # ---- one drill -----------------------------------------------------------------

    async def run_once(
        self,
        name: str,
        region: str | None = None,
        trigger: str = MANUAL,
        *,
        dry_run: bool = False,
        request_id: str = "",
        replica: str | None = None,
    ) -> DrillSummary:
        """Run one drill (or the capacity probe, ``CAPACITY_PROBE``, of ``replica`` if
        named) now under the lock and record it. Raises DrillBusy if another drill
        runs, LockLost if the lock was lost meanwhile, or whatever the drill raised
        (after recording it as failed)."""
        async with self._locked(name, region, trigger) as held:
            return await self._run_locked(
                held,
                name,
                region,
                trigger,
                dry_run=dry_run,
                request_id=request_id,
                replica=replica,
            )

    async def _run_locked(
        self,
        held: HeldLock,
        name: str,
        region: str | None,
        trigger: str,
        *,
        dry_run: bool = False,
        request_id: str = "",
        replica: str | None = None,
    ) -> DrillSummary:
        started = self._clock.now()
        try:
            outcome = await self._hold(held, self._runner(name, region, replica, dry_run))
        except Exception as e:
            summary = self._failed(name, region, trigger, started, e).model_copy(
                update={"dry_run": dry_run, "request_id": request_id}
            )
            try:
                await self._lock.record(held, summary)
            except StoreError as store_error:  # the drill's error is the one to raise
                log.error("could not record the failed drill %s: %s", name, store_error)
            raise
        summary = summarize(outcome.result, trigger=trigger, request_id=request_id)
        await self._lock.record(held, summary, outcome.writes)
        verdict = "PASSED" if summary.passed else f"FAILED ({', '.join(summary.failed)})"
        log.info("drill %s on %s %s", summary.scenario, summary.region, verdict)
        return summary

    def _failed(
        self, name: str, region: str | None, trigger: str, started: float, e: Exception
    ) -> DrillSummary:
        stamp = datetime.fromtimestamp(started, UTC)
        return DrillSummary(
            id=f"{stamp:%Y%m%dT%H%M%SZ}-{name}-error",
            scenario=name,
            region=self._region(name, region),
            started_at=started,
            ended_at=self._clock.now(),
            passed=False,
            aborted=f"error: {type(e).__name__}: {e}",
            trigger=trigger,
        )

    def _region(self, name: str, region: str | None) -> str:
        return region or self._default_regions.get(name, "")

    # ---- the lock --------------------------------------------------------------------

    def _locked(
        self, name: str, region: str | None, trigger: str
    ) -> contextlib.AbstractAsyncContextManager[HeldLock]:
        return self._lock.locked(name, self._region(name, region), trigger)

    def _runner(
        self, name: str, region: str | None, replica: str | None, dry_run: bool
    ) -> Callable[[], Awaitable[ProbeOutcome]]:
        """What runs ``name``: the capacity prober, or the drill runner."""
        if name == CAPACITY_PROBE:
            probe = self._probe
            if probe is None:
                raise ValueError(
                    f"this drill service runs no {CAPACITY_PROBE}: start it with --topology"
                )
            if not region:
                raise ValueError(f"{CAPACITY_PROBE} needs a region")
            return lambda: probe(region, replica, dry_run=dry_run)

        async def drill() -> ProbeOutcome:
            return ProbeOutcome(result=await self._run_drill(name, region, dry_run=dry_run))

        return drill

    async def _hold(
        self, held: HeldLock, run: Callable[[], Awaitable[ProbeOutcome]]
    ) -> ProbeOutcome:
        """Run the drill while keeping the lease alive; whichever ends first ends both."""
        results: list[ProbeOutcome] = []

        async def drill() -> None:
            results.append(await run())
            keeper.cancel()  # a cancelled task does not fail its TaskGroup

        failure: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                keeper = tg.create_task(self._lock.keep_alive(held))
                tg.create_task(drill())
        except BaseExceptionGroup as group:
            if len(group.exceptions) != 1:
                raise
            failure = group.exceptions[0]
        if failure is not None:  # the drill's error, or LockLost: as it is, not grouped
            raise failure
        return results[0]

    # ---- the schedule ----------------------------------------------------------------

    async def serve(self) -> None:
        """Tick forever: run due drills one at a time. Store errors wait for the next
        tick; cancel to stop (a drill in progress is cancelled and its lock released)."""
        log.info(
            "drill service %s: %d scheduled entries, tick %g s",
            self.holder,
            len(self._schedule.entries),
            self._tick_s,
        )
        watcher = asyncio.create_task(
            requests.watch_requests(self._store, self._keys, self._wake, self._tick_s)
        )
        try:
            while True:
                try:
                    report = await self.tick()
                    if report.outcome != "idle":
                        log.info("tick: %s", report.model_dump_json())
                except StoreError as e:
                    log.warning("tick failed, trying again in %g s: %s", self._tick_s, e)
                with contextlib.suppress(TimeoutError):  # a request wakes the loop early
                    await asyncio.wait_for(self._wake.wait(), self._tick_s)
                self._wake.clear()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def tick(self) -> TickReport:
        """Publish the catalog; run the oldest operator request if any, else the
        oldest due scheduled drill; at most one drill per tick."""
        now = self._now()
        await requests.publish_catalog(
            self._store,
            self._keys,
            self.holder,
            self._scenarios,
            self._schedule,
            now.timestamp(),
        )
        asked = await requests.pending(self._store, self._keys)
        if asked:
            outcome = await self._run_requested(asked[0])
            return TickReport(at=now.timestamp(), ran=f"request:{asked[0].id}", outcome=outcome)
        report = check_due(self._schedule, await self._last_runs(), now)
        self._tell_skipped(report.skipped)
        keys = tuple(r.entry.key for r in report.runs)
        if not report.runs:
            self._announce(now)
            return TickReport(at=now.timestamp())
        run = report.runs[0]
        outcome = await self._run_scheduled(run)
        self._announce(self._now())
        return TickReport(at=now.timestamp(), due=keys, ran=run.entry.key, outcome=outcome)

    async def _run_requested(self, req: DrillRequest) -> str:
        known = {s.name for s in self._scenarios}
        if known and req.scenario not in known:
            log.error("request %s names no scenario of this service: %s", req.id, req.scenario)
            await requests.done(self._store, self._keys, req)
            return "refused: unknown scenario"
        log.info("running drill %s requested by %s: %s", req.scenario, req.actor, req.reason)
        try:
            summary = await self.run_once(
                req.scenario,
                req.region or None,
                REQUEST,
                dry_run=req.dry_run,
                request_id=req.id,
                replica=req.replica or None,
            )
        except DrillBusy:
            return "busy"  # kept: the next tick tries again
        except Exception as e:  # recorded as a failed run by _run_locked
            await requests.done(self._store, self._keys, req)
            return f"error: {type(e).__name__}: {e}"
        await requests.done(self._store, self._keys, req)
        return "passed" if summary.passed else "failed"

    async def _run_scheduled(self, run: PlannedRun) -> str:
        entry = run.entry
        try:
            async with self._locked(entry.scenario, entry.region, SCHEDULE) as held:
                # Another service may have run it while we waited: ask again, under the lock.
                again = check_due(self._schedule, await self._last_runs(), self._now())
                if entry.key not in {r.entry.key for r in again.runs}:
                    log.info("drill %s (due %s) was already run", entry.key, _at(run.at))
                    return "already run"
                log.info("starting drill %s (due %s)", entry.key, _at(run.at))
                summary = await self._run_locked(held, entry.scenario, entry.region, SCHEDULE)
                return "passed" if summary.passed else "failed"
        except DrillBusy as e:
            first = self._first_time(f"busy:{entry.key}", run.at)  # say it once, not every tick
            log.log(
                logging.INFO if first else logging.DEBUG,
                "drill %s is due, but %s; trying again every %g s while its window allows",
                entry.key,
                e,
                self._tick_s,
            )
            return "busy"
        except Exception as e:  # the runner's or the store's: the next tick decides again
            log.error("drill %s did not complete: %s: %s", entry.key, type(e).__name__, e)
            return f"error: {type(e).__name__}: {e}"

    async def _last_runs(self) -> dict[str, datetime | None]:
        """When each entry last ran from the schedule, from the history in etcd. An
        entry without a region matches its scenario's rows in any region that no other
        entry of that scenario names."""
        rows = [r for r in await history(self._store, self._keys, None) if r.trigger == SCHEDULE]
        named = {(e.scenario, e.region) for e in self._schedule.entries if e.region}
        out: dict[str, datetime | None] = {}
        for e in self._schedule.entries:
            starts = [r.started_at for r in rows if _matches(e, r, named)]
            out[e.key] = datetime.fromtimestamp(max(starts), UTC) if starts else None
        return out

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock.now(), UTC)

    def _announce(self, now: datetime) -> None:
        """Log the next drill when it changes, and what is skipped on the way."""
        up = next_runs(self._schedule, now, 1)
        self._tell_skipped(up.skipped)
        nxt = up.runs[0] if up.runs else None
        if nxt == self._announced:
            return
        self._announced = nxt
        if nxt is None:
            log.warning("no drill will run within a year: check the schedule's windows")
            return
        log.info(
            "next drill %s (%s on %s) at %s, in %s",
            nxt.entry.key,
            nxt.entry.scenario,
            nxt.entry.region or "its default region",
            _at(nxt.at),
            _span(nxt.at_utc - now),
        )

    def _tell_skipped(self, skipped: Sequence[Skipped]) -> None:
        for s in skipped:
            if self._first_time(s.entry.key, s.at):
                log.info("skipped: drill %s at %s: %s", s.entry.key, _at(s.at), s.reason)

    def _first_time(self, what: str, at: datetime) -> bool:
        if (what, at) in self._told:
            return False
        self._told.add((what, at))
        return True


def _matches(entry: ScheduleEntry, row: DrillSummary, named: set[tuple[str, str]]) -> bool:
    if row.scenario != entry.scenario:
        return False
    if entry.region:
        return row.region == entry.region
    return (row.scenario, row.region) not in named


def _at(at: datetime) -> str:
    return f"{at:%a %Y-%m-%d %H:%M %Z}"


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    days, rest = divmod(max(seconds, 0), 86_400)
    return f"{days}d {rest // 3600}h {rest % 3600 // 60}m"


async def history(store: Store, keys: Keys, limit: int | None = 20) -> list[DrillSummary]:
    """Finished drills, newest first (at most ``limit``; None: all). Rows that do not
    parse are logged and left out."""
    page = await store.get_prefix(keys.drill_history_prefix())
    out: list[DrillSummary] = []
    for kv in reversed(page.kvs):  # keys sort by time
        if limit is not None and len(out) >= limit:
            break
        try:
            out.append(decode(DrillSummary, kv.value, kv.key))
        except CorruptValue as e:
            log.warning("drill history: %s", e)
    return out
