"""The drill service's capacity probe (docs/capacity.md): borrow, probe, record, report.

``CapacityProber`` is what the drill service (chaos/drills/service.py) runs for
``CAPACITY_PROBE``: requested with ``failoverctl capacity probe REGION`` or scheduled in
chaos/schedule.yaml, under the drill lock like any drill, so a probe never runs beside
one. For the region named:

1. its SLA and factor of safety come from the topology, the workload from its prefix
   catalog (``prefixes/<region>``), a rate to try first from its last probe;
2. a replica is borrowed from its warm pool (``controlplane.kernel.pool_loans``): any
   WARM one, or the one named; a replica in rotation is refused before anything is
   written; the loan ends (and the agent puts the replica back to sleep) however the
   probe ends;
3. ``chaos.capacity.probe.probe_capacity`` measures it;
4. the record and an audit entry (``capacity_measured``) are returned as writes, which
   the service commits with the run's history row in one transaction; the HTML report
   goes to ``reports/<id>/``.

A probe that aborts (the failure criteria at its lowest step, a busy or stuck
replica, a refused loan) writes no record, so the last measurement stands, and is
recorded as a failed run naming why.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from chaos.capacity.probe import ProbeAborted, ProbeConfig, StepReport, probe_capacity
from chaos.capacity.report import write_report
from chaos.capacity.workload import workload_from_catalog
from chaos.drills.result import Criterion, DrillResult
from chaos.drills.service import PROBE_TITLE, ProbeOutcome
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.capacity_record import CapacityRecord
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.config import Topology
from controlplane.kernel.drills import CAPACITY_PROBE
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditAction, AuditEntry
from controlplane.kernel.pool_loans import (
    LoanLost,
    LoanRefused,
    LoanTimedOut,
    borrow,
    read_members,
)
from controlplane.kernel.prefix_catalog import PrefixCatalog
from controlplane.kernel.store.port import Put, Store

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
        config = await self._config(region)
        catalog = await self._read(self._keys.prefixes(region), PrefixCatalog)
        workload = workload_from_catalog(catalog)
        try:
            async with borrow(
                self._store,
                self._keys,
                region,
                borrower=self._holder,
                replica=replica,
                timeout_s=self._loan_timeout_s,
            ) as url:
                log.info("capacity probe of %s on %s (%s)", region, url, workload.profile.source)
                record = await probe_capacity(url, config, workload, progress=_tell)
        except ProbeAborted as e:
            failed = self._result(run_id, region, started, [_aborted("probe", str(e))], str(e))
            return ProbeOutcome(result=failed)
        except LOAN_FAILURES as e:
            why = f"{type(e).__name__}: {e}"
            failed = self._result(run_id, region, started, [_aborted("replica", why)], why)
            return ProbeOutcome(result=failed)
        page = write_report(record, self._reports / run_id)
        return ProbeOutcome(
            result=self._result(run_id, region, started, _criteria(record), "", record, page),
            writes=self._writes(record, run_id),
        )

    async def _config(self, region: str) -> ProbeConfig:
        cfg = self._topology.region(region)
        last = await self._read(self._keys.capacity(region), CapacityRecord)
        pool = await read_members(self._store, self._keys, region)
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

    def _writes(self, record: CapacityRecord, run_id: str) -> tuple[Put, ...]:
        cold = min(record.probes, key=lambda p: p.hit_rate)
        entry = AuditEntry(
            at=self._clock.now(),
            actor=self._holder,
            action=AuditAction.CAPACITY_MEASURED,
            region=record.region,
            reason=f"capacity probe {run_id} of {record.replica}",
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
            },
        )
        return (
            Put(self._keys.capacity(record.region), encode(record)),
            AuditLog(self._keys, self._holder).op(entry),
        )

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


def _figures(record: CapacityRecord) -> dict[str, float]:
    cold = min(record.probes, key=lambda p: p.hit_rate)
    out = {
        "ultimate_rps": cold.ultimate_rps,
        "allowed_rps": cold.ultimate_rps / record.factor_of_safety,
        "r_base_rps": record.r_base_rps,
        "beta": record.beta,
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


def _aborted(what: str, why: str) -> Criterion:
    return Criterion(name=f"{what} ready", passed=False, measured=why, required="no abort")


def _dry_run(replica: str | None) -> Criterion:
    return Criterion(
        name="dry run",
        passed=True,
        measured=f"would borrow {replica or 'a WARM replica'} and probe it",
        required="-",
    )


def _tell(step: StepReport) -> None:
    log.info(
        "%s step %d: %.1f rps offered, p99 %.0f ms, errors %.1f%%, %.1f rps served: %s%s",
        step.phase.value,
        step.index,
        step.offered_rps,
        step.p99_ttft_s * 1000,
        step.error_rate * 100,
        step.throughput_rps,
        step.verdict.value,
        " (the load generator fell behind)" if step.generator_behind else "",
    )
