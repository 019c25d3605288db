"""The drill runner: steady state, real faults, observation, rollbacks, verdict.

A drill runs in phases, each written to an append-only journal (JSON lines,
chaos/drills/journal.py) as it happens: the steady-state hypothesis must hold before
anything is touched; the faults are injected at their times (or when their condition
holds, e.g. mid-failover); the system is watched for ``observe_s``; the rollbacks
always run, even after an abort or an error; the hypothesis must hold again. A sampler
reads the system's own state and metrics every ``sample_s`` throughout
(chaos/drills/observe.py) and stops the drill early when an abort condition is met.
The verdict (chaos/drills/verdict.py, judged by chaos/drills/measure.py) is written to
``regions/<r>/readiness`` of the target region and of every region that took its
traffic, with an audit entry; a failed drill bars them (docs/architecture.md §6).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from chaos.drills.journal import Journal
from chaos.drills.measure import abort_reason, faults_criterion, probes_hold
from chaos.drills.measure_scaling import SurgeWindow, still_grown
from chaos.drills.observe import Observer, step_done
from chaos.drills.result import Criterion, DrillResult, Sample
from chaos.drills.scenario import (
    Condition,
    Fault,
    FaultKind,
    Scenario,
    SteadyState,
    describe_condition,
    describe_fault,
)
from chaos.drills.traffic import Traffic
from chaos.drills.verdict import DrillRun, Verdict, traffic_marks
from controlplane.kernel.config import ConfigError, Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.file import DEFAULT_PATH as LADDER_PATH
from controlplane.kernel.store.port import Store

log = logging.getLogger("chaos.drills.runner")


class DrillTarget(Protocol):
    """What a drill acts on: real processes it can stop and start (a LocalDeployment
    here; an adapter over your orchestrator elsewhere). Calls block; they run in a
    thread."""

    keys: Keys

    # region -> base URL where its traffic goes in (its gateway, or its Envoy)
    @property
    def gateway_urls(self) -> dict[str, str]: ...
    # process name -> base URL whose /metrics has the gateway's metric names (the
    # gateways, or the endpoint pickers behind the Envoys): what the observer scrapes
    @property
    def data_plane_metrics_urls(self) -> dict[str, str]: ...
    def replica_urls(self, region: str) -> list[str]: ...
    def start_servers(self, region: str) -> list[str]: ...
    def stop_servers(self, region: str, count: int | None = None) -> list[int]: ...
    def inject(self, region: str, fault: dict[str, object]) -> list[str]: ...
    def clear_faults(self, region: str) -> list[str]: ...
    def kill_controlplane(self, rid: str) -> int: ...
    def start_controlplanes(self) -> list[str]: ...
    def kill_etcd_member(self) -> int: ...
    def start_etcd_members(self) -> list[int]: ...


class DrillAborted(Exception):
    pass


@dataclass
class _Acted:
    """What the drill's middle (steady state before, faults, observation, rollbacks) did."""

    before: tuple[bool, str] = (False, "not checked")  # the hypothesis before, and why not
    injected: bool = False  # a fault may have been attempted: the rollbacks ran
    fault_t: float | None = None  # drill time of the first fault injected
    extra: list[Criterion] = field(default_factory=list)  # the faults' own criterion
    # each session's request count once the steady state held: what went before (a
    # region still settling when the drill began) is not the drill's to judge
    marks: dict[str, int] = field(default_factory=dict)


@dataclass
class DrillRunner:
    target: DrillTarget
    store: Store
    topology: Topology
    reports_root: Path
    traffic: Traffic | None = None
    reference_ladder: Path | None = LADDER_PATH
    on_sample: Callable[[Sample], None] | None = None
    say: Callable[[str], None] = log.info
    write_readiness: bool = True
    _samples: list[Sample] = field(default_factory=list)
    _abort: str = ""
    _target: str = ""  # the running drill's target: a unit, or a region with pools
    _units: tuple[str, ...] = ()  # the failover units it names
    _surges: list[SurgeWindow] = field(default_factory=list)  # the surges injected

    # ---- the drill ----------------------------------------------------------------------
    async def run(
        self, scenario: Scenario, region: str | None = None, *, dry_run: bool = False
    ) -> DrillResult:
        """Run ``scenario`` against ``region`` (default: the scenario's). Raises
        ConfigError, before touching anything, for a region not in the topology."""
        s = scenario.bind(region)
        t = self.topology
        if s.region not in t.names and s.region not in t.sites:
            known = ", ".join(dict.fromkeys((*t.sites, *t.names)))
            raise ConfigError(f"unknown region {s.region!r}: the topology has {known}")
        # a region with model pools: the drill acts on all of them and judges each
        self._target = s.region
        self._units = t.units_of(s.region) if s.region in t.sites else (s.region,)
        started, mono0 = time.time(), time.monotonic()
        drill_id = f"{datetime.fromtimestamp(started, UTC):%Y%m%dT%H%M%SZ}-{s.name}-{s.region}"
        directory = self.reports_root / drill_id
        journal = Journal(directory / "journal.jsonl", started, mono0)
        self._samples, self._abort, self._surges = [], "", []
        observer = Observer(
            self.store,
            self.target.keys,
            self.topology,
            self.target.data_plane_metrics_urls,
            {r: self.target.replica_urls(r) for r in self.topology.names},
        )
        journal.write("phase", "start", scenario=s.name, region=s.region, dry_run=dry_run)
        self.say(f"DRILL {s.name} on {s.region}{' (dry run)' if dry_run else ''}: {s.title}")
        sampler = asyncio.create_task(self._sample(observer, s, journal, mono0))
        acted = await self._act_and_roll_back(s, journal, observer, mono0, dry_run=dry_run)
        journal.phase = "steady_after"
        after = (
            (True, "")
            if not acted.injected
            else await self._steady(s.after, journal, "after", abortable=False)
        )
        if self._surges and s.measure.scaled_back_within_s is not None and not self._abort:
            # after the rollbacks: a pool grown for a failover's load gives it back once
            # the load has gone home
            await self._until_scaled_back(s.measure.scaled_back_within_s, journal, mono0)
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        await observer.close()

        journal.phase = "verdict"
        run = DrillRun(
            scenario=s,
            drill_id=drill_id,
            directory=directory,
            started=started,
            mono0=mono0,
            fault_t=acted.fault_t,
            before=acted.before,
            after=after,
            extra=acted.extra,
            marks=acted.marks,
            dry_run=dry_run,
            gateway_violations=observer.gateway_violations,
            streams_continued=observer.streams_continued,
            samples=self._samples,
            aborted=self._abort,
            units=self._units,
            surges=tuple(self._surges),
        )
        result = await self._verdict().deliver(run, journal)
        journal.close()
        return result

    async def _act_and_roll_back(
        self, s: Scenario, journal: Journal, observer: Observer, mono0: float, *, dry_run: bool
    ) -> _Acted:
        """The steady state before; if it holds, the faults and the observation (a dry
        run only says what it would do). An abort ends them early; the rollbacks run
        whatever happened, once anything may have been injected."""
        acted = _Acted()
        flaps: list[asyncio.Task[None]] = []
        try:
            journal.phase = "steady_before"
            acted.before = await self._steady(s.steady_state, journal, "before")
            acted.marks = traffic_marks(self.traffic)
            if dry_run:
                await self._dry_run(s, journal)
            elif acted.before[0]:
                acted.injected = True
                acted.fault_t, problems = await self._faults(s, journal, observer, mono0, flaps)
                acted.extra.append(faults_criterion(s.faults, problems))
                journal.phase = "observe"
                await self._observe(s, journal, observer, mono0)
        except DrillAborted as e:
            journal.write("abort", "abort", ok=False, why=str(e))
            self.say(f"ABORT: {e}")
        finally:
            journal.phase = "rollback"
            for task in flaps:
                task.cancel()
            await asyncio.gather(*flaps, return_exceptions=True)
            if acted.injected:
                await self._rollbacks(s, journal)
        return acted

    def _verdict(self) -> Verdict:
        return Verdict(
            store=self.store,
            keys=self.target.keys,
            reports_root=self.reports_root,
            traffic=self.traffic,
            reference_ladder=self.reference_ladder,
            write_readiness=self.write_readiness,
            say=self.say,
        )

    # ---- phases -------------------------------------------------------------------------
    async def _sample(
        self, observer: Observer, s: Scenario, journal: Journal, mono0: float
    ) -> None:
        while True:
            mono = time.monotonic()
            try:
                sample = await observer.sample(mono - mono0, time.time(), mono)
            except Exception as e:  # observing must not end the drill; say so
                journal.write("error", "sample", ok=False, error=repr(e))
                await asyncio.sleep(s.sample_s)
                continue
            self._samples.append(sample)
            if self.on_sample is not None:
                self.on_sample(sample)
            if journal.phase in ("faults", "observe") and not self._abort:
                self._abort = abort_reason(s, self._samples, mono - mono0)
            await asyncio.sleep(max(0.0, s.sample_s - (time.monotonic() - mono)))

    @property
    def _groups(self) -> dict[str, tuple[str, ...]]:
        """A target region with model pools -> its pools' units (what its probes and
        conditions are checked on); empty otherwise."""
        if self._units != (self._target,):
            return {self._target: self._units}
        return {}

    def _check_abort(self) -> None:
        if self._abort:
            raise DrillAborted(self._abort)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, waking every 0.1 s to honour an abort."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self._check_abort()
            await asyncio.sleep(min(0.1, left))
        self._check_abort()

    async def _steady(
        self, hyp: SteadyState, journal: Journal, when: str, *, abortable: bool = True
    ) -> tuple[bool, str]:
        """Wait (up to ``within_s``) until every probe holds for ``hold_s`` in a row."""
        deadline = time.monotonic() + hyp.within_s
        seen = len(self._samples)
        held_since: float | None = None
        why = "no sample yet"
        while time.monotonic() < deadline:
            if abortable:
                self._check_abort()
            if len(self._samples) > seen:
                seen = len(self._samples)
                sample = self._samples[-1]
                ok, why = probes_hold(hyp, sample, self._groups)
                held_since = (held_since or sample.t) if ok else None
                if held_since is not None and sample.t - held_since >= hyp.hold_s:
                    journal.write("probe", f"steady_state_{when}", ok=True, held_s=hyp.hold_s)
                    self.say(f"steady state {when}: holds")
                    return True, ""
            await asyncio.sleep(0.05)
        journal.write("probe", f"steady_state_{when}", ok=False, why=why)
        self.say(f"steady state {when}: NOT met within {hyp.within_s:g}s ({why})")
        return False, f"not within {hyp.within_s:g}s: {why}"

    async def _dry_run(self, s: Scenario, journal: Journal) -> None:
        journal.phase = "faults"
        for f in s.faults:
            journal.write("fault", f.action.value, ok=True, would=describe_fault(f))
            self.say(f"dry run: would {describe_fault(f)}")
        journal.phase = "rollback"
        for f in s.rollbacks:
            journal.write("rollback", f.action.value, ok=True, would=describe_fault(f))
            self.say(f"dry run: would roll back: {describe_fault(f)}")

    async def _faults(
        self,
        s: Scenario,
        journal: Journal,
        observer: Observer,
        mono0: float,
        flaps: list[asyncio.Task[None]],
    ) -> tuple[float | None, list[str]]:
        """Inject the faults in time order; the drill time of the first one injected."""
        journal.phase = "faults"
        start = time.monotonic()
        first: float | None = None
        problems = []
        for f in sorted(s.faults, key=lambda f: f.at_s):
            await self._sleep(start + f.at_s - time.monotonic())
            if f.when is not None and not await self._until(f.when, observer):
                problems.append(f"{f.action.value}: {describe_condition(f.when)} did not happen")
                journal.write("fault", f.action.value, ok=False, skipped=describe_condition(f.when))
                continue
            at = time.monotonic() - mono0
            try:
                detail = await self._act(f, flaps)
            except Exception as e:
                problems.append(f"{f.action.value}: {e}")
                journal.write("fault", f.action.value, ok=False, error=repr(e))
                self.say(f"FAULT {describe_fault(f)} failed: {e}")
                continue
            first = at if first is None else first
            if f.action is FaultKind.SURGE:
                self._surges.append(SurgeWindow(f.region, round(at, 3), round(at + f.surge_s, 3)))
            journal.write("fault", f.action.value, ok=True, what=describe_fault(f), **detail)
            self.say(f"FAULT {describe_fault(f)} ({_fmt(detail)})")
        return first, problems

    async def _observe(
        self, s: Scenario, journal: Journal, observer: Observer, mono0: float
    ) -> None:
        journal.write("phase", "observe", seconds=s.observe_s)
        await self._sleep(s.observe_s)
        if self._surges:  # a surge is observed to its end (its task stops with the faults)
            await self._sleep(max(w.end for w in self._surges) - (time.monotonic() - mono0))
        if s.observe_until is not None:
            ok = await self._until(s.observe_until, observer)
            journal.write(
                "probe", "observe_until", ok=ok, condition=describe_condition(s.observe_until)
            )

    async def _until_scaled_back(self, within_s: float, journal: Journal, mono0: float) -> None:
        """Watch until every pool a surge grew is back at its pre-surge ACTIVE count, or
        ``within_s`` after the last surge's end: the criterion is judged on what the
        samples saw by then."""
        end = max(w.end for w in self._surges) + within_s
        while (left := end - (time.monotonic() - mono0)) > 0:
            last = self._samples[-1].t if self._samples else 0.0
            if last > max(w.end for w in self._surges) and not still_grown(
                self._samples, self._surges
            ):
                break
            await asyncio.sleep(min(0.5, left))
        grown = still_grown(self._samples, self._surges)
        journal.write("probe", "scaled_back", ok=not grown, still_grown=", ".join(grown))

    async def _until(self, c: Condition, observer: Observer) -> bool:
        deadline = time.monotonic() + c.within_s
        while time.monotonic() < deadline:
            self._check_abort()
            with contextlib.suppress(Exception):
                units = self._groups.get(c.region, (c.region,))
                recs = [await observer.record(u) for u in units]
                if all(
                    rec is not None and rec.state.value == c.state and step_done(rec, c.step)
                    for rec in recs
                ):
                    return True
            await asyncio.sleep(0.1)
        return False

    async def _rollbacks(self, s: Scenario, journal: Journal) -> None:
        for f in s.rollbacks:
            try:
                detail = await self._act(f, [])
            except Exception as e:  # every rollback runs, whatever the others did
                journal.write("rollback", f.action.value, ok=False, error=repr(e))
                self.say(f"ROLLBACK {describe_fault(f)} failed: {e}")
                continue
            journal.write("rollback", f.action.value, ok=True, what=describe_fault(f), **detail)
            self.say(f"ROLLBACK {describe_fault(f)} ({_fmt(detail)})")

    # ---- acting on the deployment ----------------------------------------------------------
    async def _act(self, f: Fault, flaps: list[asyncio.Task[None]]) -> dict[str, object]:
        t, r = self.target, f.region
        match f.action:
            case FaultKind.STOP_REGION:
                return {"killed_pids": await asyncio.to_thread(t.stop_servers, r)}
            case FaultKind.KILL_REPLICAS:
                return {"killed_pids": await asyncio.to_thread(t.stop_servers, r, f.count)}
            case FaultKind.START_REGION:
                return {"started": await asyncio.to_thread(t.start_servers, r)}
            case FaultKind.INJECT:
                assert f.fault is not None
                fault = f.fault.model_dump(exclude_defaults=True)
                return {"servers": len(await asyncio.to_thread(t.inject, r, fault)), **fault}
            case FaultKind.CLEAR_FAULTS:
                return {"servers": len(await asyncio.to_thread(t.clear_faults, r))}
            case FaultKind.KILL_LEADER:
                kv = await self.store.get(self.target.keys.leader())
                if kv is None:
                    raise RuntimeError("no control-plane leader to kill")
                holder = kv.value.decode()
                return {
                    "leader": holder,
                    "pid": await asyncio.to_thread(t.kill_controlplane, holder),
                }
            case FaultKind.START_CONTROLPLANES:
                return {"started": await asyncio.to_thread(t.start_controlplanes)}
            case FaultKind.KILL_ETCD_MEMBER:
                return {"member": await asyncio.to_thread(t.kill_etcd_member)}
            case FaultKind.START_ETCD_MEMBERS:
                return {"started": await asyncio.to_thread(t.start_etcd_members)}
            case FaultKind.FLAP_REGION:
                flaps.append(asyncio.create_task(self._flap(f)))
                return {"period_s": f.period_s, "duration_s": f.duration_s}
            case FaultKind.SURGE:
                if self.traffic is None:
                    raise RuntimeError("a surge raises the drill's traffic: the drill has none")
                assert f.rate is not None
                base = self.traffic.base_rps(r)
                if base <= 0:  # said here: the surge's own task has no one to tell
                    raise RuntimeError(f"no synthetic session is homed in {r}: nothing to surge")
                surge = self.traffic.surge(r, f.rate, f.ramp_s, f.duration_s)
                # ended by itself; cancelled with the flaps if the drill stops early
                flaps.append(asyncio.create_task(_quietly(surge)))
                return {"base_rps": round(base, 2), "peak_rps": round(base * f.rate, 2)}
        raise ValueError(f"unknown fault {f.action}")  # pragma: no cover - enum is closed

    async def _flap(self, f: Fault) -> None:
        """Down ``period_s``, up ``period_s``, until ``duration_s`` is over."""
        end = time.monotonic() + f.duration_s
        while time.monotonic() < end:
            await asyncio.to_thread(self.target.stop_servers, f.region)
            await asyncio.sleep(f.period_s)
            await asyncio.to_thread(self.target.start_servers, f.region)
            await asyncio.sleep(f.period_s)


# ---- helpers ------------------------------------------------------------------------------
async def _quietly(work: Coroutine[object, object, object]) -> None:
    """``work`` as a task whose result nobody reads."""
    await work


def _fmt(detail: dict[str, object]) -> str:
    return ", ".join(f"{k} {v}" for k, v in detail.items())


def dump(result: DrillResult) -> str:
    """The result without its samples, as one line of JSON (for --json)."""
    data = json.loads(result.model_dump_json(exclude={"samples"}))
    return json.dumps(data)
