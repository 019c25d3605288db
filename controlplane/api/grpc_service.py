"""The ``tectonic.v1.ControlPlane`` gRPC service.

Any replica answers: reads come from etcd, reports are stored for the leader to
fold, and operator commands become intents that the leader's loop carries out.
Bad requests get INVALID_ARGUMENT or FAILED_PRECONDITION with a message that says
what to do, and change nothing.

One intent per region is pending at a time: an intent is stored together with the
region's claim (``intent-claims/<r>``, created only if absent) and only while the
region's record is as the checks saw it, so of two concurrent commands for one region
one is accepted and the other refused at once, with the reason. ``GetIntent`` reads
what the leader did with an accepted one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from controlplane.api.convert import (
    capacity_record_to_pb,
    event_to_pb,
    intent_status_to_pb,
    kind_from_pb,
    plan_to_pb,
    region_status,
    store_writes_to_pb,
)
from controlplane.api.grpc_control import ControlMethods
from controlplane.api.grpc_cost import CostMethods
from controlplane.api.grpc_drills import DrillMethods
from controlplane.api.reads import BadRead, Reads, capacity_view
from controlplane.api.rpc_checks import (
    abort,
    bad_request,
    known_region,
    reason_and_actor,
    session_id,
    store_errors,
)
from controlplane.core.failover import PlanRefused, plan_failover
from controlplane.core.intents import IntentOutcome, IntentStatus, outcome_details, pending
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.config import Topology
from controlplane.kernel.details import flag, json_list
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.model import Ladder
from controlplane.kernel.model import (
    AuditAction,
    AuditEntry,
    Intent,
    IntentKind,
    RegionState,
)
from controlplane.kernel.rpc.health_report import health_from_pb, thresholds_to_pb
from controlplane.kernel.sessions.resolve import SessionPin
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.snapshot import Snapshot
from controlplane.kernel.store.group_commit import GroupCommit
from controlplane.kernel.store.port import Compare, Put, Store
from controlplane.reports import BadReport, store_report, validate_report

log = logging.getLogger("tectonic.api")

MAX_TARGETS = 16
# Tries to store an intent while the region's record keeps changing under the checks.
SUBMIT_ATTEMPTS = 3
INTENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Submission:
    """What one attempt's checks (on a fresh snapshot) found to store: the intent and its
    audit details; ``intent`` None stores nothing (a dry run). A refusal aborts instead."""

    intent: Intent | None
    details: dict[str, str] = field(default_factory=dict)
    plan: pb.FailoverPlan | None = None


Build = Callable[[Snapshot], Awaitable[Submission]]


class ControlPlaneService(ControlMethods, CostMethods, DrillMethods, pb_grpc.ControlPlaneServicer):
    def __init__(
        self,
        store: Store,
        keys: Keys,
        topology: Topology,
        clock: Clock,
        replica_id: str,
        is_leader: Callable[[], bool],
        sessions: SessionStore | None = None,
        reads: Reads | None = None,
        ladder: Ladder | None = None,
    ) -> None:
        """``reads``: the replica's, shared with its HTTP API (it knows the store's write
        refusals); None: reads of this service's own, for tests. ``ladder``: the
        degradation ladder the replica runs, reported in GetStatus (None: none)."""
        self.store, self.keys, self.topology, self.clock = store, keys, topology, clock
        self.ladder = ladder
        self.replica_id = replica_id
        # The read paths (and their validation messages) are shared with the HTTP API.
        self.reads = reads or Reads(store, keys, topology, clock, replica_id, is_leader)
        self.audit = AuditLog(keys, f"api-{replica_id}")
        self.report_writes = GroupCommit(store)  # every agent's report, each second
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
        snap, t = await self.reads.snapshot(), self.topology
        store = self.reads.store_writes()
        return pb.StatusResponse(
            regions=[
                region_status(
                    snap.regions[r.name],
                    r.zone,
                    capacity_view(snap.regions[r.name], t, snap.now),
                    writable=store.writable,
                    pool=t.pool_of(r.name),
                    hold=snap.regions[r.name].held(snap.now),
                    lift=snap.regions[r.name].lifted(snap.now),
                )
                for r in t.regions
            ],
            paused=snap.paused,
            pause_reason=snap.control.reason if snap.paused else "",
            paused_until=(snap.control.until or 0.0) if snap.paused else 0.0,
            leader=snap.leader,
            responder=self.replica_id,
            responder_is_leader=self.reads.is_leader(),
            generated_at=snap.now,
            store=store_writes_to_pb(store),
            # what doctor compares with the checkout's ladder file (question 6)
            ladder_steps=list(self.ladder.names) if self.ladder is not None else [],
            ladder_sha256=self.ladder.digest if self.ladder is not None else "",
        )

    @store_errors
    async def GetCapacity(
        self, request: pb.CapacityRequest, context: grpc.aio.ServicerContext
    ) -> pb.CapacityResponse:
        try:
            regions, at = await self.reads.capacity(request.region)
        except BadRead as e:
            await bad_request(context, str(e))
        return pb.CapacityResponse(
            regions=[capacity_record_to_pb(c) for c in regions], generated_at=at
        )

    @store_errors
    async def GetScale(
        self, request: pb.ScaleRequest, context: grpc.aio.ServicerContext
    ) -> pb.ScaleResponse:
        try:
            pools, at = await self.reads.scale(request.unit)
        except BadRead as e:
            await bad_request(context, str(e))
        return pb.ScaleResponse(
            pools=[
                pb.PoolScale(
                    unit=p.unit,
                    active_now=p.active_now,
                    record_json=encode(p.record) if p.record is not None else b"",
                    cold_start_json=(
                        json.dumps(dataclasses.asdict(p.cold_start)).encode()
                        if p.cold_start is not None
                        else b""
                    ),
                )
                for p in pools
            ],
            generated_at=at,
            scaling=self.topology.scaling is not None,
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
                engine_version=request.engine_version,
                serving_config=request.serving_config,
                now=self.clock.now(),
            )
        except BadReport as e:
            await bad_request(context, str(e))
        await store_report(self.report_writes, self.keys, report)
        # The region's thresholds from this replica's topology, so that its agent judges
        # by what the cluster agreed on (the cluster spec), not by a flag of its own.
        when = self.topology.region(report.region).degraded_when
        pool = self.topology.pool_of(report.region)  # not pool_models(): a dict per report
        model = pool.models[0] if pool is not None else ""
        return pb.ReportHealthResponse(
            accepted=True, thresholds=thresholds_to_pb(when), model=model
        )

    # ---- operator commands -----------------------------------------------------------
    async def _submit(self, intent: Intent, record_rev: int, details: dict[str, str]) -> bool:
        """Store the intent, the region's claim and its ``intent_<kind>`` audit entry in
        one transaction, if no other intent holds the claim and the region's record is
        still at ``record_rev`` (what the checks saw). False if not: look again."""
        audit = AuditEntry(
            at=intent.created_at,
            actor=intent.actor,
            action=AuditAction.of_intent(intent.kind),
            region=intent.region,
            reason=intent.reason,
            result="accepted",
            details={**outcome_details(intent.id, IntentStatus.PENDING), **details},
        )
        claim, value = self.keys.intent_claim(intent.region), encode(intent)
        compares = [
            Compare.absent(self.keys.intent(intent.id)),
            Compare.absent(claim),
            Compare.mod_revision(self.keys.region_state(intent.region), record_rev),
        ]
        ops = [Put(self.keys.intent(intent.id), value), Put(claim, value), self.audit.op(audit)]
        if not (await self.store.txn(compares, ops)).succeeded:
            return False
        log.warning(
            "intent %s: %s %s by %s: %s",
            intent.id,
            intent.kind.value,
            intent.region,
            intent.actor,
            intent.reason,
        )
        return True

    async def _refuse_if_pending(
        self, ctx: grpc.aio.ServicerContext, snap: Snapshot, region: str
    ) -> None:
        """FAILED_PRECONDITION while another intent for ``region`` awaits the leader."""
        kv = await self.store.get(self.keys.intent_claim(region))
        held: Intent | None = None
        if kv is not None:
            try:
                held = decode(Intent, kv.value, kv.key)
            except CorruptValue:
                log.error("unreadable intent claim %s; the leader frees it", kv.key)
        # Intents stored before claims existed hold none: the snapshot has them too.
        held = held or next((i for i in snap.intents if i.region == region), None)
        if held is not None:
            await abort(
                ctx,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{region} already has a pending {held.kind.value} intent {held.id} "
                f"(by {held.actor}: {held.reason[:120]}); one intent per region at a time. "
                f"GetIntent {held.id} tells its outcome",
            )

    async def _claim_and_submit(
        self, ctx: grpc.aio.ServicerContext, region: str, build: Build
    ) -> Submission:
        """Check on a fresh snapshot and store, again if the region changed meanwhile."""
        for _ in range(SUBMIT_ATTEMPTS):
            snap = await self.reads.snapshot()
            await self._refuse_if_pending(ctx, snap, region)
            sub = await build(snap)
            if sub.intent is None or await self._submit(
                sub.intent, snap.regions[region].record_rev, sub.details
            ):
                return sub
        await abort(
            ctx,
            grpc.StatusCode.ABORTED,
            f"{region} kept changing while the request was checked; nothing was changed, retry",
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

        async def build(snap: Snapshot) -> Submission:
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
                return Submission(None, plan=plan_to_pb(plan))
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
            details = {"force": flag(request.force), "to": json_list(request.to)}
            return Submission(intent, details, plan_to_pb(plan))

        sub = await self._claim_and_submit(context, region, build)
        if sub.intent is None:
            return pb.FailoverResponse(accepted=False, plan=sub.plan, dry_run=True)
        return pb.FailoverResponse(accepted=True, intent_id=sub.intent.id, plan=sub.plan)

    @store_errors
    async def RequestRecovery(
        self, request: pb.RecoveryRequest, context: grpc.aio.ServicerContext
    ) -> pb.IntentResponse:
        region = await self._known_region(context, request.region)
        reason, actor = await reason_and_actor(context, request.reason, request.actor)

        async def build(snap: Snapshot) -> Submission:
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
            return Submission(intent)

        sub = await self._claim_and_submit(context, region, build)
        intent_id = sub.intent.id if sub.intent else ""
        return pb.IntentResponse(accepted=bool(intent_id), intent_id=intent_id)

    @store_errors
    async def GetIntent(
        self, request: pb.GetIntentRequest, context: grpc.aio.ServicerContext
    ) -> pb.IntentStatus:
        iid = request.intent_id
        if not INTENT_ID.match(iid):
            await bad_request(
                context, "intent_id is the id RequestFailover / RequestRecovery returned"
            )
        # The intent first: it is deleted in the transaction that writes its outcome, so
        # an absent intent means the outcome is there (unless it expired).
        try:
            kv = await self.store.get(self.keys.intent(iid))
            if kv is not None:
                return intent_status_to_pb(pending(decode(Intent, kv.value, kv.key)))
            kv = await self.store.get(self.keys.intent_outcome(iid))
            if kv is not None:
                return intent_status_to_pb(decode(IntentOutcome, kv.value, kv.key))
        except CorruptValue as e:
            await abort(context, grpc.StatusCode.DATA_LOSS, f"{e}; failoverctl history has it")
        await abort(
            context,
            grpc.StatusCode.NOT_FOUND,
            f"no intent {iid}: never accepted, or its outcome expired (kept a day); "
            "failoverctl history shows every intent",
        )

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
