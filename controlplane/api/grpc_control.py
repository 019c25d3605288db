"""The gRPC methods that stop automation for a while: ``Pause``/``Resume`` (every unit)
and ``Hold``/``Release`` (one failover unit), what ``failoverctl pause`` and ``hold``
call.

A mixin of ``ControlPlaneService`` (it uses the service's store, keys, topology, clock
and audit log). Each ends by itself: the leader's tick releases a hold or resumes a pause
past its end and audits it (``controlplane/core/publish.py``); manual commands work
throughout.
"""

from __future__ import annotations

import logging

import grpc
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.api.rpc_checks import bad_request, known_region, reason_and_actor, store_errors
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import (
    AuditAction,
    AuditEntry,
    ControlFlags,
    RegionHold,
    pause_length,
)
from controlplane.kernel.store.port import Delete, Put, Store

log = logging.getLogger("tectonic.api")


class ControlMethods:
    store: Store
    keys: Keys
    topology: Topology
    clock: Clock
    audit: AuditLog

    async def _length(self, context: grpc.aio.ServicerContext, for_s: float) -> float:
        try:
            return pause_length(for_s)
        except ValueError as e:
            await bad_request(context, str(e).replace("pause", "pause or hold"))

    async def _set_paused(
        self, paused: bool, request: pb.PauseRequest, context: grpc.aio.ServicerContext
    ) -> pb.PauseResponse:
        reason, actor = await reason_and_actor(context, request.reason, request.actor)
        now = self.clock.now()
        until = now + await self._length(context, request.for_s) if paused else None
        flags = ControlFlags(paused=paused, reason=reason, actor=actor, at=now, until=until)
        await self.store.txn(
            [],
            [
                Put(self.keys.control(), encode(flags)),
                self.audit.op(
                    AuditEntry(
                        at=now,
                        actor=actor,
                        action=AuditAction.PAUSE if paused else AuditAction.RESUME,
                        reason=reason,
                        details={"until": f"{until:.3f}"} if until is not None else {},
                    )
                ),
            ],
        )
        log.warning(
            "automation %s by %s: %s%s",
            "paused" if paused else "resumed",
            actor,
            reason,
            f" (until {until:.0f}, in {until - now:.0f} s)" if until is not None else "",
        )
        return pb.PauseResponse(paused=paused)

    @store_errors
    async def Pause(
        self, request: pb.PauseRequest, context: grpc.aio.ServicerContext
    ) -> pb.PauseResponse:
        return await self._set_paused(True, request, context)

    @store_errors
    async def Resume(
        self, request: pb.PauseRequest, context: grpc.aio.ServicerContext
    ) -> pb.PauseResponse:
        return await self._set_paused(False, request, context)

    @store_errors
    async def Hold(
        self, request: pb.HoldRequest, context: grpc.aio.ServicerContext
    ) -> pb.HoldResponse:
        """Holds one unit (a hold already there is replaced: holding again extends or
        shortens it)."""
        unit = await known_region(context, self.topology, request.region)
        reason, actor = await reason_and_actor(context, request.reason, request.actor)
        now = self.clock.now()
        until = now + await self._length(context, request.for_s)
        hold = RegionHold(unit=unit, reason=reason, actor=actor, at=now, until=until)
        entry = AuditEntry(
            at=now,
            actor=actor,
            action=AuditAction.HOLD,
            region=unit,
            reason=reason,
            details={"until": f"{until:.3f}"},
        )
        await self.store.txn(
            [], [Put(self.keys.region_hold(unit), encode(hold)), self.audit.op(entry)]
        )
        log.warning(
            "%s held by %s until %.0f (in %.0f s): %s", unit, actor, until, until - now, reason
        )
        return pb.HoldResponse(region=unit, held=True, until=until)

    @store_errors
    async def Release(
        self, request: pb.HoldRequest, context: grpc.aio.ServicerContext
    ) -> pb.HoldResponse:
        """Ends a unit's hold now; releasing a unit that is not held is audited all the
        same (the operator's word is on record) and changes nothing else."""
        unit = await known_region(context, self.topology, request.region)
        reason, actor = await reason_and_actor(context, request.reason, request.actor)
        entry = AuditEntry(
            at=self.clock.now(), actor=actor, action=AuditAction.RELEASE, region=unit, reason=reason
        )
        await self.store.txn([], [Delete(self.keys.region_hold(unit)), self.audit.op(entry)])
        log.warning("%s released by %s: %s", unit, actor, reason)
        return pb.HoldResponse(region=unit, held=False, until=0.0)
