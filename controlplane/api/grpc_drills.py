"""The gRPC methods on drills, their readiness verdicts and the prefix catalog:
what ``failoverctl readiness``, ``drill`` and ``prefixes top`` call.

A mixin of ``ControlPlaneService`` (it uses the service's store, keys, topology,
clock and audit log). Drills themselves run in the drill service (chaos/): the API
only reads what it published and stores operators' requests for it, like intents.
"""

from __future__ import annotations

import re
import uuid

import grpc
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.api.rpc_checks import (
    abort,
    bad_request,
    known_region,
    known_target,
    reason_and_actor,
    store_errors,
)
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.config import Topology
from controlplane.kernel.details import flag
from controlplane.kernel.drills import (
    CAPACITY_PROBE,
    SCENARIO_NAME,
    DrillCatalog,
    DrillRequest,
    DrillSummary,
)
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditAction, AuditEntry, Readiness
from controlplane.kernel.prefix.catalog import CatalogEntry, PrefixCatalog
from controlplane.kernel.store.port import Compare, Put, Store, StoreUnavailable

DEFAULT_PREFIXES, MAX_PREFIXES = 20, 256
DEFAULT_DRILLS, MAX_DRILLS = 20, 500
PROGRESS_CHARS = 500  # a progress line as shown, at most
MAX_PENDING = 16  # queued drill requests; more is a mistake (a loop in a script)
PREVIEW = 80


def readiness_pb(region: str, r: Readiness | None) -> pb.RegionReadiness:
    if r is None:
        return pb.RegionReadiness(region=region, has_verdict=False)
    return pb.RegionReadiness(
        region=region,
        has_verdict=True,
        passed=r.passed,
        drill=r.drill,
        at=r.at,
        override_reason=r.override_reason,
        override_actor=r.override_actor,
        override_at=r.override_at,
        barred=not r.passed and not r.override_reason,
    )


def _preview(e: CatalogEntry) -> str:
    p = e.payload
    if p is None:
        return ""
    if p.prompt is not None:
        text = p.prompt
    elif p.messages:
        text = " | ".join(f"{m.role}: {m.content}" for m in p.messages)
    else:
        text = f"{len(p.token_ids or ())} token ids"
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


def summary_pb(s: DrillSummary) -> pb.DrillRun:
    return pb.DrillRun(
        id=s.id,
        scenario=s.scenario,
        region=s.region,
        started_at=s.started_at,
        ended_at=s.ended_at,
        passed=s.passed,
        dry_run=s.dry_run,
        aborted=s.aborted,
        failed=list(s.failed),
        trigger=s.trigger,
        report_path=s.report_path,
        request_id=s.request_id,
        criteria=list(s.criteria),
    )


class DrillMethods:
    store: Store
    keys: Keys
    topology: Topology
    clock: Clock
    audit: AuditLog

    async def _readiness(self, region: str) -> tuple[Readiness | None, int]:
        kv = await self.store.get(self.keys.readiness(region))
        if kv is None:
            return None, 0
        try:
            return decode(Readiness, kv.value, kv.key), kv.mod_revision
        except CorruptValue:
            return None, kv.mod_revision

    @store_errors
    async def GetReadiness(
        self, request: pb.ReadinessRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadinessResponse:
        names = self.topology.names
        if request.region:
            names = (await known_region(context, self.topology, request.region),)
        out = [readiness_pb(r, (await self._readiness(r))[0]) for r in names]
        return pb.ReadinessResponse(regions=out)

    @store_errors
    async def OverrideReadiness(
        self, request: pb.ReadinessOverrideRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegionReadiness:
        """Let a region whose last drill failed take traffic again, with a reason. Only
        a failed, not yet overridden verdict can be overridden; the next drill's verdict
        replaces the override."""
        region = await known_region(context, self.topology, request.region)
        reason, actor = await reason_and_actor(context, request.reason, request.actor)
        current, rev = await self._readiness(region)
        if current is None or current.passed or current.override_reason:
            state = (
                "has no drill verdict"
                if current is None
                else "passed its last drill"
                if current.passed
                else f"is already overridden by {current.override_actor or '?'}"
            )
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{region} {state}: nothing to override",
            )
        now = self.clock.now()
        new = current.model_copy(
            update={"override_reason": reason, "override_actor": actor, "override_at": now}
        )
        entry = AuditEntry(
            at=now,
            actor=actor,
            action=AuditAction.READINESS_OVERRIDE,
            region=region,
            reason=reason,
            details={"drill": current.drill},
        )
        key = self.keys.readiness(region)
        ok = (
            await self.store.txn(
                [Compare.mod_revision(key, rev)], [Put(key, encode(new)), self.audit.op(entry)]
            )
        ).succeeded
        if not ok:
            await abort(
                context,
                grpc.StatusCode.ABORTED,
                f"{region}'s readiness changed meanwhile (a drill ended?); look again "
                "with failoverctl readiness, then retry",
            )
        return readiness_pb(region, new)

    @store_errors
    async def TopPrefixes(
        self, request: pb.TopPrefixesRequest, context: grpc.aio.ServicerContext
    ) -> pb.TopPrefixesResponse:
        region = await known_region(context, self.topology, request.region)
        if request.limit > MAX_PREFIXES:
            await bad_request(context, f"limit is at most {MAX_PREFIXES} (got {request.limit})")
        limit = request.limit or DEFAULT_PREFIXES
        kv = await self.store.get(self.keys.prefixes(region))
        if kv is None:
            return pb.TopPrefixesResponse(region=region, found=False)
        try:
            cat = decode(PrefixCatalog, kv.value, kv.key)
        except CorruptValue as e:
            await abort(context, grpc.StatusCode.DATA_LOSS, str(e))
        return pb.TopPrefixesResponse(
            region=region,
            found=True,
            generated_at=cat.at,
            gateways=cat.gateways,
            min_sessions=cat.min_sessions,
            entries=[
                pb.PrefixEntry(
                    key=e.key,
                    tokens=e.payload.tokens if e.payload else 0,
                    count=e.count,
                    sessions=e.sessions,
                    may_leave=e.payload is not None,
                    preview=_preview(e),
                )
                for e in cat.entries[:limit]
            ],
        )

    @store_errors
    async def ListDrills(
        self, request: pb.DrillsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DrillsResponse:
        if request.region:
            await known_region(context, self.topology, request.region)
        if request.limit > MAX_DRILLS:
            await bad_request(context, f"limit is at most {MAX_DRILLS} (got {request.limit})")
        limit = request.limit or DEFAULT_DRILLS
        page = await self.store.get_prefix(self.keys.drill_history_prefix())
        runs = []
        for kv in reversed(page.kvs):  # keys sort by time: newest last
            try:
                s = decode(DrillSummary, kv.value, kv.key)
            except CorruptValue:
                continue
            if not request.region or s.region == request.region:
                runs.append(summary_pb(s))
            if len(runs) >= limit:
                break
        resp = pb.DrillsResponse(runs=runs)
        catalog = await self._catalog()
        if catalog is not None:
            resp.service, resp.published_at = catalog.service, catalog.published_at
            resp.scenarios.extend(
                pb.DrillScenario(name=s.name, title=s.title, region=s.region)
                for s in catalog.scenarios
            )
            resp.upcoming.extend(
                pb.ScheduledDrill(scenario=u.scenario, region=u.region, at=u.at)
                for u in catalog.upcoming
            )
        for req in await self._pending():
            resp.pending.append(
                pb.PendingDrill(
                    id=req.id,
                    scenario=req.scenario,
                    region=req.region,
                    dry_run=req.dry_run,
                    actor=req.actor,
                    reason=req.reason,
                    requested_at=req.requested_at,
                )
            )
        lock = await self.store.get(self.keys.drill_lock())
        if lock is not None:
            resp.running = lock.value.decode(errors="replace")
            progress = await self.store.get(self.keys.drill_progress())
            if progress is not None:
                resp.progress = progress.value.decode(errors="replace")[:PROGRESS_CHARS]
        return resp

    async def _catalog(self) -> DrillCatalog | None:
        kv = await self.store.get(self.keys.drill_catalog())
        if kv is None:
            return None
        try:
            return decode(DrillCatalog, kv.value, kv.key)
        except CorruptValue:
            return None

    async def _pending(self) -> list[DrillRequest]:
        out = []
        for kv in (await self.store.get_prefix(self.keys.drill_requests_prefix())).kvs:
            try:
                out.append(decode(DrillRequest, kv.value, kv.key))
            except CorruptValue:
                continue
        return sorted(out, key=lambda r: r.requested_at)

    @store_errors
    async def RequestDrill(
        self, request: pb.DrillRequest, context: grpc.aio.ServicerContext
    ) -> pb.IntentResponse:
        """Queue a drill for the drill service; refused when no service has published
        its scenarios, or the scenario or region is unknown."""
        if not re.match(SCENARIO_NAME, request.scenario):
            await bad_request(context, f"{request.scenario[:64]!r} is not a scenario name")
        region = request.region
        if region:
            await known_target(context, self.topology, region)
        replica = request.replica.strip()
        if replica and request.scenario != CAPACITY_PROBE:
            await bad_request(
                context, f"replica names what {CAPACITY_PROBE} probes; a drill has none"
            )
        if replica and not re.match(r"^https?://[^/\s]+$", replica):
            await bad_request(
                context, f"replica must be a base URL like http://host:8000, got {replica[:64]!r}"
            )
        if request.scenario == CAPACITY_PROBE and not region:
            await bad_request(context, f"{CAPACITY_PROBE} needs a region")
        reason, actor = await reason_and_actor(context, request.reason, request.actor)
        catalog = await self._catalog()
        if catalog is None:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "no drill service has published its scenarios: start one "
                "(python -m chaos) and retry",
            )
        names = {s.name for s in catalog.scenarios}
        if request.scenario not in names:
            known = ", ".join(sorted(names))
            await bad_request(
                context,
                f"unknown scenario {request.scenario!r}; the drill "
                f"service {catalog.service} has: {known}",
            )
        if len(await self._pending()) >= MAX_PENDING:
            await abort(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{MAX_PENDING} drills are queued already; wait for them",
            )
        now = self.clock.now()
        req = DrillRequest(
            id=uuid.uuid4().hex[:12],
            scenario=request.scenario,
            region=region,
            dry_run=request.dry_run,
            reason=reason,
            actor=actor,
            requested_at=now,
            replica=replica,
        )
        entry = AuditEntry(
            at=now,
            actor=actor,
            action=AuditAction.DRILL_REQUESTED,
            region=region,
            reason=reason,
            details={
                "request": req.id,
                "scenario": req.scenario,
                "dry_run": flag(req.dry_run),
                **({"replica": replica} if replica else {}),
            },
        )
        key = self.keys.drill_request(req.id)
        ok = (
            await self.store.txn(
                [Compare.absent(key)], [Put(key, encode(req)), self.audit.op(entry)]
            )
        ).succeeded
        if not ok:
            raise StoreUnavailable("request id collision; retry")
        return pb.IntentResponse(accepted=True, intent_id=req.id)
