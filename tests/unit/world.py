"""A pure, in-process world for driving the deciding core tick by tick.

It plays the orchestrator's part without any I/O: applies each ``Write`` with the
same compare-and-set rules the etcd transaction uses, and runs failover steps at
once. Records, routing and audit entries are kept as etcd keeps them, encoded to
JSON and decoded back, so a value that would not read back fails here. Time is a
fake clock advanced by the test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import BaseModel

from controlplane.core.actions import TickResult, Write
from controlplane.core.decide import decide
from controlplane.core.intents import IntentOutcome
from controlplane.core.steps import (
    failover_step_write,
    pending_steps,
    recovery_pending,
    recovery_step_write,
)
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.model import (
    AuditEntry,
    ControlFlags,
    Health,
    HealthReport,
    Intent,
    ObserverKind,
    PrewarmFigures,
    Readiness,
    RegionHealth,
    RegionRecord,
    Routing,
)
from controlplane.kernel.snapshot import RegionView, Snapshot

M = TypeVar("M", bound=BaseModel)


def stored(value: M) -> M:
    """``value`` as a reader of etcd gets it back: JSON out, JSON in."""
    return decode(type(value), encode(value), "world")


def topology(**timing: float) -> Topology:
    t = {
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
    t.update(timing)
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


@dataclass
class World:
    topo: Topology = field(default_factory=topology)
    now: float = 1000.0
    rev: int = 1
    records: dict[str, tuple[RegionRecord, int]] = field(default_factory=dict)
    health: dict[str, RegionHealth] = field(default_factory=dict)
    routing: dict[str, tuple[Routing, int]] = field(default_factory=dict)
    readiness: dict[str, Readiness] = field(default_factory=dict)
    reports: dict[tuple[str, str], HealthReport] = field(default_factory=dict)
    intents: dict[str, Intent] = field(default_factory=dict)
    outcomes: dict[str, IntentOutcome] = field(default_factory=dict)  # intent-outcomes/<id>
    control: ControlFlags = field(default_factory=ControlFlags)
    audit: list[AuditEntry] = field(default_factory=list)
    results: list[TickResult] = field(default_factory=list)
    recovery_result: PrewarmFigures = field(default_factory=PrewarmFigures)  # recovery pre-warms
    run_recovery_steps: bool = True  # False: recovery pre-warms never report (stuck agent)

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
            )
        return Snapshot(
            now=self.now,
            regions=views,
            reports=tuple(self.reports.values()),
            intents=tuple(self.intents.values()),
            control=self.control,
        )

    def apply(self, w: Write) -> bool:
        cur = self.records.get(w.region, (None, 0))[1]
        if cur != w.expected_rev:
            return False
        for r, rev in w.routing_revs.items():
            if self.routing.get(r, (None, 0))[1] != rev:
                return False
        self.rev += 1
        self.records[w.region] = (stored(w.record), self.rev)
        for r, v in w.routing.items():
            self.routing[r] = (stored(v), self.rev)
        self.audit.extend(stored(a) for a in w.audit)
        if w.intent_outcome is not None:
            self.intents.pop(w.intent_outcome.id, None)
            self.outcomes[w.intent_outcome.id] = stored(w.intent_outcome)
        return True

    def tick(self, advance: float = 1.0) -> TickResult:
        self.now += advance
        res = decide(self.snapshot(), self.topo, "cp-test")
        for h in res.health:
            self.health[h.region] = h.health
        for d in res.dropped:
            self.intents.pop(d.intent_id, None)
            self.audit.append(stored(d.audit))
            self.outcomes[d.intent_id] = stored(d.outcome)
        for w in res.writes:
            self.apply(w)
        for f in res.failovers:
            while steps := pending_steps(self.records[f.region][0]):
                try:
                    w = failover_step_write(self.snapshot(), f.region, steps[0], "cp-test", {})
                except ValueError:
                    break
                assert self.apply(w)
        for r in res.recoveries if self.run_recovery_steps else ():
            # the recovery pre-warm: done at once, with these figures
            while later := recovery_pending(self.records[r.region][0]):
                w = recovery_step_write(
                    self.snapshot(), r.region, later[0], "cp-test", self.recovery_result
                )
                assert self.apply(w)
        self.results.append(res)
        return res

    def state(self, region: str) -> str:
        return self.records[region][0].state.value if region in self.records else "NORMAL"

    def targets(self, region: str) -> dict[str, float]:
        return self.routing[region][0].targets if region in self.routing else {region: 1.0}
