"""Carries out what the pure core decided: every write is one fenced transaction.

Fencing: each transaction also compares the leader key's value and create
revision, so a replica that lost leadership (even one paused past its lease) can
no longer change anything. A failed compare is not an error: the next tick
re-reads the snapshot and decides again (level-triggered).

Steps that take time run as background tasks, one per region at a time, each recorded
when done so that a new leader resumes at the first missing one: a failover's
(pre-warm the targets, switch routing) and a recovery's pre-warm of the home region
before its first traffic step (``RecoveryPrewarmer``; a prewarmer without that method,
or one that fails, records the step with its reason, and recovery goes on).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from controlplane.core.actions import DropIntent, TickResult, Write, WriteHealth
from controlplane.core.intents import IntentOutcome
from controlplane.core.steps import (
    failover_step_write,
    pending_steps,
    recovery_pending,
    recovery_step_write,
)
from controlplane.election import NotLeader
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import (
    AuditAction,
    AuditEntry,
    Decision,
    FailoverProgress,
    FailoverStep,
    Intent,
    PrewarmFigures,
    RecoveryStep,
    Routing,
)
from controlplane.kernel.session_store import SessionStore
from controlplane.kernel.snapshot_reader import read_snapshot
from controlplane.kernel.store.port import (
    MAX_TXN_OPS,
    Compare,
    Delete,
    LeaseNotFound,
    Op,
    Put,
    Store,
    TxnResult,
)
from controlplane.prewarm import Prewarmer

log = logging.getLogger("tectonic.orchestrator")

# An intent's outcome stays readable (GetIntent) a day at least; outcomes share one lease
# per hour, so a busy day grants 24 leases, not one per intent.
INTENT_OUTCOME_TTL_S = 24 * 3600
OUTCOME_LEASE_REUSE_S = 3600

Fence = Callable[[], Sequence[Compare]]


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


class Orchestrator:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        topology: Topology,
        clock: Clock,
        fence: Fence,
        prewarmer: Prewarmer,
        actor: str,
        sessions: SessionStore | None = None,
        observer: WriteObserver | None = None,
    ) -> None:
        self.store, self.keys, self.topology, self.clock = store, keys, topology, clock
        self.fence, self.prewarmer, self.actor = fence, prewarmer, actor
        self.sessions, self.observer = sessions, observer
        self.audit = AuditLog(keys, actor)
        self._failovers: dict[str, asyncio.Task[None]] = {}
        self._repins: dict[str, asyncio.Task[None]] = {}
        self._recoveries: dict[str, asyncio.Task[None]] = {}
        self._outcome_lease: tuple[int, float] | None = None  # (lease id, granted at)

    # ---- writes ------------------------------------------------------------------------
    async def write(self, w: Write) -> bool:
        """One region's change as one fenced CAS transaction. False if it lost a race."""
        compares = [
            *self.fence(),
            Compare.mod_revision(self.keys.region_state(w.region), w.expected_rev),
        ]
        compares += [
            Compare.mod_revision(self.keys.routing(r), rev) for r, rev in w.routing_revs.items()
        ]
        ops: list[Op] = [Put(self.keys.region_state(w.region), encode(w.record))]
        ops += [Put(self.keys.routing(r), encode(v)) for r, v in w.routing.items()]
        ops += [self.audit.op(a) for a in w.audit]
        if w.intent_outcome is not None:
            ops += await self._resolve_intent_ops(w.intent_outcome)
        res = await self._txn(compares, ops)
        if not res.succeeded:
            log.info(
                "write for %s lost a race (state or routing changed, or leadership "
                "lost); the next tick re-decides",
                w.region,
            )
        return res.succeeded

    async def write_health(self, items: Sequence[WriteHealth]) -> None:
        ops = [Put(self.keys.region_health(h.region), encode(h.health)) for h in items]
        for i in range(0, len(ops), MAX_TXN_OPS):
            await self.store.txn(list(self.fence()), ops[i : i + MAX_TXN_OPS])

    async def drop_intent(self, d: DropIntent) -> None:
        log.warning("intent %s refused: %s", d.intent_id, d.audit.result)
        ops = [self.audit.op(d.audit), *await self._resolve_intent_ops(d.outcome)]
        await self._txn([*self.fence()], ops)

    # ---- operator intents' outcomes -------------------------------------------------------
    async def _resolve_intent_ops(self, outcome: IntentOutcome) -> list[Op]:
        """Delete the intent, record its outcome (GetIntent reads it) and free the
        region's claim if it is this intent's (the API then takes the next one)."""
        ops: list[Op] = [
            Delete(self.keys.intent(outcome.id)),
            Put(self.keys.intent_outcome(outcome.id), encode(outcome), await self._lease()),
        ]
        claim = self.keys.intent_claim(outcome.region)
        kv = await self.store.get(claim)
        if kv is not None and _claim_holder(kv.value, claim) in (outcome.id, None):
            ops.append(Delete(claim))  # ours, or unreadable (then it would block forever)
        return ops

    async def _lease(self) -> int:
        now = self.clock.now()
        if self._outcome_lease is None or now - self._outcome_lease[1] >= OUTCOME_LEASE_REUSE_S:
            ttl = INTENT_OUTCOME_TTL_S + OUTCOME_LEASE_REUSE_S
            self._outcome_lease = (await self.store.grant_lease(ttl), now)
        return self._outcome_lease[0]

    async def _txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> TxnResult:
        try:
            return await self.store.txn(compares, ops)
        except LeaseNotFound:
            self._outcome_lease = None  # gone (etcd restored from backup?): the next tick
            raise  # grants a new one

    async def apply(self, result: TickResult) -> None:
        if result.health:
            await self.write_health(result.health)
        for dropped in result.dropped:
            await self.drop_intent(dropped)
        for w in result.writes:
            if await self.write(w) and w.decision:
                d = w.decision
                log.warning(
                    "%s: %s -> %s (%s by %s): %s",
                    d.region,
                    d.from_state.value,
                    d.to_state.value,
                    d.trigger,
                    d.actor,
                    d.reason,
                )
                if self.observer is not None:
                    self.observer.transitioned(d)
        for f in result.failovers:
            self.ensure_failover(f.region)
        for r in result.recoveries:
            self.ensure_recovery(r.region)

    # ---- failover steps ---------------------------------------------------------------
    def ensure_failover(self, region: str) -> None:
        """Run the region's pending failover steps in the background, once at a time."""
        task = self._failovers.get(region)
        if task is not None and not task.done():
            return
        self._failovers[region] = asyncio.create_task(
            self._run_failover(region), name=f"failover-{region}"
        )

    async def _run_failover(self, region: str) -> None:
        try:
            while True:
                snap = await read_snapshot(self.store, self.keys, self.topology, self.clock.now())
                steps = pending_steps(snap.regions[region].record)
                if not steps:
                    return
                step = steps[0]
                result: PrewarmFigures | None = None
                fo = snap.regions[region].record.failover
                if step is FailoverStep.PREWARM and fo is not None:
                    log.info(
                        "%s: pre-warming %s (budget %.0fs)",
                        region,
                        sorted(fo.plan.targets),
                        self.topology.prewarm.budget_s,
                    )
                    result = await self.prewarmer.prewarm(
                        fo.plan, self.topology.prewarm.budget_s, f"{region}@{fo.started_at:.3f}"
                    )
                    snap = await read_snapshot(
                        self.store, self.keys, self.topology, self.clock.now()
                    )
                try:
                    w = failover_step_write(snap, region, step, self.actor, result)
                except ValueError as e:
                    log.warning("%s: %s", region, e)
                    return
                if not await self.write(w):
                    return
                if self.observer is not None and w.record.failover is not None:
                    self.observer.failover_step_done(region, step, w.record.failover, snap.now)
                if step is FailoverStep.SWITCH:
                    log.warning(
                        "%s: routing switched: %s",
                        region,
                        {k: v.targets for k, v in w.routing.items()},
                    )
                    self._start_repin(region, {**snap.routings(), **w.routing})
        except asyncio.CancelledError:
            raise
        except Exception:
            # The next tick sees the step still pending and starts a new attempt.
            log.exception("%s: failover step failed; will retry next tick", region)

    # ---- recovery steps before traffic returns ---------------------------------------------
    def ensure_recovery(self, region: str) -> None:
        """Run the region's pending recovery steps in the background, once at a time."""
        task = self._recoveries.get(region)
        if task is not None and not task.done():
            return
        self._recoveries[region] = asyncio.create_task(
            self._run_recovery(region), name=f"recovery-{region}"
        )

    async def _run_recovery(self, region: str) -> None:
        try:
            while True:
                snap = await read_snapshot(self.store, self.keys, self.topology, self.clock.now())
                rec = snap.regions[region].record
                steps = recovery_pending(rec)
                if not steps:
                    return
                result = await self._recovery_step(region, steps[0], rec.since)
                snap = await read_snapshot(self.store, self.keys, self.topology, self.clock.now())
                try:
                    w = recovery_step_write(snap, region, steps[0], self.actor, result)
                except ValueError as e:  # relapsed, given up by the core, or done by another
                    log.info("%s: %s", region, e)
                    return
                if not await self.write(w):
                    return
                log.warning("%s: recovery %s recorded: %s", region, steps[0].value, result)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: recovery step failed; will retry next tick", region)

    async def _recovery_step(self, region: str, step: RecoveryStep, since: float) -> PrewarmFigures:
        """Carry out ``step`` (the pre-warm); its figures, or why it did nothing."""
        pre = self.prewarmer
        if not isinstance(pre, RecoveryPrewarmer):
            return PrewarmFigures(unsupported=True)
        budget = self.topology.prewarm.budget_s
        log.info(
            "%s: pre-warming its own top prefixes before recovery (budget %.0fs)", region, budget
        )
        try:
            return await pre.prewarm_home(
                region,
                budget,
                f"{region}@recovery@{since:.3f}",
                self.topology.recovery.prewarm_top_fraction,
            )
        except asyncio.CancelledError:
            raise
        except Exception:  # recorded, and recovery goes on without it
            log.exception("%s: recovery pre-warm failed", region)
            return PrewarmFigures(failed=True)

    # ---- background session re-pin -------------------------------------------------------
    def _start_repin(self, region: str, routings: dict[str, Routing]) -> None:
        """Off the critical path: the switch is already written, and gateways re-pin
        lazily anyway; this only spares them the write on each session's next request."""
        if self.sessions is None:
            return
        old = self._repins.get(region)
        if old is not None and not old.done():
            old.cancel()  # a newer switch of the same region: its routing wins
        self._repins[region] = asyncio.create_task(
            self._repin(self.sessions, region, routings), name=f"repin-{region}"
        )

    async def _repin(
        self, sessions: SessionStore, region: str, routings: dict[str, Routing]
    ) -> None:
        try:
            report = await sessions.repin_away(region, routings)
            log.warning("%s", report.summary())
            entry = AuditEntry(
                at=self.clock.now(),
                actor=self.actor,
                action=AuditAction.SESSIONS_REPINNED,
                region=region,
                reason=f"background re-pin after the routing switch of {region}",
                details=report.details(),
            )
            if not (await self.store.txn([*self.fence()], [self.audit.op(entry)])).succeeded:
                log.info("%s: re-pin report not audited: leadership lost", region)
        except asyncio.CancelledError:
            raise
        except NotLeader:
            log.info("%s: re-pin report not audited: no longer leader", region)
        except Exception:
            log.exception("%s: background session re-pin failed; sessions re-pin lazily", region)

    async def stop_failovers(self) -> None:
        """Cancel failover and recovery steps and session re-pins (on leadership loss or
        shutdown)."""
        running = (*self._failovers.values(), *self._repins.values(), *self._recoveries.values())
        tasks = [t for t in running if not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._failovers.clear()
        self._repins.clear()
        self._recoveries.clear()

    def failovers_running(self) -> list[str]:
        return sorted(r for r, t in self._failovers.items() if not t.done())


def _claim_holder(raw: bytes, key: str) -> str | None:
    """The id of the intent holding a region's claim; None if the value is unreadable."""
    try:
        return decode(Intent, raw, key).id
    except CorruptValue:
        return None
