"""A drill's verdict, once its run is over: gathered, judged, recorded.

What the run observed is completed from the store (the audit log's transitions,
ladder steps and pre-warm) and the synthetic sessions' logs, judged by the pure
functions of chaos/drills/measure.py, and recorded: each criterion in the journal,
``regions/<r>/readiness`` of the target region and of every region that took its
traffic with an audit entry (a failed drill bars them, docs/architecture.md §6),
and the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos.drills.journal import Journal
from chaos.drills.measure import (
    Observed,
    SessionLog,
    figures,
    judge,
    last_prewarm,
    regions_judged,
)
from chaos.drills.measure_scaling import RequestLog, ScaleEvent, SurgeWindow
from chaos.drills.observe import audit_since
from chaos.drills.result import Criterion, DrillResult, Sample
from chaos.drills.scenario import Scenario
from chaos.drills.traffic import Traffic
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.codec import encode
from controlplane.kernel.details import json_list
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.file import load_ladder
from controlplane.kernel.model import AuditAction, AuditEntry, PrewarmFigures, Readiness
from controlplane.kernel.store.port import Put, Store

ACTOR = "drill-runner"


@dataclass(frozen=True)
class DrillRun:
    """What one run of a drill leaves for its verdict."""

    scenario: Scenario  # bound to its region
    drill_id: str
    directory: Path  # the drill's reports folder
    started: float  # wall clock
    mono0: float  # monotonic clock at the start: drill time 0
    fault_t: float | None  # drill time of the first fault injected
    before: tuple[bool, str]  # the steady state before: held, or why not
    after: tuple[bool, str]
    extra: list[Criterion]  # judged by the run itself (the faults went in)
    marks: dict[str, int]  # each session's requests before the steady state held
    dry_run: bool
    gateway_violations: float
    streams_continued: float  # by the gateways, after a replica failed mid-stream
    samples: list[Sample]
    aborted: str  # why the run stopped early; "" when it did not
    # the failover units the target names: the region, or each pool of a region with
    # model pools (docs/models.md)
    units: tuple[str, ...] = ()
    surges: tuple[SurgeWindow, ...] = ()  # the surge faults' windows


def traffic_marks(traffic: Traffic | None) -> dict[str, int]:
    """How many requests each synthetic session has made so far."""
    if traffic is None:
        return {}
    return {x.conversation: len(x.log) for x in traffic.sessions}


def request_logs(traffic: Traffic | None, mono0: float) -> list[RequestLog]:
    """Every synthetic request sent since the drill began, in drill time."""
    if traffic is None:
        return []
    return [
        RequestLog(round(r.t - mono0, 3), r.home, r.first_byte_s)
        for r in traffic.requests
        if r.t >= mono0
    ]


def scale_events(entries: Sequence[AuditEntry], started: float) -> list[ScaleEvent]:
    """The ``scale`` audit entries: each pool's new desired sizes, in drill time."""
    out = []
    for e in entries:
        if e.action is not AuditAction.SCALE:
            continue
        try:
            active, warm = int(e.details["active"]), int(e.details["warm"])
        except (KeyError, ValueError):
            continue  # an entry without its sizes audits no size
        out.append(ScaleEvent(round(e.at - started, 3), e.region, active, warm))
    return out


def session_logs(traffic: Traffic | None, marks: dict[str, int], mono0: float) -> list[SessionLog]:
    """Each synthetic session's answers since its mark, in drill time."""
    if traffic is None:
        return []
    return [
        SessionLog(
            sid=x.conversation,
            home=x.home_unit or x.home,
            answers=tuple(
                (round(t - mono0, 3), r) for t, r in x.log[marks.get(x.conversation, 0) :]
            ),
        )
        for x in traffic.sessions
    ]


@dataclass(frozen=True)
class Verdict:
    """Where a verdict comes from and where it goes."""

    store: Store
    keys: Keys
    reports_root: Path
    traffic: Traffic | None
    reference_ladder: Path | None
    write_readiness: bool
    say: Callable[[str], None]

    async def deliver(self, run: DrillRun, journal: Journal) -> DrillResult:
        """Judge ``run``, record the verdict, write the report; the drill's result."""
        s = run.scenario
        transitions, ladder, entries = await audit_since(self.store, self.keys, run.started)
        units = run.units or (s.region,)
        prewarms = {u: last_prewarm(entries, u) for u in units}
        # the figures show the pool that warmed least (one region: its own)
        prewarm = min(prewarms.values(), key=_attained, default=None)
        reference = (
            load_ladder(self.reference_ladder).names if self.reference_ladder is not None else ()
        )
        sessions = session_logs(self.traffic, run.marks, run.mono0)
        observed = Observed(
            region=s.region,
            fault_t=run.fault_t,
            samples=run.samples,
            transitions=transitions,
            ladder=ladder,
            sessions=sessions,
            prewarm=prewarm,
            gateway_violations=run.gateway_violations,
            streams_continued=run.streams_continued,
            reference_ladder=reference,
            steady_before=run.before,
            steady_after=run.after,
            aborted=run.aborted,
            units=units if units != (s.region,) else (),
            prewarms=prewarms,
            requests=request_logs(self.traffic, run.mono0),
            surges=run.surges,
            scale_events=scale_events(entries, run.started),
        )
        criteria = (
            judge(s.measure, observed) + run.extra if not run.dry_run else _dry_run_criteria(run)
        )
        passed = all(c.passed for c in criteria)
        for c in criteria:
            journal.write("measure", c.name, ok=c.passed, measured=c.measured, required=c.required)
        measured = figures(observed, sessions, prewarm)
        regions = [] if run.dry_run else regions_judged(units, run.samples)
        result = DrillResult(
            id=run.drill_id,
            scenario=s.name,
            title=s.title,
            region=s.region,
            started_at=run.started,
            ended_at=time.time(),
            dry_run=run.dry_run,
            aborted=run.aborted,
            passed=passed,
            criteria=tuple(criteria),
            samples=tuple(run.samples),
            transitions=tuple(transitions),
            ladder=tuple(ladder),
            figures=measured,
            readiness_written=tuple(regions) if self.write_readiness else (),
            journal_path=str(journal.path),
            report_path=str(run.directory / "report.html"),
        )
        if self.write_readiness and regions:
            await record_readiness(self.store, self.keys, result, regions)
            journal.write("verdict", "readiness", passed=passed, regions=",".join(regions))
        journal.write(
            "verdict",
            "PASS" if passed else "FAIL",
            ok=passed,
            failed=",".join(result.failed_criteria()),
        )
        self.say(
            f"VERDICT {s.name} on {s.region}: {'PASS' if passed else 'FAIL'}"
            + ("" if passed else f" ({', '.join(result.failed_criteria())})")
        )
        self._write_report(result, run.directory)
        return result

    def _write_report(self, result: DrillResult, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            from chaos.drills.report import write_history, write_report
        except ImportError:  # the report module is optional for a bare runner
            (directory / "result.json").write_text(result.model_dump_json(indent=2))
            return
        write_report(result, directory)
        write_history(self.reports_root)


async def record_readiness(
    store: Store, keys: Keys, result: DrillResult, regions: Sequence[str]
) -> None:
    """A verdict's readiness: ``regions/<r>/readiness`` of each region judged, with its
    audit entry, in one transaction (a failed drill bars them until a passing drill or an
    operator's override)."""
    readiness = Readiness(passed=result.passed, drill=result.id, at=result.ended_at)
    ops = [Put(keys.readiness(r), encode(readiness)) for r in regions]
    entry_base = {
        "drill": result.id,
        "scenario": result.scenario,
        "failed": json_list(result.failed_criteria()),
    }
    log = AuditLog(keys, ACTOR)
    audit = [
        log.op(
            AuditEntry(
                at=result.ended_at,
                actor=ACTOR,
                action=AuditAction.DRILL_VERDICT,
                region=r,
                reason="passed"
                if result.passed
                else "failed: barred until a passing drill or an operator override",
                details=entry_base,
            )
        )
        for r in regions
    ]
    await store.txn([], [*ops, *audit])


def _dry_run_criteria(run: DrillRun) -> list[Criterion]:
    """A dry run injects nothing: its one criterion is the steady state before."""
    held, why = run.before
    return [
        Criterion(
            name="steady_state_before",
            passed=held,
            measured="held" if held else why,
            required="the steady-state hypothesis holds (dry run: nothing injected)",
        )
    ]


def _attained(prewarm: PrewarmFigures | None) -> float:
    """Orders pre-warms worst first: none recorded, then the least attained."""
    if prewarm is None:
        return -1.0
    return prewarm.attained_fraction if prewarm.attained_fraction is not None else 0.0
