"""Carries out what the pure core decided: it applies the tick's writes and starts its
jobs, nothing else (docs/architecture.md §7.1). It reads nothing: what a write depends
on (revisions to compare, an intent's claim) came with the snapshot the core decided on,
and the one lease intent outcomes share is made ready before the tick decides
(``prepare``).

Every write is one fenced transaction (``controlplane/fenced.py``): each also compares
the leader key's value and create revision, so a replica that lost leadership (even one
paused past its lease) can no longer change anything. A failed compare is not an
error: the next tick re-reads the snapshot and decides again (level-triggered). What a
tick did is told once, by the loop's one sentence per tick; here only a write that did
not land is logged.

Jobs (``controlplane/jobs.py``) are the cycle's slow I/O: a failover's pre-warm of its
targets, a recovery's pre-warm of the home region before its first traffic step
(``RecoveryPrewarmer``; a prewarmer without that method, or one that fails, gives
figures that say so, and recovery goes on), and the periodic merge of the gateways'
prefix exports into the catalogs (``Catalogs``). Their figures are inputs of the next
tick, which records them. No job writes a session: the gateways re-pin the sessions
they serve.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from controlplane.cluster import Cluster
from controlplane.core.actions import (
    ControlWrite,
    DropIntent,
    HoldRelease,
    Job,
    JobKind,
    Jobs,
    LadderWrite,
    ScaleWrite,
    SpecWrite,
    TickResult,
    Write,
    WriteHealth,
)
from controlplane.core.intents import IntentOutcome
from controlplane.failover_traces import FailoverTraces
from controlplane.fenced import Fence, FencedWriter
from controlplane.jobs import JobExecutor
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.codec import encode
from controlplane.kernel.model import (
    AuditEntry,
    Decision,
    FailoverProgress,
    FailoverStep,
    HealthReport,
    PrewarmFigures,
)
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.snapshot import Snapshot
from controlplane.kernel.store.port import (
    Compare,
    Delete,
    LeaseNotFound,
    Op,
    Put,
    StoreError,
    TxnResult,
)
from controlplane.prewarm import Prewarmer

log = logging.getLogger("tectonic.orchestrator")

# An intent's outcome stays readable (GetIntent) a day at least; outcomes share one lease
# per hour, so a busy day grants 24 leases, not one per intent.
INTENT_OUTCOME_TTL_S = 24 * 3600
OUTCOME_LEASE_REUSE_S = 3600


class WriteObserver(Protocol):
    """Told about writes that succeeded (metrics); must not raise or block."""

    def transitioned(self, d: Decision) -> None: ...

    def failover_step_done(
        self, region: str, step: FailoverStep, progress: FailoverProgress, at: float
    ) -> None: ...


@runtime_checkable
class RecoveryPrewarmer(Protocol):
    async def prewarm_home(
        self, region: str, budget_s: float, recovery_id: str, fraction: float
    ) -> PrewarmFigures:
        """Replay ``region``'s own top prefixes on it within ``budget_s``; figures for
        the record. A repeat with the same ``recovery_id`` must not warm twice."""
        ...


class NoWrites:
    """No one to tell about writes (a control plane without metrics: tests, benches)."""

    def transitioned(self, d: Decision) -> None:
        pass

    def failover_step_done(
        self, region: str, step: FailoverStep, progress: FailoverProgress, at: float
    ) -> None:
        pass


class Catalogs(Protocol):
    """Writes every region's prefix catalog (controlplane/prefix_aggregator.py)."""

    async def run_once(self) -> Mapping[str, object]:
        """One merge of every export, written through the leader's fenced writer;
        raises StoreError."""
        ...

    def forget(self) -> None:
        """Leadership lost: the next term writes everything afresh."""
        ...


class NoCatalogs:
    """This control plane writes no prefix catalogs (a test's or a bench's, which set
    ``prefixes/<r>`` themselves): the cycle still schedules the periodic merge, which
    says so in the log once and does nothing."""

    def __init__(self) -> None:
        self._said = False

    async def run_once(self) -> Mapping[str, object]:
        if not self._said:
            log.info("prefix catalogs are off in this control plane: no merge of exports")
            self._said = True
        return {}

    def forget(self) -> None:
        pass


class Orchestrator:
    def __init__(
        self,
        cluster: Cluster,
        fence: Fence,
        prewarmer: Prewarmer,
        actor: str,
        *,
        observer: WriteObserver | None = None,
        catalogs: Catalogs | None = None,
    ) -> None:
        """``actor``: this replica, named in what it decides. Without an ``observer``
        writes are told to no one; without ``catalogs``, see ``NoCatalogs``."""
        self.cluster = cluster
        self.store, self.keys, self.topology = cluster.store, cluster.keys, cluster.topology
        self.clock = cluster.clock
        self.writer = FencedWriter(cluster.store, fence)
        self.prewarmer, self.actor = prewarmer, actor
        self.observer: WriteObserver = observer or NoWrites()
        self.catalogs: Catalogs = catalogs or NoCatalogs()
        self.audit = AuditLog(cluster.keys, actor)
        self.executor = JobExecutor(self._run_job, self._job_done, cluster.clock.now)
        self.traces = FailoverTraces()  # spans when tracing is on (--otlp-endpoint)
        self.job_done = asyncio.Event()  # set when a job finishes: the loop ticks at once
        self._held: dict[str, str] = {}  # per region: the ladder's hold reason last logged
        self._outcome_lease: tuple[int, float] | None = None  # (lease id, granted at)
        # the scaler's newest record per pool, written or not (its forecaster moves every
        # tick; etcd gets a checkpoint): this term's, forgotten when leadership goes
        self.sizes: dict[str, ScaleRecord] = {}

    # ---- writes ------------------------------------------------------------------------
    async def write(self, w: Write) -> bool:
        """One region's change as one fenced CAS transaction. False if it lost a race."""
        compares = [Compare.mod_revision(self.keys.region_state(w.region), w.expected_rev)]
        compares += [
            Compare.mod_revision(self.keys.routing(r), rev) for r, rev in w.routing_revs.items()
        ]
        ops: list[Op] = [Put(self.keys.region_state(w.region), encode(w.record))]
        ops += [Put(self.keys.routing(r), encode(v)) for r, v in w.routing.items()]
        ops += [self.audit.op(a) for a in w.audit]
        if w.intent_outcome is not None:
            more, ops = self._resolve_intent(w.intent_outcome, w.free_claim_rev, ops)
            compares += more
        return (await self._txn(compares, ops)).succeeded

    async def write_ladder(self, lw: LadderWrite) -> bool:
        """A ladder move on ``degradation/<region>``."""
        key = self.keys.degradation(lw.region)
        ok = await self._put_audited(key, lw.expected_rev, encode(lw.record), lw.audit)
        if ok:
            self._held.pop(lw.region, None)
        return ok

    async def write_scale(self, sw: ScaleWrite) -> bool:
        """A pool's desired size on ``scale/<unit>``; audited when it changed."""
        key, value = self.keys.scale(sw.unit), encode(sw.record)
        if sw.audit is not None:
            return await self._put_audited(key, sw.expected_rev, value, sw.audit)
        cas = Compare.mod_revision(key, sw.expected_rev) if sw.expected_rev else Compare.absent(key)
        return (await self._txn([cas], [Put(key, value)])).succeeded

    async def write_spec(self, sw: SpecWrite) -> bool:
        """The cluster spec on ``spec``."""
        key = self.keys.spec()
        ok = await self._put_audited(key, sw.expected_rev, encode(sw.spec), sw.audit)
        if ok:
            changed = "; ".join(f"{k}: {v}" for k, v in sw.audit.details.items())
            log.info("published the cluster spec at %s (%s): %s", key, sw.audit.reason, changed)
        return ok

    async def write_control(self, cw: ControlWrite) -> bool:
        """``control`` after a pause expired (lost to an operator's newer pause or resume:
        theirs stands)."""
        ok = await self._put_audited(
            self.keys.control(), cw.expected_rev, encode(cw.control), cw.audit
        )
        if ok:
            log.warning("automation resumed: %s", cw.audit.reason)
        return ok

    async def release_hold(self, hr: HoldRelease) -> bool:
        """A unit's hold deleted once its time is up (lost to an operator's newer hold
        or release: theirs stands)."""
        key = (self.keys.budget_lift if hr.lift else self.keys.region_hold)(hr.unit)
        cas = [Compare.mod_revision(key, hr.expected_rev)]
        ok = (await self._txn(cas, [Delete(key), self.audit.op(hr.audit)])).succeeded
        if ok:
            what = "budget lift ended" if hr.lift else "hold released"
            log.warning("%s: %s: %s", hr.unit, what, hr.audit.reason)
        return ok

    async def _put_audited(self, key: str, rev: int, value: bytes, entry: AuditEntry) -> bool:
        """``value`` at ``key`` with its audit entry in one fenced transaction,
        compare-and-set on ``rev`` (0: the key must be absent)."""
        cas = Compare.mod_revision(key, rev) if rev else Compare.absent(key)
        ops = [Put(key, value), self.audit.op(entry)]
        return (await self._txn([cas], ops)).succeeded

    def _log_holds(self, holds: Mapping[str, str]) -> None:
        for region, why in holds.items():
            if self._held.get(region) != why:
                log.info("%s: ladder holds: %s", region, why)
        self._held = dict(holds)

    async def write_health(self, items: Sequence[WriteHealth]) -> None:
        await self.writer.put_all(
            [Put(self.keys.region_health(h.region), encode(h.health)) for h in items]
        )

    async def drop_intent(self, d: DropIntent) -> bool:
        compares, ops = self._resolve_intent(d.outcome, d.free_claim_rev, [self.audit.op(d.audit)])
        return (await self._txn(compares, ops)).succeeded

    async def write_reports(self, reports: Sequence[HealthReport]) -> None:
        """The agents' check (``controlplane/probe.py``): observations like any agent's,
        written through the leader's fence all the same."""
        await self.writer.put_all(
            [Put(self.keys.report(r.region, r.observer), encode(r)) for r in reports]
        )

    # ---- operator intents' outcomes -------------------------------------------------------
    async def prepare(self, snap: Snapshot) -> None:
        """Before the tick decides on ``snap``: the lease intent outcomes share, when an
        intent waits and the lease is missing or due for renewal (one per hour, so a
        busy day grants 24 leases, not one per intent). Apply then only writes."""
        now = self.clock.now()
        held = self._outcome_lease
        if snap.intents and (held is None or now - held[1] >= OUTCOME_LEASE_REUSE_S):
            ttl = INTENT_OUTCOME_TTL_S + OUTCOME_LEASE_REUSE_S
            self._outcome_lease = (await self.store.grant_lease(ttl), now)

    def _resolve_intent(
        self, outcome: IntentOutcome, free_claim_rev: int, ops: list[Op]
    ) -> tuple[list[Compare], list[Op]]:
        """``ops`` and: delete the intent, record its outcome (GetIntent reads it), and
        free the region's claim when the snapshot showed it this intent's or unreadable
        (the API then takes the next one), compare-and-delete at that revision."""
        if self._outcome_lease is None:
            raise RuntimeError("an intent outcome to write, but prepare() granted no lease")
        ops = [
            *ops,
            Delete(self.keys.intent(outcome.id)),
            Put(self.keys.intent_outcome(outcome.id), encode(outcome), self._outcome_lease[0]),
        ]
        if not free_claim_rev:
            return [], ops
        claim = self.keys.intent_claim(outcome.region)
        return [Compare.mod_revision(claim, free_claim_rev)], [*ops, Delete(claim)]

    async def _txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        try:
            return await self.writer.txn(ops, compares)
        except LeaseNotFound:
            self._outcome_lease = None  # gone (etcd restored from backup?): the next tick
            raise  # grants a new one

    async def apply(self, result: TickResult) -> tuple[str, ...]:
        """Every write of ``result``, then its jobs; returns what did not land (a region's
        write, a ladder move, a refusal that lost its compare), for the tick's sentence."""
        lost: list[str] = []
        if result.spec is not None:
            await self.write_spec(result.spec)
        if result.control is not None and not await self.write_control(result.control):
            lost.append("the expired pause's end")
        for hr in result.releases:
            if not await self.release_hold(hr):
                lost.append(f"{hr.unit}'s expired hold's end")
        if result.health:
            await self.write_health(result.health)
        for dropped in result.dropped:
            if not await self.drop_intent(dropped):
                lost.append(f"intent {dropped.intent_id}'s refusal")
        for w in result.writes:
            if await self.write(w):
                self._written(w, result.now)
            else:
                lost.append(f"{w.region}'s write")
        for lw in result.ladder:
            if not await self.write_ladder(lw):
                lost.append(f"{lw.region}'s ladder {lw.kind}")
        self._log_holds(result.ladder_holds)
        for sw in result.scale:
            if not await self.write_scale(sw):
                lost.append(f"{sw.unit}'s scale record")
        self.sizes = dict(result.sizes)
        self.executor.keep_only(result.awaiting)
        for job in result.jobs:
            self.executor.start(job)
        return tuple(lost)

    def _written(self, w: Write, now: float) -> None:
        self.executor.recorded(w.consumes)
        self.traces.written(w)
        if d := w.decision:
            self.observer.transitioned(d)
        fo = w.record.failover
        if fo is not None:
            for step in w.failover_steps:
                self.observer.failover_step_done(w.region, step, fo, now)

    # ---- jobs ----------------------------------------------------------------------------
    def jobs(self) -> Jobs:
        """What the next tick knows of the jobs: results to record, ids running."""
        return self.executor.jobs()

    def _job_done(self) -> None:
        self.job_done.set()

    async def _run_job(self, job: Job) -> PrewarmFigures | None:
        budget = self.topology.prewarm.budget_s
        if job.kind is JobKind.FAILOVER_PREWARM:
            assert job.plan is not None
            log.info(
                "%s: pre-warming %s (budget %.0fs)", job.region, sorted(job.plan.targets), budget
            )
            targets = {"tectonic.targets": ",".join(sorted(job.plan.targets))}
            with self.traces.child(job.region, "prewarm", targets) as span:
                figures = await self.prewarmer.prewarm(job.plan, budget, job.id)
                if span is not None and figures.attained_fraction is not None:
                    span.set_attribute("tectonic.attained_fraction", figures.attained_fraction)
                return figures
        if job.kind is JobKind.RECOVERY_PREWARM:
            with self.traces.child(job.region, "recovery prewarm"):
                return await self._prewarm_home(job, budget)
        await self._aggregate()  # PREFIX_AGGREGATE
        return None

    async def _aggregate(self) -> None:
        try:
            await self.catalogs.run_once()
        except StoreError as e:
            every = self.topology.prefixes.aggregate_interval_s
            log.warning("prefix aggregation failed, retried in %gs: %s", every, e)

    async def _prewarm_home(self, job: Job, budget: float) -> PrewarmFigures:
        """A recovering region's own top prefixes; figures, or why it did nothing."""
        pre = self.prewarmer
        if not isinstance(pre, RecoveryPrewarmer):
            return PrewarmFigures(unsupported=True)
        log.info(
            "%s: pre-warming its own top prefixes before recovery (budget %.0fs)",
            job.region,
            budget,
        )
        try:
            return await pre.prewarm_home(
                job.region, budget, job.id, self.topology.recovery.prewarm_top_fraction
            )
        except asyncio.CancelledError:
            raise
        except Exception:  # recorded, and recovery goes on without it
            log.exception("%s: recovery pre-warm failed", job.region)
            return PrewarmFigures(failed=True)

    async def stop_failovers(self) -> None:
        """Cancel every job (pre-warms, an aggregation) and forget their results (on
        leadership loss or shutdown)."""
        await self.executor.stop()
        self.catalogs.forget()
        self.sizes = {}
