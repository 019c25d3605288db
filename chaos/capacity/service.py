"""The drill service's capacity probe (docs/capacity.md): borrow, probe, record, report.

``CapacityProber`` is what the drill service (chaos/drills/service.py) runs for
``CAPACITY_PROBE``: requested with ``failoverctl capacity probe REGION`` or scheduled in
chaos/schedule.yaml, under the drill lock like any drill, so a probe never runs beside
one. For the region named:

1. its SLA and factor of safety come from the topology, the workload from its prefix
   catalog (``prefixes/<region>``), a rate to try first from its last probe;
2. replicas are borrowed from its warm pool (``controlplane.kernel.pool.loans``): the
   one named, or else two WARM ones when ``pools/<region>`` counts two or more asleep
   (one alone when the agent lends only one), two loans on one lease
   (``borrow_together``) so that they are answered, lost and returned together; a
   replica in rotation is refused before anything is written; the loans end (and the
   agent puts the replicas back to sleep) however the probe ends;
3. ``chaos.capacity.probe.probe_capacity`` measures the first, and with a second the
   scaling efficiency (both at once); with one, 1.0 is assumed and the run says why;
4. the record and an audit entry (``capacity_measured``) are returned as writes, which
   the service commits with the run's history row in one transaction; the HTML report
   goes to ``reports/<id>/``.

A probe that aborts (the failure criteria at its lowest step, a busy or stuck
replica, a refused loan) writes no record, so the last measurement stands, and is
recorded as a failed run naming why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from chaos.capacity.probe import probe_capacity
from chaos.capacity.probe_config import ProbeConfig
from chaos.capacity.report import write_report
from chaos.capacity.verdicts import ProbeAborted, StepKind, StepReport
from chaos.capacity.workload import workload_from_catalog
from chaos.drills.result import Criterion, DrillResult
from chaos.drills.service import PROBE_TITLE, ProbeOutcome
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.capacity.record import CapacityRecord
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.config import Topology
from controlplane.kernel.drills import CAPACITY_PROBE
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditAction, AuditEntry
from controlplane.kernel.pool.loans import (
    LoanLost,
    LoanRefused,
    LoanTimedOut,
    borrow_together,
    read_members,
)
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.prefix.catalog import PrefixCatalog
from controlplane.kernel.store.port import Put, Store, StoreError

log = logging.getLogger("tectonic.capacity")
M = TypeVar("M", CapacityRecord, PrefixCatalog)
LOAN_FAILURES = (LoanRefused, LoanTimedOut, LoanLost)


class CapacityProber:
    """``await prober(region, replica, dry_run=...)`` -> a ``ProbeOutcome``."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        topology: Topology,
        *,
        holder: str,
        reports: Path = Path("drill-reports"),
        step_s: float = 5.0,
        clock: Clock | None = None,
        loan_timeout_s: float = 120.0,
        tune: Mapping[str, Any] | None = None,
    ) -> None:
        """``tune``: ProbeConfig fields to set besides what the topology says (tests and
        small labs: shorter steps, fewer of them)."""
        self._store, self._keys, self._topology = store, keys, topology
        self._holder, self._reports, self._step_s = holder, reports, step_s
        self._clock = clock or SystemClock()
        self._loan_timeout_s = loan_timeout_s
        self._tune = dict(tune or {})

    async def __call__(
        self, region: str, replica: str | None, *, dry_run: bool = False
    ) -> ProbeOutcome:
        if region not in self._topology.names:
            raise ValueError(f"unknown region {region!r}; known: {list(self._topology.names)}")
        started = self._clock.now()
        run_id = f"{datetime.fromtimestamp(started, UTC):%Y%m%dT%H%M%SZ}-{CAPACITY_PROBE}-{region}"
        if dry_run:
            return ProbeOutcome(result=self._result(run_id, region, started, [_dry_run(replica)]))
        pool = await read_members(self._store, self._keys, region)
        config = await self._config(region, pool)
        catalog = await self._read(self._keys.prefixes(region), PrefixCatalog)
        workload = workload_from_catalog(catalog)
        try:
            async with borrow_together(
                self._store,
                self._keys,
                region,
                borrower=self._holder,
                wanted=_wanted(pool, replica),
                at_least=1,
                timeout_s=self._loan_timeout_s,
            ) as got:
                urls = got.urls
                log.info(
                    "capacity probe of %s on %s (%s)",
                    region,
                    " and ".join(urls),
                    workload.profile.source,
                )
                pair = urls[1] if len(urls) > 1 else None
                async with ProgressPublisher(self._store, self._keys.drill_progress()) as told:
                    record = await probe_capacity(
                        urls[0], config, workload, pair_url=pair, progress=told
                    )
        except ProbeAborted as e:
            failed = self._result(run_id, region, started, [_aborted("probe", str(e))], str(e))
            return ProbeOutcome(result=failed)
        except LOAN_FAILURES as e:
            why = f"{type(e).__name__}: {e}"
            failed = self._result(run_id, region, started, [_aborted("replica", why)], why)
            return ProbeOutcome(result=failed)
        page = write_report(record, self._reports / run_id)
        scaled = _scaling(record, urls, replica, got.refused)
        return ProbeOutcome(
            result=self._result(
                run_id, region, started, [*_criteria(record), scaled], "", record, page
            ),
            writes=capacity_writes(
                self._keys, self._holder, record, run_id, urls, at=self._clock.now()
            ),
        )

    async def _config(self, region: str, pool: PoolMembers | None) -> ProbeConfig:
        cfg = self._topology.region(region)
        last = await self._read(self._keys.capacity(region), CapacityRecord)
        active = len(pool.active) if pool else len(cfg.replicas)
        hint = min((p.ultimate_rps for p in last.probes), default=None) if last else None
        config = ProbeConfig(
            region=region,
            slo=cfg.slo,
            factor_of_safety=cfg.factor_of_safety,
            step_s=self._step_s,
            hint_rps=hint,
            prober=self._holder,
            active_replicas=max(1, active),
        )
        return dataclasses.replace(config, **self._tune)

    async def _read(self, key: str, cls: type[M]) -> M | None:
        kv = await self._store.get(key)
        if kv is None:
            return None
        try:
            return decode(cls, kv.value, key)
        except CorruptValue as e:
            log.warning("ignoring %s: %s", key, e)
            return None

    def _result(
        self,
        run_id: str,
        region: str,
        started: float,
        criteria: Sequence[Criterion],
        aborted: str = "",
        record: CapacityRecord | None = None,
        page: Path | None = None,
    ) -> DrillResult:
        return DrillResult(
            id=run_id,
            scenario=CAPACITY_PROBE,
            title=PROBE_TITLE,
            region=region,
            started_at=started,
            ended_at=self._clock.now(),
            aborted=aborted,
            passed=not aborted and all(c.passed for c in criteria),
            criteria=tuple(criteria),
            figures=_figures(record) if record else {},
            report_path=str(page) if page else "",
        )


def capacity_writes(
    keys: Keys, holder: str, record: CapacityRecord, run_id: str, urls: Sequence[str], at: float
) -> tuple[Put, ...]:
    """What a probe commits with its history row: ``capacity/<region>`` and its audit
    entry (``capacity_measured``, at ``at``), the probed replicas (``urls``: the one the
    record is of, then its pair) named."""
    cold = min(record.probes, key=lambda p: p.hit_rate)
    entry = AuditEntry(
        at=at,
        actor=holder,
        action=AuditAction.CAPACITY_MEASURED,
        region=record.region,
        reason=f"capacity probe {run_id} of {' and '.join(urls)}",
        result="ok",
        details={
            "run": run_id,
            "replica": record.replica,
            "engine_version": record.engine_version,
            "ultimate_rps": f"{cold.ultimate_rps:.4g}",
            "allowed_rps": f"{cold.ultimate_rps / record.factor_of_safety:.4g}",
            "knee_rps": "" if cold.knee_rps is None else f"{cold.knee_rps:.4g}",
            "r_base_rps": f"{record.r_base_rps:.4g}",
            "beta": f"{record.beta:.3f}",
            "scaling_efficiency": f"{record.scaling_efficiency:.3f}",
            "scaling_measured": str(record.scaling_measured).lower(),
            "pair_replica": urls[1] if len(urls) > 1 else "",
        },
    )
    return (
        Put(keys.capacity(record.region), encode(record)),
        AuditLog(keys, holder).op(entry),
    )


def _figures(record: CapacityRecord) -> dict[str, float]:
    cold = min(record.probes, key=lambda p: p.hit_rate)
    out = {
        "ultimate_rps": cold.ultimate_rps,
        "allowed_rps": cold.ultimate_rps / record.factor_of_safety,
        "r_base_rps": record.r_base_rps,
        "beta": record.beta,
        "scaling_efficiency": record.scaling_efficiency,
        "probe_s": record.probe_s,
    }
    if cold.knee_rps is not None:
        out["knee_rps"] = cold.knee_rps
    if record.t_recover_s is not None:
        out["t_recover_s"] = record.t_recover_s
    if record.wasted_work_share is not None:
        out["wasted_work_share"] = record.wasted_work_share
    return out


def _criteria(record: CapacityRecord) -> list[Criterion]:
    """What a probe must show to count: an ultimate load found (bounded) at each hit
    rate; a lower bound is a result, but says the probe did not reach the limit."""
    return [
        Criterion(
            name=f"ultimate found at hit rate {p.hit_rate:.0%}",
            passed=p.ultimate_bounded,
            measured=f"{p.ultimate_rps:.1f} rps"
            + ("" if p.ultimate_bounded else " (no step broke the SLA)"),
            required="a step past the SLA within the plan's rates",
        )
        for p in record.probes
    ]


def _wanted(pool: PoolMembers | None, replica: str | None) -> tuple[str | None, ...]:
    """The loans to ask for: the replica named; else two WARM ones for the scaling
    efficiency when the pool counts two asleep (WARM and IDLE: the agent lends WARM
    only, and refuses the second loan when one is all it has), else one."""
    if replica is not None:
        return (replica,)
    return (None, None) if pool is not None and pool.warm >= 2 else (None,)


def _scaling(
    record: CapacityRecord, urls: Sequence[str], named: str | None, refused: Sequence[str]
) -> Criterion:
    """How the scaling efficiency was had: measured on two replicas at once, or assumed
    1.0, and why (a replica named, one WARM replica, the second loan refused, no
    ultimate on one replica to measure against)."""
    if record.scaling_measured:
        how = f"measured on {urls[0]} and {urls[1]} at once"
    elif len(urls) > 1:
        how = f"assumed: {record.scaling_unmeasured or 'the pair was not probed'}"
    elif named is not None:
        how = f"assumed: the probe ran on {named} alone (named)"
    elif refused:
        how = f"assumed: one replica lent, the second refused ({'; '.join(refused)})"
    else:
        how = "assumed: fewer than two WARM replicas in the pool"
    return Criterion(
        name="scaling efficiency",
        passed=True,  # assumed is a result too: said here, in the record and the report
        measured=f"{record.scaling_efficiency:.2f} ({how})",
        required="two replicas probed at once, or what is assumed said",
    )


def _aborted(what: str, why: str) -> Criterion:
    return Criterion(name=f"{what} ready", passed=False, measured=why, required="no abort")


def _dry_run(replica: str | None) -> Criterion:
    return Criterion(
        name="dry run",
        passed=True,
        measured=f"would borrow {replica or 'two WARM replicas (one if one is all)'} and probe",
        required="-",
    )


def step_line(step: StepReport) -> str:
    """One step as a sentence: the log's, and what ``failoverctl capacity probe`` shows."""
    held = ""
    if step.kind is StepKind.SUSTAINED:
        held = f" after {step.warmup_s:.0f} s of warm-up, judged over {step.duration_s:.0f} s"
    return (
        f"{step.phase.value} {step.kind.value} step {step.index}: "
        f"{step.offered_rps:.1f} rps offered{held}, p99 {step.p99_ttft_s * 1000:.0f} ms, "
        f"errors {step.error_rate:.1%}, {step.throughput_rps:.1f} rps served: "
        f"{step.verdict.value}"
        + (" (the load generator fell behind)" if step.generator_behind else "")
    )


class ProgressPublisher:
    """Logs each step and keeps its line at ``key`` for whoever waits on the probe (one
    small value overwritten per step; removed at the end). The probe calls back
    synchronously: writes run as tasks, a failed one is logged, never fatal."""

    def __init__(self, store: Store, key: str) -> None:
        self._store, self._key = store, key
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, step: StepReport) -> None:
        line = step_line(step)
        log.info("%s", line)
        self._spawn(self._store.put(self._key, line.encode()))

    def _spawn(self, write: Awaitable[object]) -> None:
        async def run() -> None:
            try:
                await write
            except StoreError as e:
                log.warning("progress not published: %s", e)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def __aenter__(self) -> ProgressPublisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks)
        try:
            await self._store.delete(self._key)
        except StoreError as e:
            log.warning("progress not cleared: %s", e)
