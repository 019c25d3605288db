"""The ``tectonic.v1.ControlPlane`` gRPC service.

Any replica answers: reads come from etcd, reports are stored for the leader to
fold, and operator commands become intents that the leader's loop carries out.
Bad requests get INVALID_ARGUMENT or FAILED_PRECONDITION with a message that says
what to do, and change nothing.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar, cast

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
from controlplane.audit import AuditLog
from controlplane.clock import Clock
from controlplane.codec import CorruptValue, decode, encode
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
from controlplane.session_store import SessionStore, validate_session_id
from controlplane.snapshot_reader import read_snapshot
from controlplane.store.port import Compare, KeyValue, Put, Store, StoreUnavailable

log = logging.getLogger("tectonic.api")

MAX_REASON = 1024
MAX_ACTOR = 128
MAX_TARGETS = 16
DEFAULT_HISTORY = 50
MAX_HISTORY = 1000


Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def _store_errors(fn: Handler) -> Handler:
    """etcd trouble becomes UNAVAILABLE (retryable) instead of an opaque UNKNOWN."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except StoreUnavailable as e:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"etcd is unreachable ({e}); nothing was changed, retry shortly",
            )

    return cast(Handler, wrapper)


async def _abort(ctx: grpc.aio.ServicerContext, code: grpc.StatusCode, msg: str) -> NoReturn:
    await ctx.abort(code, msg)
    raise AssertionError("unreachable")  # ctx.abort raises


class ControlPlaneService(pb_grpc.ControlPlaneServicer):
    def __init__(
        self,
        store: Store,
        keys: Keys,
        topology: Topology,
        clock: Clock,
        replica_id: str,
        is_leader: object,
        sessions: SessionStore | None = None,
    ) -> None:
        self.store, self.keys, self.topology, self.clock = store, keys, topology, clock
        self.replica_id = replica_id
        self._is_leader = is_leader  # a zero-argument callable
        self.audit = AuditLog(keys, f"api-{replica_id}")
        self.sessions = sessions or SessionStore(
            store, keys, regions=topology.names, clock=clock, writer=f"sessions-{replica_id}"
        )

    # ---- helpers -------------------------------------------------------------------
    async def _checked_text(
        self,
        ctx: grpc.aio.ServicerContext,
        name: str,
        value: str,
        limit: int,
        *,
        required: bool,
    ) -> str:
        value = value.strip()
        if required and not value:
            await _abort(
                ctx,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{name} is required: say why, for the audit log",
            )
        if len(value) > limit:
            await _abort(
                ctx,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{name} is at most {limit} characters (got {len(value)})",
            )
        return value

    async def _known_region(self, ctx: grpc.aio.ServicerContext, region: str) -> str:
        if region not in self.topology.names:
            await _abort(
                ctx,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown region {region[:64]!r}; known regions: {', '.join(self.topology.names)}",
            )
        return region

    def _leader_fn(self) -> bool:
        fn = self._is_leader
        return bool(fn()) if callable(fn) else False

    async def _audit_entries(self) -> list[tuple[str, AuditEntry]]:
        page = await self.store.get_prefix(self.keys.audit_prefix())
        out = []
        for kv in page.kvs:
            entry = self._parse_audit(kv)
            if entry:
                out.append(entry)
        return out

    def _parse_audit(self, kv: KeyValue) -> tuple[str, AuditEntry] | None:
        try:
            return kv.key.rsplit("/", 1)[-1], decode(AuditEntry, kv.value, kv.key)
        except CorruptValue:
            return None

    # ---- reads -----------------------------------------------------------------------
    @_store_errors
    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        snap = await read_snapshot(self.store, self.keys, self.topology, self.clock.now())
        return pb.StatusResponse(
            regions=[region_status(snap.regions[r.name], r.zone) for r in self.topology.regions],
            paused=snap.control.paused,
            pause_reason=snap.control.reason,
            leader=snap.leader,
            responder=self.replica_id,
            responder_is_leader=self._leader_fn(),
            generated_at=snap.now,
        )

    @_store_errors
    async def GetHistory(
        self, request: pb.HistoryRequest, context: grpc.aio.ServicerContext
    ) -> pb.HistoryResponse:
        if request.region:
            await self._known_region(context, request.region)
        limit = request.limit or DEFAULT_HISTORY
        if limit > MAX_HISTORY:
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"limit is at most {MAX_HISTORY}"
            )
        entries = [
            (k, a)
            for k, a in await self._audit_entries()
            if not request.region or a.region == request.region
        ]
        return pb.HistoryResponse(events=[event_to_pb(k, a) for k, a in entries[-limit:]])

    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Event]:
        if request.region:
            await self._known_region(context, request.region)
        if request.replay > MAX_HISTORY:
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"replay is at most {MAX_HISTORY}"
            )
        page = await self.store.get_prefix(self.keys.audit_prefix())
        wanted = [
            e
            for kv in page.kvs
            if (e := self._parse_audit(kv))
            and (not request.region or e[1].region == request.region)
        ]
        for key_id, entry in wanted[-request.replay :] if request.replay else []:
            yield event_to_pb(key_id, entry)
        async for ev in self.store.watch_prefix(
            self.keys.audit_prefix(), start_revision=page.revision + 1
        ):
            parsed = self._parse_audit(ev.kv) if ev.kv.value else None
            if parsed and (not request.region or parsed[1].region == request.region):
                yield event_to_pb(*parsed)

    # ---- observations ----------------------------------------------------------------
    @_store_errors
    async def ReportHealth(
        self, request: pb.HealthReport, context: grpc.aio.ServicerContext
    ) -> pb.ReportHealthResponse:
        health, kind = health_from_pb(request.health), kind_from_pb(request.kind)
        if health is None or kind is None:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "health and kind must be set (e.g. health=HEALTHY, kind=AGENT)",
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
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        await store_report(self.store, self.keys, report)
        return pb.ReportHealthResponse(accepted=True)

    # ---- operator commands -----------------------------------------------------------
    async def _submit(self, intent: Intent, audit: AuditEntry) -> None:
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

    @_store_errors
    async def RequestFailover(
        self, request: pb.FailoverRequest, context: grpc.aio.ServicerContext
    ) -> pb.FailoverResponse:
        region = await self._known_region(context, request.region)
        reason = await self._checked_text(
            context, "reason", request.reason, MAX_REASON, required=True
        )
        actor = (
            await self._checked_text(context, "actor", request.actor, MAX_ACTOR, required=False)
            or "operator"
        )
        if len(request.to) > MAX_TARGETS:
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"at most {MAX_TARGETS} targets"
            )
        for t in request.to:
            await self._known_region(context, t)
        snap = await read_snapshot(self.store, self.keys, self.topology, self.clock.now())
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
            await _abort(context, code, str(e))
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
        await self._submit(
            intent,
            AuditEntry(
                at=snap.now,
                actor=actor,
                action="intent_failover",
                region=region,
                reason=reason,
                result="accepted",
                details={
                    "intent": intent.id,
                    "force": str(request.force),
                    "to": ",".join(request.to),
                },
            ),
        )
        return pb.FailoverResponse(accepted=True, intent_id=intent.id, plan=plan_to_pb(plan))

    @_store_errors
    async def RequestRecovery(
        self, request: pb.RecoveryRequest, context: grpc.aio.ServicerContext
    ) -> pb.IntentResponse:
        region = await self._known_region(context, request.region)
        reason = await self._checked_text(
            context, "reason", request.reason, MAX_REASON, required=True
        )
        actor = (
            await self._checked_text(context, "actor", request.actor, MAX_ACTOR, required=False)
            or "operator"
        )
        snap = await read_snapshot(self.store, self.keys, self.topology, self.clock.now())
        state = snap.regions[region].record.state
        if state is not RegionState.FAILING_OVER:
            await _abort(
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
        await self._submit(
            intent,
            AuditEntry(
                at=snap.now,
                actor=actor,
                action="intent_recover",
                region=region,
                reason=reason,
                result="accepted",
                details={"intent": intent.id},
            ),
        )
        return pb.IntentResponse(accepted=True, intent_id=intent.id)

    async def _set_paused(
        self, paused: bool, request: pb.PauseRequest, context: grpc.aio.ServicerContext
    ) -> pb.PauseResponse:
        reason = await self._checked_text(
            context, "reason", request.reason, MAX_REASON, required=paused
        )
        actor = (
            await self._checked_text(context, "actor", request.actor, MAX_ACTOR, required=False)
            or "operator"
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

    @_store_errors
    async def Pause(
        self, request: pb.PauseRequest, context: grpc.aio.ServicerContext
    ) -> pb.PauseResponse:
        return await self._set_paused(True, request, context)

    @_store_errors
    async def Resume(
        self, request: pb.PauseRequest, context: grpc.aio.ServicerContext
    ) -> pb.PauseResponse:
        return await self._set_paused(False, request, context)

    # ---- sticky sessions ---------------------------------------------------------------
    async def _session_id(self, ctx: grpc.aio.ServicerContext, session_id: str) -> str:
        try:
            return validate_session_id(session_id)
        except ValueError as e:
            await _abort(ctx, grpc.StatusCode.INVALID_ARGUMENT, str(e))

    @_store_errors
    async def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SessionInfo:
        sid = await self._session_id(context, request.session_id)
        try:
            got = await self.sessions.get(sid)
        except CorruptValue as e:
            await _abort(context, grpc.StatusCode.DATA_LOSS, f"{e}; PinSession overwrites it")
        if got is None:
            return pb.SessionInfo(session_id=sid, found=False)  # not an error: new or expired
        return _session_info(sid, got[0])

    @_store_errors
    async def PinSession(
        self, request: pb.PinSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SessionInfo:
        sid = await self._session_id(context, request.session_id)
        region = await self._known_region(context, request.region)
        home = await self._known_region(context, request.home) if request.home else None
        reason = await self._checked_text(
            context, "reason", request.reason, MAX_REASON, required=True
        )
        actor = (
            await self._checked_text(context, "actor", request.actor, MAX_ACTOR, required=False)
            or "operator"
        )
        try:
            pin = await self.sessions.pin(sid, region, home=home, actor=actor, reason=reason)
        except ValueError as e:  # SessionContention is temporary: UNAVAILABLE, above
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
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
