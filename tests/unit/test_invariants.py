"""Property-based (hypothesis state machine) checks of the core's safety invariants.

Random health reports, time, drill verdicts, operator intents and pauses drive the
pure world; after every tick the invariants must hold:

* at least one region is always serving (never every region failed over);
* no transition outside the four-state graph;
* an unforced failover never routes into a barred, UNHEALTHY or UNKNOWN region;
* no automatic failover of a region more than once per cooldown;
* routing weights are positive, name known regions and sum to 1.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from controlplane.core.machine import ALLOWED_EDGES
from controlplane.kernel.model import (
    ControlFlags,
    Health,
    Intent,
    IntentKind,
    Readiness,
    RegionState,
)
from tests.unit.world import World

REGIONS = ("us-east", "us-west", "us-central", "eu-west")
VOTE = st.sampled_from([Health.HEALTHY, Health.HEALTHY, Health.DEGRADED, Health.UNHEALTHY])


class ControlPlaneModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.w = World()
        self.auto_failovers: dict[str, list[float]] = {r: [] for r in REGIONS}
        self.checked_audit = 0
        self.n = 0

    @rule(
        votes=st.lists(VOTE, min_size=len(REGIONS), max_size=len(REGIONS)),
        partial=st.booleans(),
        advance=st.sampled_from([0.5, 1.0, 1.0, 2.0, 7.0]),
    )
    def tick(self, votes: list[Health], partial: bool, advance: float) -> None:
        for r, h in zip(REGIONS, votes, strict=True):
            self.w.report(r, "agent:" + r, h, load_rps=30.0)
            if not partial:
                self.w.report(r, "probe:controlplane", h)
        before = {r: self.w.health.get(r) for r in REGIONS}
        self.w.tick(advance)
        self.n += 1
        self._check_new_decisions(before)

    @rule(region=st.sampled_from(REGIONS), passed=st.booleans())
    def drill(self, region: str, passed: bool) -> None:
        self.w.readiness[region] = Readiness(passed=passed, drill="d", at=self.w.now)

    @rule(
        region=st.sampled_from(REGIONS),
        to=st.lists(st.sampled_from(REGIONS), max_size=2),
        force=st.booleans(),
        recover=st.booleans(),
    )
    def intent(self, region: str, to: list[str], force: bool, recover: bool) -> None:
        i = Intent(
            id=f"i{self.n}-{region}",
            region=region,
            reason="drill",
            actor="prop",
            kind=IntentKind.RECOVER if recover else IntentKind.FAILOVER,
            targets=() if recover else tuple(t for t in to if t != region),
            force=force,
            created_at=self.w.now,
        )
        self.w.intents[i.id] = i

    @rule(paused=st.booleans())
    def pause(self, paused: bool) -> None:
        self.w.control = ControlFlags(paused=paused, reason="prop")

    def _check_new_decisions(self, health_before: dict[str, object]) -> None:
        for entry in self.w.audit[self.checked_audit :]:
            d = entry.decision
            if d is None:
                continue
            assert (d.from_state, d.to_state) in ALLOWED_EDGES
            if d.to_state is RegionState.FAILING_OVER:
                rec = self.w.records[d.region][0]
                assert rec.failover is not None
                plan = rec.failover.plan
                if not plan.forced:
                    for t in plan.targets:
                        h = self.w.health[t]
                        assert h.verdict in (Health.HEALTHY, Health.DEGRADED), (t, h.verdict)
                        assert not self.w.snapshot().regions[t].barred
                if d.trigger == "fail_over" and not plan.manual:
                    past = self.auto_failovers[d.region]
                    if past:
                        assert d.at - past[-1] >= self.w.topo.timing.failover_cooldown_s
                    past.append(d.at)
        self.checked_audit = len(self.w.audit)

    @invariant()
    def someone_serves(self) -> None:
        assert any(self.w.state(r) != "FAILING_OVER" for r in REGIONS)

    @invariant()
    def routing_is_well_formed(self) -> None:
        for r in REGIONS:
            t = self.w.targets(r)
            assert t and all(k in REGIONS and v > 0 for k, v in t.items())
            assert sum(t.values()) == pytest.approx(1.0, abs=1e-4)


ControlPlaneModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestControlPlaneInvariants = ControlPlaneModel.TestCase
