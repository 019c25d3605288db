"""The reconcile loop: level-triggered ticks (docs/architecture.md §7.1).

Each tick reads a full snapshot, decides purely, and acts. A watch on intents only
wakes the loop early; correctness never depends on seeing an event. Only the leader
acts; followers tick too, so that their health reflects a working loop. Every tick
also reads the store's alarms, and a leader's tick notes a permanent store error, so
that status never shows the stored states as current while etcd refuses writes
(``core/store_writes.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from controlplane.core.actions import TickResult
from controlplane.core.decide import decide
from controlplane.core.store_writes import StoreWrites
from controlplane.election import NotLeader
from controlplane.kernel.cluster_spec import ClusterSpec
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.ladder.model import Ladder
from controlplane.kernel.model import HealthReport
from controlplane.kernel.snapshot import Snapshot
from controlplane.kernel.snapshot_reader import Decoded, read_snapshot
from controlplane.kernel.store.port import (
    Compare,
    StoreError,
    StoreFull,
    StoreUnavailable,
    WatchEvent,
)
from controlplane.orchestrator import Orchestrator
from controlplane.probe_job import ProbeJob, Prober
from controlplane.tick_schedule import TickSchedule

log = logging.getLogger("tectonic.loop")


class Leadership(Protocol):
    @property
    def is_leader(self) -> bool: ...

    def fence(self) -> list[Compare]: ...

    async def wait_changed(self) -> bool: ...


class TickObserver(Protocol):
    def tick_done(
        self, *, leader: bool, snapshot: Snapshot | None, result: TickResult | None
    ) -> None:
        """After each tick that made progress; a leader's tick has the snapshot it
        decided on and the result it applied."""

    def tick_timed(self, seconds: float) -> None:
        """After each tick this replica ran as leader, however it ended."""


class NoTicksTold:
    """No one to tell about ticks (a control plane without metrics: tests, benches)."""

    def tick_done(
        self, *, leader: bool, snapshot: Snapshot | None, result: TickResult | None
    ) -> None:
        pass

    def tick_timed(self, seconds: float) -> None:
        pass


class ReconcileLoop:
    def __init__(
        self,
        orchestrator: Orchestrator,
        leadership: Leadership,
        *,
        prober: Prober | None = None,
        observer: TickObserver | None = None,
        ladder: Ladder | None = None,
        spec: ClusterSpec | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """The cluster (store, keys, topology, clock) and this replica's name are the
        orchestrator's. What is left out is off, and the first leading tick says so in
        the log: ``prober``, the leader's own check of the agents; ``ladder``, the
        degradation ladder; ``spec``, publishing the cluster spec. ``monotonic`` times
        each tick (tests pass a fake clock)."""
        self.ladder, self.spec = ladder, spec
        self._monotonic = monotonic
        c = orchestrator.cluster
        self.store, self.keys, self.topology, self.clock = c.store, c.keys, c.topology, c.clock
        self.leadership, self.orchestrator = leadership, orchestrator
        # The agents' check, a job beside the ticks (controlplane/probe_job.py).
        self.probe: ProbeJob | None = None
        if prober is not None:
            self.probe = ProbeJob(
                prober,
                orchestrator.write_reports,
                interval_s=self.topology.timing.probe_interval_s,
                now=self.clock.now,
            )
        self.actor = orchestrator.actor
        self.observer: TickObserver = observer or NoTicksTold()
        self._off = [
            what
            for what, given in (
                ("the leader's own check of the agents (their reports alone count)", prober),
                ("the degradation ladder (no ladder file)", ladder),
                ("publishing the cluster spec", spec),
            )
            if given is None
        ]
        self.tick_snapshot: Snapshot | None = None  # what the last tick decided on, if any
        self.wake = asyncio.Event()
        self.last_progress = time.monotonic()
        self.last_result: TickResult | None = None
        self.ticks = 0
        self._decoded = Decoded()  # the last tick's values: unchanged keys not parsed again
        self.writes = StoreWrites()  # whether etcd takes writes, for status and metrics
        self._was_leader = False

    def stalled(self) -> bool:
        """True when no tick has completed for three periods (health goes NOT_SERVING)."""
        limit = 3 * self.topology.timing.loop_period_s + 2 * self.topology.timing.retry_timeout_s
        return time.monotonic() - self.last_progress > limit

    async def tick(self) -> TickResult | None:
        leader = self.leadership.is_leader
        if self._was_leader and not leader:
            log.warning("no longer leader: stopping all actions")
            await self.stop_probe()
            await self.orchestrator.stop_failovers()
        self._was_leader = leader
        if not leader:
            # Also proves the store is reachable; cheap (no key is read).
            self._alarms_read(await self.store.alarms())
            return None
        if self._off:  # once, when this replica first leads
            log.info("off in this control plane: %s", "; ".join(self._off))
            self._off = []
        if self.probe is not None:
            # Beside the ticks, never inside one: a dead agent's check waits out its
            # timeout (0.8 x the probe interval), and the tick that fails its region over
            # must not wait with it. Its reports are the next tick's input (a changed
            # verdict wakes the loop at once).
            self.probe.start()
        now = self.clock.now()
        # the alarms beside the snapshot's reads: a round trip less per tick (etcd answers
        # an alarm read through its log: two round trips to a leader in another region)
        alarms = asyncio.create_task(self.store.alarms(), name="tick-alarms")
        try:
            snap = await read_snapshot(self.store, self.keys, self.topology, now, self._decoded)
        except BaseException:
            alarms.cancel()  # the snapshot failed: the tick ends without either
            await asyncio.wait([alarms])
            if not alarms.cancelled():
                alarms.exception()  # seen: the snapshot's failure is the one raised
            raise
        self._alarms_read(await alarms)
        self.tick_snapshot = snap
        await self.orchestrator.prepare(snap)
        # Job results first: a job that finishes from here on is recorded next tick.
        jobs = self.orchestrator.jobs()
        sizes = self.orchestrator.sizes
        result = decide(snap, self.topology, self.actor, jobs, self.ladder, self.spec, sizes)
        if not self.leadership.is_leader:
            return None  # lost the lease while deciding: act on nothing
        lost = await self.orchestrator.apply(result)
        _tell(result, lost)
        self.last_result = result
        return result

    async def stop_probe(self) -> None:
        """Cancel a running check of the agents (leadership lost, or shutdown)."""
        if self.probe is not None:
            await self.probe.stop()

    async def run(self) -> None:
        period = self.topology.timing.loop_period_s
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                self._wake_on(self.keys.intents_prefix(), _any_change), name="watch-intents"
            )
            tg.create_task(
                self._wake_on(self.keys.reports_prefix(), _HealthChanges()), name="watch-reports"
            )
            # a request for a pool at zero: the scaler wakes it this tick, not the next
            tg.create_task(self._wake_on(self.keys.wake_prefix(), _any_change), name="watch-wakes")
            tg.create_task(self._wake_on_leadership(), name="watch-leadership")
            tg.create_task(self._wake_on_jobs(), name="watch-jobs")
            # Fixed rate; an overrun is followed by one tick at once, its missed periods
            # dropped (controlplane/tick_schedule.py).
            schedule = TickSchedule(period, time.monotonic())
            while True:
                await self.tick_once()
                try:
                    async with asyncio.timeout(schedule.ended(time.monotonic())):
                        await self.wake.wait()
                except TimeoutError:
                    pass
                self.wake.clear()

    async def tick_once(self) -> None:
        """One tick as ``run`` makes it: bounded, timed, observed, its errors logged."""
        period = self.topology.timing.loop_period_s
        leader = self.leadership.is_leader
        started = self._monotonic()
        cut = await self._bounded_tick(period + 2 * self.topology.timing.retry_timeout_s)
        seconds = self._monotonic() - started
        if seconds > period and not cut:
            # Silent until the bound cuts it otherwise; ticks fall behind their schedule.
            log.warning("tick took %.2fs, longer than its period of %.2fs", seconds, period)
        if leader:
            self._observe_duration(seconds)

    async def _bounded_tick(self, bound: float) -> bool:
        """One tick within ``bound`` seconds; True when the bound cut it."""
        self.tick_snapshot = None
        try:
            async with asyncio.timeout(bound):
                result = await self.tick()
            self.last_progress = time.monotonic()
            self.ticks += 1
            if self.probe is not None and self.probe.refused is not None:
                self._writes_refused(self.probe.refused)  # the leader's reports were refused
            else:
                self._writes_completed()
            self._observe(result)
        except StoreUnavailable as e:
            # Acting blind is worse than not acting: wait for the store.
            log.warning("store unavailable, not acting this tick: %s", e)
        except TimeoutError:
            log.warning("tick took longer than %.1fs; skipped", bound)
            return True
        except NotLeader:
            log.info("leadership lost mid-tick; not acting")
        except StoreFull as e:
            self._writes_refused(e)
        except (StoreError, ValueError) as e:
            if isinstance(e, StoreError):
                self._writes_refused(e)
            # A bug or a corrupt value must not kill the loop; the next tick retries.
            log.exception("tick failed")
        return False

    def _alarms_read(self, alarms: list[str]) -> None:
        was = self.writes.writable
        self.writes.alarms_read(alarms, self.clock.now())
        if was and not self.writes.writable:
            log.error(
                "etcd raised %s: the store refuses writes; status shows every region's "
                "state UNKNOWN until it takes them again (runbooks/etcd-space.md)",
                ", ".join(alarms),
            )
        elif not was and self.writes.writable:
            log.warning("the store takes writes again; states are current again")

    def _writes_refused(self, e: StoreError) -> None:
        was = self.writes.writable
        self.writes.tick_failed(str(e), self.clock.now())
        if was:
            log.error(
                "the store refused this tick's writes (%s): nothing can be failed over or "
                "recorded; status shows every region's state UNKNOWN until a tick "
                "completes (runbooks/etcd-space.md)",
                e,
            )

    def _writes_completed(self) -> None:
        was = self.writes.writable
        self.writes.tick_completed(self.clock.now())
        if not was and self.writes.writable:
            log.warning("a tick completed and etcd has no alarm: states are current again")

    def _observe_duration(self, seconds: float) -> None:
        try:
            self.observer.tick_timed(seconds)
        except Exception:
            log.exception("tick observer failed")  # metrics must never stop the loop

    def _observe(self, result: TickResult | None) -> None:
        try:
            self.observer.tick_done(
                leader=self.leadership.is_leader, snapshot=self.tick_snapshot, result=result
            )
        except Exception:
            log.exception("tick observer failed")  # metrics must never stop the loop

    async def _wake_on_leadership(self) -> None:
        """A new leader acts at once instead of at its next period."""
        while True:
            await self.leadership.wait_changed()
            self.wake.set()

    async def _wake_on_jobs(self) -> None:
        """A finished pre-warm is recorded (and the switch that waited for it written) at
        once instead of at the next period."""
        done = self.orchestrator.job_done
        while True:
            await done.wait()
            done.clear()
            self.wake.set()

    async def _wake_on(self, prefix: str, changed: Callable[[WatchEvent], bool]) -> None:
        """Wake the loop early on relevant changes under ``prefix``. Only a hint: the
        tick re-reads everything, so a missed event costs latency, never correctness."""
        while True:
            try:
                async for ev in self.store.watch_prefix(prefix):
                    if changed(ev):
                        self.wake.set()
            except StoreUnavailable:
                pass
            except StoreError as e:
                # A hint must never stop the loop: any broken watch is watched again.
                log.warning("watch on %s broke (%s); the tick still reads it", prefix, e)
            await asyncio.sleep(self.topology.timing.loop_period_s)


def _any_change(ev: WatchEvent) -> bool:
    return True


def _tell(result: TickResult, lost: Sequence[str]) -> None:
    """The tick's one sentence: what it decided and, if any, what did not land. A
    change of state (a transition, a ladder move, a refused intent) is a warning; a
    recorded step or a started job is information."""
    summary = result.summary()
    if lost:
        summary += "; not written (state or leadership changed; the next tick re-decides): "
        summary += ", ".join(lost)
    if summary != "no change":
        log.log(logging.WARNING if result.changes_state() else logging.INFO, "tick: %s", summary)


class _HealthChanges:
    """True when an observer's reported health differs from its last report: the
    first bad report starts detection at once; steady reports wake nothing."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def __call__(self, ev: WatchEvent) -> bool:
        try:
            health = decode(HealthReport, ev.kv.value).health.value if ev.kv.value else ""
        except CorruptValue:
            return False
        changed = self._last.get(ev.kv.key) != health
        self._last[ev.kv.key] = health
        return changed
