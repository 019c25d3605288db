"""The gRPC methods of the cost guardrail (docs/scaling.md, "Cost"): ``GetCost`` (what
``failoverctl cost show`` prints) and ``LiftBudget``/``UnliftBudget`` (``failoverctl
cost lift``/``unlift``).

A mixin of ``ControlPlaneService``. A lift is stored and ended as a hold is
(``grpc_control.py``): one audited write of ``regions/<unit>/budget-lift``, ended by the
leader's tick at its ``until`` (``core/publish.py``), or by an operator before.
"""

from __future__ import annotations

import logging

import grpc
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.api.reads import Reads
from controlplane.api.rpc_checks import (
    abort,
    bad_request,
    known_region,
    reason_and_actor,
    store_errors,
)
from controlplane.core.spend import cost_report
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditAction, AuditEntry, pause_length
from controlplane.kernel.pool.cost import BudgetLift
from controlplane.kernel.store.port import Delete, Put, Store

log = logging.getLogger("tectonic.api")


class CostMethods:
    store: Store
    keys: Keys
    topology: Topology
    clock: Clock
    audit: AuditLog
    reads: Reads

    @store_errors
    async def GetCost(
        self, request: pb.CostRequest, context: grpc.aio.ServicerContext
    ) -> pb.CostResponse:
        snap = await self.reads.snapshot()
        report = cost_report(snap, self.topology)
        return pb.CostResponse(
            report_json=encode(report) if report is not None else b"", generated_at=snap.now
        )

    async def _pool(self, context: grpc.aio.ServicerContext, region: str) -> str:
        """A known unit, in a topology with budgets (no ``cost:``: nothing to lift)."""
        unit = await known_region(context, self.topology, region)
        if self.topology.cost is None:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "this topology has no cost: section, so no budget binds and none can be lifted",
            )
        return unit

    @store_errors
    async def LiftBudget(
        self, request: pb.HoldRequest, context: grpc.aio.ServicerContext
    ) -> pb.HoldResponse:
        """Lifts one pool's budget (a lift already there is replaced: lifting again
        extends or shortens it)."""
        unit = await self._pool(context, request.region)
        reason, actor = await reason_and_actor(context, request.reason, request.actor)
        try:
            length = pause_length(request.for_s)
        except ValueError as e:
            await bad_request(
                context,
                str(e).replace("a pause", "a budget lift").replace("pause again", "lift again"),
            )
        now = self.clock.now()
        until = now + length
        lift = BudgetLift(unit=unit, reason=reason, actor=actor, at=now, until=until)
        entry = AuditEntry(
            at=now,
            actor=actor,
            action=AuditAction.BUDGET_LIFT,
            region=unit,
            reason=reason,
            details={"until": f"{until:.3f}"},
        )
        await self.store.txn(
            [], [Put(self.keys.budget_lift(unit), encode(lift)), self.audit.op(entry)]
        )
        log.warning(
            "%s: budget lifted by %s until %.0f (in %.0f s): %s",
            unit,
            actor,
            until,
            length,
            reason,
        )
        return pb.HoldResponse(region=unit, held=True, until=until)

    @store_errors
    async def UnliftBudget(
        self, request: pb.HoldRequest, context: grpc.aio.ServicerContext
    ) -> pb.HoldResponse:
        """Ends a pool's budget lift now (audited even when there was none)."""
        unit = await self._pool(context, request.region)
        reason, actor = await reason_and_actor(context, request.reason, request.actor)
        entry = AuditEntry(
            at=self.clock.now(),
            actor=actor,
            action=AuditAction.BUDGET_UNLIFT,
            region=unit,
            reason=reason,
        )
        await self.store.txn([], [Delete(self.keys.budget_lift(unit)), self.audit.op(entry)])
        log.warning("%s: budget lift ended by %s: %s", unit, actor, reason)
        return pb.HoldResponse(region=unit, held=False, until=0.0)
