"""Reads the full snapshot a tick decides on from the store (prefix reads, no sessions)."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, TypeVar

from pydantic import BaseModel

from controlplane.kernel.capacity.record import CapacityRecord
from controlplane.kernel.cluster_spec import ClusterSpec
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.config import Topology
from controlplane.kernel.drills import DrillLock
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import (
    ControlFlags,
    HealthReport,
    Intent,
    Readiness,
    RegionHealth,
    RegionHold,
    RegionRecord,
    Routing,
)
from controlplane.kernel.pool.cost import BudgetLift
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.pool.scale import ScaleRecord, WakeRequest
from controlplane.kernel.snapshot import IntentClaim, RegionView, Snapshot
from controlplane.kernel.store.port import KeyValue, RevisionCompacted, Store

log = logging.getLogger("tectonic.snapshot")
M = TypeVar("M", bound=BaseModel)


class _Parse(Protocol):
    def __call__(self, cls: type[M], kv: KeyValue | None) -> M | None: ...


class Decoded:
    """The values one reader decoded, by key and the revision they were read at: a
    key unchanged since the last read is not parsed again (the models are frozen, so
    two snapshots may share one). At 512 regions a tick read ~1,500 keys, a third of
    them rewritten a second; decoding them all was most of the read. Holds only the
    keys of the newest read."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, object]] = {}
        self._next: dict[str, tuple[int, object]] = {}

    def parse(self, cls: type[M], kv: KeyValue | None) -> M | None:
        if kv is None:
            return None
        hit = self._seen.get(kv.key)
        if hit is not None and hit[0] == kv.mod_revision and isinstance(hit[1], cls):
            value: M | None = hit[1]
        else:
            value = _parse(cls, kv)
        if value is not None:
            self._next[kv.key] = (kv.mod_revision, value)
        return value

    def read_done(self) -> None:
        self._seen, self._next = self._next, {}


async def read_snapshot(
    store: Store, keys: Keys, topology: Topology, now: float, decoded: Decoded | None = None
) -> Snapshot:
    """Everything but sessions and audit, as it stood at one revision: the first read's,
    every later read pinned to it, so a write landing between two reads is in none of
    them (a tick never decides on two states). A value that fails to parse is logged and
    treated as absent, so one bad key cannot stall every region. ``decoded``: a reader's
    values of its last read, reused where a key has not changed since."""
    d = decoded or Decoded()
    try:
        snap = await _read_at_one_revision(store, keys, topology, now, d.parse)
    except RevisionCompacted:  # compacted between two reads (minutes of retention): again
        snap = await _read_at_one_revision(store, keys, topology, now, d.parse)
    d.read_done()
    return snap


async def _read_at_one_revision(
    store: Store, keys: Keys, topology: Topology, now: float, parse: _Parse
) -> Snapshot:
    regions_page = await store.get_prefix(keys.regions_prefix())
    rev = regions_page.revision

    async def prefix(p: str, wanted: bool = True) -> dict[str, KeyValue]:
        if not wanted:
            return {}
        return {kv.key: kv for kv in (await store.get_prefix(p, revision=rev)).kvs}

    async def one(key: str) -> KeyValue | None:
        return await store.get(key, revision=rev)

    # Pinned to one revision, the other reads are independent: all at once, so a tick
    # pays one round trip for them, not one each (against an etcd in another region,
    # ~14 in a row were most of a tick: bench etcd_rtt)
    regions_kv = {kv.key: kv for kv in regions_page.kvs}
    scaling = bool(topology.scaling)
    # Gathers of the reads themselves (each made a task at once): a read handed as an
    # argument to a coroutine that a cancellation stops before it starts is never
    # awaited (Python warns of it, and a test run fails on the warning).
    prefixes, ones = await asyncio.gather(
        asyncio.gather(
            prefix(keys.routing_prefix()),
            prefix(keys.degradation_prefix()),
            prefix(keys.capacity_prefix()),
            prefix(keys.pools_prefix()),
            prefix(keys.scale_prefix(), scaling),
            prefix(keys.wake_prefix(), scaling),
            prefix(keys.reports_prefix()),
            prefix(keys.intents_prefix()),
        ),
        asyncio.gather(
            one(keys.control()), one(keys.leader()), one(keys.spec()), one(keys.drill_lock())
        ),
    )
    routing_kv, ladder_kv, capacity_kv, pools_kv = prefixes[:4]
    scale_kv, wake_kv, reports_kv, intents_kv = prefixes[4:]
    control_kv, leader_kv, spec_kv, drill_kv = ones
    # a claim matters only to an intent being resolved: no extra read on a quiet tick
    claims_kv = await prefix(keys.intent_claims_prefix(), bool(intents_kv))

    views: dict[str, RegionView] = {}
    for name in topology.names:
        rec_kv = regions_kv.get(keys.region_state(name))
        health_kv = regions_kv.get(keys.region_health(name))
        ready_kv = regions_kv.get(keys.readiness(name))
        route_kv = routing_kv.get(keys.routing(name))
        ladder_at = ladder_kv.get(keys.degradation(name))
        ladder = parse(DegradationRecord, ladder_at)
        record = parse(RegionRecord, rec_kv) or RegionRecord(region=name, since=now)
        pool = parse(PoolMembers, pools_kv.get(keys.pool(name)))
        static = len(topology.region(name).replicas)
        scale_at = scale_kv.get(keys.scale(name))
        hold_kv = regions_kv.get(keys.region_hold(name))
        lift_kv = regions_kv.get(keys.budget_lift(name))
        views[name] = RegionView(
            name=name,
            record=record,
            record_rev=rec_kv.mod_revision if rec_kv else 0,
            health=parse(RegionHealth, health_kv) or RegionHealth(region=name, since=now),
            readiness=parse(Readiness, ready_kv),
            routing=parse(Routing, route_kv),
            routing_rev=route_kv.mod_revision if route_kv else 0,
            degradation=ladder.applied if ladder else (),
            ladder=ladder,
            ladder_rev=ladder_at.mod_revision if ladder_at else 0,
            capacity=parse(CapacityRecord, capacity_kv.get(keys.capacity(name))),
            active_replicas=len(pool.active) if pool else (static or None),
            scale=parse(ScaleRecord, scale_at),
            scale_rev=scale_at.mod_revision if scale_at else 0,
            wake_at=_wake_at(parse(WakeRequest, wake_kv.get(keys.wake(name)))),
            hold=parse(RegionHold, hold_kv),
            hold_rev=hold_kv.mod_revision if hold_kv else 0,
            lift=parse(BudgetLift, lift_kv),
            lift_rev=lift_kv.mod_revision if lift_kv else 0,
            warm_replicas=pool.warm if pool else 0,
            lent_replicas=len(pool.lent) if pool else 0,
            idle_replicas=pool.idle if pool else 0,
            warm_kept_replicas=pool.warm_kept if pool else 0,
            launching_replicas=pool.launching if pool else 0,
            activation_p95_s=pool.activation_p95_s if pool else None,
            activation_rate=pool.activation_rate if pool else None,
        )
    reports = tuple(r for kv in reports_kv.values() if (r := parse(HealthReport, kv)))
    intents = tuple(i for kv in intents_kv.values() if (i := parse(Intent, kv)))
    claims = {
        kv.key.removeprefix(keys.intent_claims_prefix()): _claim(kv) for kv in claims_kv.values()
    }
    return Snapshot(
        now=now,
        revision=rev,
        regions=views,
        reports=reports,
        intents=intents,
        claims=claims,
        control=parse(ControlFlags, control_kv) or ControlFlags(),
        control_rev=control_kv.mod_revision if control_kv is not None else 0,
        leader=leader_kv.value.decode() if leader_kv else "",
        spec=parse(ClusterSpec, spec_kv),
        spec_rev=spec_kv.mod_revision if spec_kv else 0,
        drill=parse(DrillLock, drill_kv),
    )


def _claim(kv: KeyValue) -> IntentClaim:
    try:  # unreadable: freed when an intent for its region is resolved, quietly until then
        holder: str | None = decode(Intent, kv.value, kv.key).id
    except CorruptValue:
        holder = None
    return IntentClaim(holder=holder, rev=kv.mod_revision)


def _parse(cls: type[M], kv: KeyValue | None) -> M | None:
    if kv is None:
        return None
    try:
        return decode(cls, kv.value, kv.key)
    except CorruptValue as e:
        log.error("ignoring corrupt value: %s", e)
        return None


def _wake_at(wake: WakeRequest | None) -> float | None:
    return None if wake is None else wake.at
