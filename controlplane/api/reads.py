"""Read paths shared by every API transport: status, capacity, history and events.

The gRPC service and the HTTP API answer the same questions from the same etcd reads;
this module is that logic, free of any transport. It validates requests
(``BadRead``: the transport answers INVALID_ARGUMENT or 400 with the message as is),
reads the snapshot and the append-only audit prefix, and returns either the domain
objects (``AuditRecord`` wraps an ``AuditEntry``) for a transport that converts them
itself (gRPC, via ``controlplane.api.convert``), or the pydantic view models below
(HTTP: they are its response bodies and its OpenAPI schema).

``StoreUnavailable`` is not caught here: each transport maps it (UNAVAILABLE / 503).
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from controlplane.api.scale_views import PoolScaleView, ScaleView, scale_view
from controlplane.core.bearing import hit_rate_of, load_of, region_bearing
from controlplane.core.cold_start import pool_cold_start
from controlplane.core.store_writes import StoreWritesView
from controlplane.kernel.capacity.bearing import utilization
from controlplane.kernel.capacity.record import CapacityRecord, CapacitySource, HitProbe
from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import (
    AuditEntry,
    Decision,
    FailoverStep,
    Health,
    PrewarmFigures,
    Readiness,
    RegionHold,
    RegionState,
)
from controlplane.kernel.region_config import PoolUnit
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.kernel.snapshot_reader import read_snapshot
from controlplane.kernel.store.port import (
    EventType,
    KeyValue,
    Store,
    StoreError,
    StoreUnavailable,
)
from controlplane.kernel.vllm.signals import LOAD_RAW_SIGNAL

DEFAULT_HISTORY = 50
MAX_HISTORY = 1000


class BadRead(ValueError):
    """A read that cannot be answered as asked; the message says what to change."""


@dataclass(frozen=True)
class AuditRecord:
    """One audit entry with where it lives: ``id`` is the key's last segment (sorts by
    time), ``revision`` its etcd mod_revision (entries are never rewritten, so this
    orders entries by commit and serves as a resume token for event streams)."""

    id: str
    revision: int
    entry: AuditEntry


# ---- view models (HTTP response bodies; OpenAPI shows them) ------------------------------
class FailoverView(BaseModel):
    targets: dict[str, float] = Field(description="planned targets and their weights")
    started_at: float
    steps_done: list[FailoverStep]
    warm_first: bool
    manual: bool
    forced: bool
    prewarm_result: PrewarmFigures = Field(default_factory=PrewarmFigures)


class RecoveryView(BaseModel):
    step: int
    steps: int
    held: bool
    last_step_at: float


class CapacityView(BaseModel):
    """What the region bears now (docs/capacity.md), and the figures of its last probe
    (per replica; unset while there is none)."""

    source: CapacitySource = Field(
        description="measured: a fresh probe; stale: a probe too old or of another engine, "
        "the typed capacity_rps used instead; typed: no probe yet"
    )
    reason: str = Field(description="why this source")
    cbu: float | None = Field(
        description="capacity utilisation: load_rps / allowed_rps (null: it serves load "
        "and bears nothing)"
    )
    allowed_rps: float = Field(description="what the region bears now, at hit_rate")
    load_rps: float = Field(
        description="inference requests per second the region serves, over the agent's "
        "30 s window (replica_signals.LOAD_WINDOW_S): what CBU and the planner read"
    )
    load_rps_raw: float | None = Field(
        None,
        description="the same over the agent's last probe interval (~1 s), for the live "
        "view; noisy (null: not reported)",
    )
    hit_rate: float = Field(description="prefix-cache hit rate of what it serves")
    warn_cbu: float = Field(description="the topology's capacity.warn_cbu")
    page_cbu: float = Field(description="the topology's capacity.page_cbu")
    active_replicas: int | None = Field(description="ACTIVE replicas now (null: not known)")
    measured_at: float | None = None
    knee_rps: float | None = Field(None, description="the coldest probe's knee")
    ultimate_rps: float | None = Field(None, description="the coldest probe's ultimate load")
    ultimate_bounded: bool | None = Field(
        None, description="false: no step broke the SLA, the ultimate load is a lower bound"
    )
    r_base_rps: float | None = Field(None, description="cold prompts")
    beta: float | None = Field(None, description="R(h) = r_base_rps / (1 - beta h)")
    factor_of_safety: float | None = None
    t_recover_s: float | None = Field(None, description="overload recovery time")
    engine_version: str = ""


def coldest_probe(record: CapacityRecord) -> HitProbe:
    """The probe at the lowest hit rate: what moved (cold) traffic meets."""
    return min(record.probes, key=lambda p: p.hit_rate)


def capacity_view(view: RegionView, topology: Topology, now: float) -> CapacityView:
    bearing = region_bearing(view, topology, now)
    hit_rate, load = hit_rate_of(view), load_of(view)
    allowed = bearing.allowed(hit_rate)
    cbu = utilization(load, allowed)
    policy = topology.capacity
    out = CapacityView(
        source=bearing.source,
        reason=bearing.reason,
        cbu=cbu if math.isfinite(cbu) else None,  # JSON has no infinity
        allowed_rps=allowed,
        load_rps=load,
        load_rps_raw=view.health.signals.get(LOAD_RAW_SIGNAL),
        hit_rate=hit_rate,
        warn_cbu=policy.warn_cbu,
        page_cbu=policy.page_cbu,
        active_replicas=view.active_replicas,
    )
    rec = bearing.record
    if rec is None:
        return out
    cold = coldest_probe(rec)
    return out.model_copy(
        update={
            "measured_at": rec.measured_at,
            "knee_rps": cold.knee_rps,
            "ultimate_rps": cold.ultimate_rps,
            "ultimate_bounded": cold.ultimate_bounded,
            "r_base_rps": rec.r_base_rps,
            "beta": rec.beta,
            "factor_of_safety": rec.factor_of_safety,
            "t_recover_s": rec.t_recover_s,
            "engine_version": rec.engine_version,
        }
    )


@dataclass(frozen=True)
class RegionCapacity:
    """A region's bearing and the probe record behind it (None: no probe yet)."""

    region: str
    bearing: CapacityView
    record: CapacityRecord | None


UNKNOWN = "UNKNOWN"  # a region's state while the store refuses writes (never stored)
WRITABLE = StoreWritesView(writable=True)


class RegionStatusView(BaseModel):
    name: str
    zone: str
    state: RegionState | Literal["UNKNOWN"] = Field(
        description="UNKNOWN while the store refuses writes (see store): nothing can be "
        "failed over or recorded then, so the stored state may no longer be true"
    )
    stored_state: RegionState = Field(description="the state etcd holds")
    health: Health = Field(description="folded verdict (quorum + hysteresis)")
    epoch: int
    reason: str
    since: float
    routing: dict[str, float] = Field(description="where traffic homed here goes: region -> weight")
    barred: bool = Field(description="a failed drill bars the region from taking traffic")
    readiness: Readiness | None = Field(description="last drill verdict, if any")
    degradation: list[str] = Field(description="degradation ladder steps applied now, in order")
    signals: dict[str, float]
    votes: dict[str, Health]
    failover: FailoverView | None
    recovery: RecoveryView | None
    last_decision: Decision | None
    capacity: CapacityView = Field(description="what the region bears now, and its CBU")
    pool_of: str = Field(
        "", description="a model pool's unit (<region>.<pool>): its region; empty otherwise"
    )
    pool: str = Field("", description="a model pool's unit: its pool's name")
    models: list[str] = Field(default_factory=list, description="the model names it answers")
    scale: ScaleView | None = Field(
        None,
        description="what the leader's scaler wants of it (scale/<unit>, docs/scaling.md); "
        "null without a record",
    )
    hold: RegionHold | None = Field(
        None,
        description="an operator's hold on this unit's automation (failoverctl hold), "
        "while in force; null otherwise",
    )
    budget_lift: RegionHold | None = Field(
        None,
        description="an operator's lift of this pool's budget (failoverctl cost lift), "
        "while in force; null otherwise",
    )


class StatusView(BaseModel):
    cluster: str
    regions: list[RegionStatusView]
    paused: bool
    pause_reason: str
    paused_until: float = Field(0.0, description="when the pause ends by itself (0: none)")
    leader: str
    responder: str = Field(description="the replica that answered")
    responder_is_leader: bool
    generated_at: float
    revision: int = Field(description="etcd revision the snapshot was read at")
    store: StoreWritesView = Field(description="whether the store takes writes now")


class EventView(BaseModel):
    """One audit entry: a transition, a failover step, an operator command, ..."""

    id: str
    revision: int
    at: float
    action: str
    region: str
    actor: str
    reason: str
    result: str
    details: dict[str, str]
    decision: Decision | None

    @classmethod
    def of(cls, rec: AuditRecord) -> EventView:
        a = rec.entry
        return cls(
            id=rec.id,
            revision=rec.revision,
            at=a.at,
            action=a.action.value,
            region=a.region,
            actor=a.actor,
            reason=a.reason,
            result=a.result,
            details=a.details,
            decision=a.decision,
        )


class HistoryView(BaseModel):
    events: list[EventView] = Field(description="oldest first")


def region_view(
    view: RegionView,
    zone: str,
    capacity: CapacityView,
    *,
    writable: bool = True,
    pool: PoolUnit | None = None,
    hold: RegionHold | None = None,
    lift: RegionHold | None = None,
) -> RegionStatusView:
    rec, fo, rc = view.record, view.record.failover, view.record.recovery
    return RegionStatusView(
        name=view.name,
        zone=zone,
        state=rec.state if writable else UNKNOWN,
        stored_state=rec.state,
        # The stored verdict cannot be updated either while the store refuses writes.
        health=view.health.verdict if writable else Health.UNKNOWN,
        epoch=rec.epoch,
        reason=rec.reason,
        since=rec.since,
        routing=view.effective_routing().targets,
        barred=view.barred,
        readiness=view.readiness,
        degradation=list(view.degradation),
        signals=view.health.signals,
        votes=view.health.votes,
        failover=FailoverView(
            targets=fo.plan.targets,
            started_at=fo.started_at,
            steps_done=list(fo.done),
            warm_first=fo.plan.warm_first,
            manual=fo.plan.manual,
            forced=fo.plan.forced,
            prewarm_result=fo.prewarm_result,
        )
        if fo
        else None,
        recovery=RecoveryView(
            step=rc.step, steps=rc.steps, held=rc.held, last_step_at=rc.last_step_at
        )
        if rc
        else None,
        last_decision=rec.last_decision,
        capacity=capacity,
        pool_of=pool.region if pool else "",
        pool=pool.pool if pool else "",
        models=list(pool.models) if pool else [],
        scale=scale_view(view.scale),
        hold=hold,
        budget_lift=lift,
    )


# ---- the reads --------------------------------------------------------------------------
class Reads:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        topology: Topology,
        clock: Clock,
        replica_id: str,
        is_leader: Callable[[], bool],
        store_writes: Callable[[], StoreWritesView] = lambda: WRITABLE,
    ) -> None:
        """``store_writes``: what this replica knows of the store's write refusals."""
        self.store, self.keys, self.topology, self.clock = store, keys, topology, clock
        self.replica_id, self.is_leader = replica_id, is_leader
        self.store_writes = store_writes

    # validation: the same messages over every transport
    def known_region(self, region: str) -> str:
        if region not in self.topology.names:
            raise BadRead(
                f"unknown region {region[:64]!r}; known regions: {', '.join(self.topology.names)}"
            )
        return region

    @staticmethod
    def bounded(name: str, value: int, limit: int = MAX_HISTORY) -> int:
        if value < 0 or value > limit:
            raise BadRead(f"{name} is between 0 and {limit} (got {value})")
        return value

    # status
    async def snapshot(self) -> Snapshot:
        return await read_snapshot(self.store, self.keys, self.topology, self.clock.now())

    async def status(self) -> StatusView:
        snap, t = await self.snapshot(), self.topology
        store = self.store_writes()
        return StatusView(
            cluster=self.topology.cluster,
            regions=[
                region_view(
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
            responder_is_leader=self.is_leader(),
            generated_at=snap.now,
            revision=snap.revision,
            store=store,
        )

    # capacity
    async def capacity(self, region: str = "") -> tuple[list[RegionCapacity], float]:
        """Each region's bearing (or ("") every region's) with its probe record, and the
        time it was read at. Raises BadRead."""
        names = [self.known_region(region)] if region else list(self.topology.names)
        snap = await self.snapshot()
        out = [
            RegionCapacity(
                name,
                capacity_view(snap.regions[name], self.topology, snap.now),
                snap.regions[name].capacity,
            )
            for name in names
        ]
        return out, snap.now

    # scale
    async def scale(self, unit: str = "") -> tuple[list[PoolScaleView], float]:
        """Each failover unit's (or ("") every unit's) scale record and the ACTIVE
        replicas serving it now, and the time it was read at. Raises BadRead."""
        names = [self.known_region(unit)] if unit else list(self.topology.names)
        snap = await self.snapshot()
        views = [
            PoolScaleView(
                n,
                snap.regions[n].active_replicas,
                snap.regions[n].scale,
                pool_cold_start(snap.regions[n], self.topology, snap.regions[n].scale),
            )
            for n in names
        ]
        return views, snap.now

    # history
    async def history(self, region: str = "", limit: int = 0) -> list[AuditRecord]:
        """The last ``limit`` (0: DEFAULT_HISTORY) audit entries, oldest first, of one
        region or ("") of all. Raises BadRead."""
        if region:
            self.known_region(region)
        limit = self.bounded("limit", limit) or DEFAULT_HISTORY
        records, _ = await self._audit(region)
        return records[-limit:]

    # events
    def events(
        self, region: str = "", replay: int = 0, after_revision: int = 0
    ) -> AsyncGenerator[AuditRecord, None]:
        """Audit entries as they are written, of one region or ("") of all: first the
        last ``replay`` existing ones, or every one committed after ``after_revision``
        (a resume token, ``AuditRecord.revision``); then live ones, without gap or
        duplicate. Validates now (raises BadRead before anything is read); the stream
        raises StoreUnavailable when the watch breaks."""
        if region:
            self.known_region(region)
        self.bounded("replay", replay)
        if after_revision < 0:
            raise BadRead(f"the resume revision is not negative (got {after_revision})")
        return self._events(region, replay, after_revision)

    async def _events(
        self, region: str, replay: int, after_revision: int
    ) -> AsyncGenerator[AuditRecord, None]:
        records, revision = await self._audit(region)
        if after_revision:
            backlog = [r for r in records if r.revision > after_revision]
        else:
            backlog = records[-replay:] if replay else []
        for rec in backlog:
            yield rec
        last = revision  # every entry up to the read was sent or not asked for
        while True:
            try:
                async for ev in self.store.watch_prefix(
                    self.keys.audit_prefix(), start_revision=revision + 1
                ):
                    if (
                        ev.type is EventType.PUT
                        and (new := _parse(ev.kv))
                        and _matches(new, region)
                    ):
                        last = new.revision
                        yield new
                return
            except StoreUnavailable:
                raise
            except StoreError:
                # The history from ``revision`` was compacted away (the stream fell more
                # than etcd.compact_retention_s behind): relist, and go on after the last
                # entry sent; audit keys are never rewritten, so nothing is sent twice.
                records, revision = await self._audit(region)
                for rec in records:
                    if rec.revision > last:
                        yield rec
                last = max(last, revision)

    async def _audit(self, region: str) -> tuple[list[AuditRecord], int]:
        page = await self.store.get_prefix(self.keys.audit_prefix())
        records = [r for kv in page.kvs if (r := _parse(kv)) and _matches(r, region)]
        return records, page.revision


def _matches(rec: AuditRecord, region: str) -> bool:
    return not region or rec.entry.region == region


def _parse(kv: KeyValue) -> AuditRecord | None:
    try:
        entry = decode(AuditEntry, kv.value, kv.key)
    except CorruptValue:
        return None
    return AuditRecord(id=kv.key.rsplit("/", 1)[-1], revision=kv.mod_revision, entry=entry)
