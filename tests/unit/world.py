"""An in-process world for driving the leader's real cycle tick by tick, on a fake clock.

Each tick is the leader's: the snapshot read from an in-memory store
(``read_snapshot``), the pure ``decide``, the real ``Orchestrator`` applying its writes
(fenced compare-and-set transactions, as over etcd) and starting its jobs on the real
job executor, whose pre-warms return ``failover_result`` / ``recovery_result`` at once;
a finished job wakes a tick at the same instant, as it wakes the loop. The test writes
what observers and operators write (reports, intents, readiness, control) into the
fields below and reads back records, routing, health, audit entries and intent
outcomes as the store holds them after the tick (every value went to JSON and back).
``snapshot()`` and ``apply()`` work on those fields alone, for tests of the pure parts.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import BaseModel

from controlplane.cluster import Cluster
from controlplane.core.actions import JobKind, TickResult, Write
from controlplane.core.decide import decide
from controlplane.core.intents import IntentOutcome
from controlplane.kernel.capacity.record import CapacityRecord
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.drills import DrillLock
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import (
    AuditEntry,
    ControlFlags,
    FailoverPlan,
    Health,
    HealthReport,
    Intent,
    ObserverKind,
    PrewarmFigures,
    Readiness,
    RegionHealth,
    RegionHold,
    RegionRecord,
    Routing,
)
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.kernel.snapshot_reader import read_snapshot
from controlplane.kernel.store.memory import MemoryStore
from controlplane.orchestrator import Orchestrator

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")
PREWARMS = (JobKind.FAILOVER_PREWARM, JobKind.RECOVERY_PREWARM)


def stored(value: M) -> M:
    """``value`` as a reader of etcd gets it back: JSON out, JSON in."""
    return decode(type(value), encode(value), "world")


# The world's timing: one tick a second, three bad ticks to fail over.
TIMING = {
    "probe_interval_s": 1,
    "failure_threshold": 3,
    "success_threshold": 2,
    "report_stale_s": 3,
    "quorum": 2,
    "degraded_dwell_s": 5,
    "recovery_dwell_s": 5,
    "failover_cooldown_s": 60,
    "loop_period_s": 1,
    "retry_timeout_s": 1,
    "lease_ttl_s": 5,
}


def topology(**timing: float) -> Topology:
    t = {**TIMING, **timing}
    return parse_topology(
        {
            "cluster": "test",
            "regions": [
                {"name": "us-east", "zone": "us", "agent": "127.0.0.1:1", "capacity_rps": 100},
                {"name": "us-west", "zone": "us", "agent": "127.0.0.1:2", "capacity_rps": 100},
                {"name": "us-central", "zone": "us", "agent": "127.0.0.1:3", "capacity_rps": 50},
                {"name": "eu-west", "zone": "eu", "agent": "127.0.0.1:4", "capacity_rps": 100},
            ],
            "timing": t,
            "recovery": {"step_percent": 25, "step_interval_s": 2},
        }
    )


class _Clock:
    def __init__(self, world: World) -> None:
        self.world = world

    def now(self) -> float:
        return self.world.now


class _Prewarmer:
    """The agents' side of a pre-warm: done at once with the world's figures, or never
    (``run_recovery_steps = False``: a stuck agent)."""

    def __init__(self, world: World) -> None:
        self.world = world

    async def prewarm(
        self, plan: FailoverPlan, budget_s: float, failover_id: str
    ) -> PrewarmFigures:
        return self.world.failover_result

    async def prewarm_home(
        self, region: str, budget_s: float, recovery_id: str, fraction: float
    ) -> PrewarmFigures:
        if not self.world.run_recovery_steps:
            await asyncio.Event().wait()  # never reports: cancelled when the tick ends
        return self.world.recovery_result


@dataclass
class World:
    topo: Topology = field(default_factory=topology)
    now: float = 1000.0
    records: dict[str, tuple[RegionRecord, int]] = field(default_factory=dict)
    health: dict[str, RegionHealth] = field(default_factory=dict)
    routing: dict[str, tuple[Routing, int]] = field(default_factory=dict)
    readiness: dict[str, Readiness] = field(default_factory=dict)
    reports: dict[tuple[str, str], HealthReport] = field(default_factory=dict)
    intents: dict[str, Intent] = field(default_factory=dict)
    outcomes: dict[str, IntentOutcome] = field(default_factory=dict)  # intent-outcomes/<id>
    control: ControlFlags = field(default_factory=ControlFlags)
    holds: dict[str, RegionHold] = field(default_factory=dict)  # regions/<r>/hold
    drill: DrillLock | None = None  # drills/lock: a drill running now
    audit: list[AuditEntry] = field(default_factory=list)
    results: list[TickResult] = field(default_factory=list)
    failover_result: PrewarmFigures = field(default_factory=PrewarmFigures)  # failover pre-warms
    recovery_result: PrewarmFigures = field(default_factory=PrewarmFigures)  # recovery pre-warms
    run_recovery_steps: bool = True  # False: recovery pre-warms never report (stuck agent)
    capacity: dict[str, CapacityRecord] = field(default_factory=dict)  # capacity/<r>
    active_replicas: dict[str, int] = field(default_factory=dict)  # len(pools/<r>.active)

    def __post_init__(self) -> None:
        self.keys = Keys(self.topo.cluster)
        self.store = MemoryStore()
        me = weakref.proxy(self)  # no cycle: a world is freed with its test
        self.orchestrator = Orchestrator(
            Cluster(self.store, self.keys, self.topo, _Clock(me)), list, _Prewarmer(me), "cp-test"
        )
        self._pulled: dict[str, bytes] = {}  # what the last tick read back, by key

    def report(self, region: str, observer: str, health: Health, **signals: float) -> None:
        kind = ObserverKind(observer.split(":", 1)[0])
        self.reports[(region, observer)] = HealthReport(
            region=region,
            observer=observer,
            kind=kind,
            health=health,
            signals=signals,
            received_at=self.now,
        )

    def all_report(self, region: str, health: Health, **signals: float) -> None:
        """Agent and control-plane probe agree (two vantage points: a quorum)."""
        self.report(region, "agent:" + region, health, **signals)
        self.report(region, "probe:controlplane", health)

    def snapshot(self) -> Snapshot:
        """The snapshot of the fields as they are (no store), for pure tests."""
        views = {}
        for r in self.topo.names:
            rec, rrev = self.records.get(r, (RegionRecord(region=r, since=self.now), 0))
            route = self.routing.get(r)
            views[r] = RegionView(
                name=r,
                record=rec,
                record_rev=rrev,
                health=self.health.get(r, RegionHealth(region=r, since=self.now)),
                readiness=self.readiness.get(r),
                routing=route[0] if route else None,
                routing_rev=route[1] if route else 0,
                capacity=self.capacity.get(r),
                active_replicas=self.active_replicas.get(r),
                hold=self.holds.get(r),
            )
        return Snapshot(
            now=self.now,
            regions=views,
            reports=tuple(self.reports.values()),
            intents=tuple(self.intents.values()),
            control=self.control,
            drill=self.drill,
        )

    def apply(self, w: Write) -> bool:
        """``w`` through the orchestrator's own write (a leader that dies after it)."""
        return self._run(self._apply_one(w))

    async def _apply_one(self, w: Write) -> bool:
        await self._push()
        await self.orchestrator.prepare(self.snapshot())  # as the loop does before deciding
        ok = await self.orchestrator.write(w)
        await self._pull()
        return ok

    def tick(self, advance: float = 1.0) -> TickResult:
        """One periodic tick, then the ticks its jobs wake at the same instant (a job that
        finishes wakes the loop: its result is recorded at once, not a period later)."""
        self.now += advance
        return self._run(self._tick())

    def _run(self, coro: Coroutine[object, object, R]) -> R:
        # A loop per call: what is still running at its end (a pre-warm that never
        # reports) is cancelled, and the next tick starts it again, as a new leader would.
        return asyncio.run(coro)

    async def _tick(self) -> TickResult:
        await self._push()
        res = await self._tick_once()
        for _ in range(4):  # a failover's pre-warm, then what its record lets happen
            if not any(j.kind in PREWARMS for j in self.results[-1].jobs):
                break
            await self._tick_once()
        await self._pull()
        return res

    async def _tick_once(self) -> TickResult:
        snap = await read_snapshot(self.store, self.keys, self.topo, self.now)
        await self.orchestrator.prepare(snap)
        sizes = self.orchestrator.sizes  # as the loop passes them
        res = decide(snap, self.topo, "cp-test", self.orchestrator.jobs(), sizes=sizes)
        await self.orchestrator.apply(res)
        for _ in range(5):  # the fake pre-warms finish within a few turns of the loop
            await asyncio.sleep(0)
        self.results.append(res)
        return res

    # ---- the fields <-> the store ---------------------------------------------------
    async def _push(self) -> None:
        """What the test wrote since the last tick goes to the store."""
        k = self.keys
        out: dict[str, bytes] = {}
        for r, (rec, _) in self.records.items():
            out[k.region_state(r)] = encode(rec)
        for r, (route, _) in self.routing.items():
            out[k.routing(r)] = encode(route)
        for r, h in self.health.items():
            out[k.region_health(r)] = encode(h)
        for r, ready in self.readiness.items():
            out[k.readiness(r)] = encode(ready)
        for (r, obs), rep in self.reports.items():
            out[k.report(r, obs)] = encode(rep)
        for i in self.intents.values():
            out[k.intent(i.id)] = encode(i)
        out[k.control()] = encode(self.control)
        for r, hold in self.holds.items():
            out[k.region_hold(r)] = encode(hold)
        if self.drill is not None:
            out[k.drill_lock()] = encode(self.drill)
        elif self._pulled.get(k.drill_lock()) is not None:
            await self.store.delete(k.drill_lock())
        for r, cap in self.capacity.items():
            out[k.capacity(r)] = encode(cap)
        for r, n in self.active_replicas.items():
            urls = tuple(f"http://{r}-{i}:8000" for i in range(n))
            members = PoolMembers(region=r, active=urls, warm=0, at=self.now, agent="t")
            out[k.pool(r)] = encode(members)
        for key, value in out.items():
            if self._pulled.get(key) != value:
                await self.store.put(key, value)

    async def _pull(self) -> None:
        """The fields as the store holds them now."""
        k, page = self.keys, await self.store.get_prefix(self.keys.root)
        kvs = {kv.key: kv for kv in page.kvs}
        self._pulled = {key: kv.value for key, kv in kvs.items()}
        self.records, self.routing, self.health = {}, {}, {}
        for r in self.topo.names:
            if (kv := kvs.get(k.region_state(r))) is not None:
                self.records[r] = (decode(RegionRecord, kv.value), kv.mod_revision)
            if (kv := kvs.get(k.routing(r))) is not None:
                self.routing[r] = (decode(Routing, kv.value), kv.mod_revision)
            if (kv := kvs.get(k.region_health(r))) is not None:
                self.health[r] = decode(RegionHealth, kv.value)
        self.intents = {i.id: i for i in self.intents.values() if k.intent(i.id) in kvs}
        self.holds = {  # the leader deletes an expired hold
            r: decode(RegionHold, kv.value)
            for r in self.topo.names
            if (kv := kvs.get(k.region_hold(r))) is not None
        }
        if (kv := kvs.get(k.control())) is not None:  # the leader ends an expired pause
            self.control = decode(ControlFlags, kv.value)
        self.outcomes = {
            key.rsplit("/", 1)[1]: decode(IntentOutcome, kv.value)
            for key, kv in kvs.items()
            if key.startswith(k.intent_outcomes_prefix())
        }
        self.audit = [
            decode(AuditEntry, kv.value)
            for key, kv in sorted(kvs.items())
            if key.startswith(k.audit_prefix())
        ]

    def state(self, region: str) -> str:
        return self.records[region][0].state.value if region in self.records else "NORMAL"

    def targets(self, region: str) -> dict[str, float]:
        return self.routing[region][0].targets if region in self.routing else {region: 1.0}
