"""The ``tectonic.v1.ControlPlane`` gRPC service.

Any replica answers: reads come from etcd, reports are stored for the leader to
fold, and operator commands become intents that the leader's loop carries out.
Bad requests get INVALID_ARGUMENT or FAILED_PRECONDITION with a message that says
what to do, and change nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable

import grpc
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from controlplane.api.convert import (
    event_to_pb,
    health_from_pb,
    kind_from_pb,
    plan_to_pb,
    region_status,
)
from controlplane.api.grpc_drills import DrillMethods
from controlplane.api.reads import BadRead, Reads
from controlplane.api.rpc_checks import (
    abort,
    bad_request,
    known_region,
    reason_and_actor,
    session_id,
    store_errors,
)
from controlplane.audit import AuditLog
from controlplane.clock import Clock
from controlplane.codec import CorruptValue, encode
from controlplane.config import Topology
from controlplane.core.failover import PlanRefused, plan_failover
from controlplane.core.model import (
    AuditEntry,
    ControlFlags,
    Intent,
    IntentKind,
    RegionState,
)
from controlplane.core.sessions import SessionPin
from controlplane.keys import Keys
from controlplane.reports import BadReport, store_report, validate_report
from controlplane.session_store import SessionStore
from controlplane.store.port import Compare, Put, Store, StoreUnavailable

log = logging.getLogger("tectonic.api")

MAX_TARGETS = 16


class ControlPlaneService(DrillMethods, pb_grpc.ControlPlaneServicer):
    def __init__(
        self,
        store: Store,
        keys: Keys,
        topology: Topology,
        clock: Clock,
        replica_id: str,
        is_leader: Callable[[], bool],
        sessions: SessionStore | None = None,
    ) -> None:
        self.store, self.keys, self.topology, self.clock = store, keys, topology, clock
        self.replica_id = replica_id
        # The read paths (and their validation messages) are shared with the HTTP API.
        self.reads = Reads(store, keys, topology, clock, replica_id, is_leader)
        self.audit = AuditLog(keys, f"api-{replica_id}")
        self.sessions = sessions or SessionStore(
            store, keys, regions=topology.names, clock=clock, writer=f"sessions-{replica_id}"
        )

    # ---- helpers -------------------------------------------------------------------
    async def _known_region(self, ctx: grpc.aio.ServicerContext, region: str) -> str:
        return await known_region(ctx, self.topology, region)

    # ---- reads -----------------------------------------------------------------------
    @store_errors
    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        snap = await self.reads.snapshot()
        return pb.StatusResponse(
            regions=[region_status(snap.regions[r.name], r.zone) for r in self.topology.regions],
            paused=snap.control.paused,
            pause_reason=snap.control.reason,
            leader=snap.leader,
            responder=self.replica_id,
            responder_is_leader=self.reads.is_leader(),
            generated_at=snap.now,
        )

    @store_errors
    async def GetHistory(
        self, request: pb.HistoryRequest, context: grpc.aio.ServicerContext
    ) -> pb.HistoryResponse:
        try:
            records = await self.reads.history(request.region, request.limit)
        except BadRead as e:
            await bad_request(context, str(e))
        return pb.HistoryResponse(events=[event_to_pb(r.id, r.entry) for r in records])

    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Event]:
        try:
            stream = self.reads.events(request.region, request.replay)
        except BadRead as e:
            await bad_request(context, str(e))
        async for rec in stream:
            yield event_to_pb(rec.id, rec.entry)

    # ---- observations ----------------------------------------------------------------
    @store_errors
    async def ReportHealth(
        self, request: pb.HealthReport, context: grpc.aio.ServicerContext
    ) -> pb.ReportHealthResponse:
        health, kind = health_from_pb(request.health), kind_from_pb(request.kind)
        if health is None or kind is None:
            await bad_request(
                context, "health and kind must be set (e.g. health=HEALTHY, kind=AGENT)"
            )
        try:
            report = validate_report(
                self.topology,
                region=request.region,
                observer=request.observer,
                kind=kind,
                health=health,
                signals=dict(request.signals),
                detail=request.detail,
                now=self.clock.now(),
            )
        except BadReport as e:
            await bad_request(context, str(e))
        await store_report(self.store, self.keys, report)
        return pb.ReportHealthResponse(accepted=True)

    # ---- operator commands -----------------------------------------------------------
    async def _submit(self, intent: Intent, **details: str) -> None:
        """Store the intent for the leader's loop and its ``intent_<kind>`` audit entry
        (``details`` after the intent's id) in one transaction."""
        audit = AuditEntry(
            at=intent.created_at,
            actor=intent.actor,
            action=f"intent_{intent.kind.value}",
            region=intent.region,
            reason=intent.reason,
            result="accepted",
            details={"intent": intent.id, **details},
        )
        ok = (
            await self.store.txn(
                [Compare.absent(self.keys.intent(intent.id))],
                [Put(self.keys.intent(intent.id), encode(intent)), self.audit.op(audit)],
            )
        ).succeeded
        if not ok:
            raise StoreUnavailable("intent id collision; retry")
        log.warning(
            "intent %s: %s %s by %s: %s",
            intent.id,
            intent.kind.value,
            intent.region,
            intent.actor,
            intent.reason,
        )

    @store_errors
    async def RequestFailover(
        self, request: pb.FailoverRequest, context: grpc.aio.ServicerContext
    ) -> pb.FailoverResponse:
        region = await self._known_region(context, request.region)
        reason, actor = await reason_and_actor(context, request.reason, request.actor)
        if len(request.to) > MAX_TARGETS:
            await bad_request(context, f"at most {MAX_TARGETS} targets")
        for t in request.to:
            await self._known_region(context, t)
        snap = await self.reads.snapshot()
        try:
            plan = plan_failover(
                snap,
                self.topology,
                region,
                reason=reason,
                actor=actor,
                requested=list(request.to),
                forced=request.force,
                manual=True,
            )
        except PlanRefused as e:
            code = (
                grpc.StatusCode.INVALID_ARGUMENT
                if e.code == "unknown_region"
                else grpc.StatusCode.FAILED_PRECONDITION
            )
            await abort(context, code, str(e))
        if request.dry_run:
            return pb.FailoverResponse(accepted=False, plan=plan_to_pb(plan), dry_run=True)
        intent = Intent(
            id=uuid.uuid4().hex[:12],
            kind=IntentKind.FAILOVER,
            region=region,
            targets=tuple(request.to),
            reason=reason,
            actor=actor,
            force=request.force,
            created_at=snap.now,
        )
        await self._submit(intent, force=str(request.force), to=",".join(request.to))
        return pb.FailoverResponse(accepted=True, intent_id=intent.id, plan=plan_to_pb(plan))

    @store_errors
    async def RequestRecovery(
        self, request: pb.RecoveryRequest, context: grpc.aio.ServicerContext
    ) -> pb.IntentResponse:
        region = await self._known_region(context, request.region)
        reason, actor = await reason_and_actor(context, request.reason, request.actor)
        snap = await self.reads.snapshot()
        state = snap.regions[region].record.state
        if state is not RegionState.FAILING_OVER:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{region} is {state.value}; only a FAILING_OVER region can be recovered",
            )
        intent = Intent(
            id=uuid.uuid4().hex[:12],
            kind=IntentKind.RECOVER,
            region=region,
            reason=reason,
            actor=actor,
            created_at=snap.now,
        )
        await self._submit(intent)
        return pb.IntentResponse(accepted=True, intent_id=intent.id)

    async def _set_paused(
        self, paused: bool, request: pb.PauseRequest, context: grpc.aio.ServicerContext
    ) -> pb.PauseResponse:
        reason, actor = await reason_and_actor(
            context, request.reason, request.actor, reason_required=paused
        )
        now = self.clock.now()
        flags = ControlFlags(paused=paused, reason=reason, actor=actor, at=now)
        await self.store.txn(
            [],
            [
                Put(self.keys.control(), encode(flags)),
                self.audit.op(
                    AuditEntry(
                        at=now, actor=actor, action="pause" if paused else "resume", reason=reason
                    )
                ),
            ],
        )
        log.warning("automation %s by %s: %s", "paused" if paused else "resumed", actor, reason)
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

    # ---- sticky sessions ---------------------------------------------------------------
    @store_errors
    async def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SessionInfo:
        sid = await session_id(context, request.session_id)
        try:
            got = await self.sessions.get(sid)
        except CorruptValue as e:
            await abort(context, grpc.StatusCode.DATA_LOSS, f"{e}; PinSession overwrites it")
        if got is None:
            return pb.SessionInfo(session_id=sid, found=False)  # not an error: new or expired
        return _session_info(sid, got[0])

    @store_errors
    async def PinSession(
        self, request: pb.PinSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SessionInfo:
        sid = await session_id(context, request.session_id)
        region = await self._known_region(context, request.region)
        home = await self._known_region(context, request.home) if request.home else None
        reason, actor = await reason_and_actor(context, request.reason, request.actor)
        try:
            pin = await self.sessions.pin(sid, region, home=home, actor=actor, reason=reason)
        except ValueError as e:  # SessionContention is temporary: UNAVAILABLE, above
            await bad_request(context, str(e))
        return _session_info(sid, pin)


def _session_info(session_id: str, pin: SessionPin) -> pb.SessionInfo:
    return pb.SessionInfo(
        session_id=session_id,
        found=True,
        home=pin.home,
        region=pin.region,
        epoch=pin.epoch,
        pinned_at=pin.pinned_at,
        moves=pin.moves,
    )
