"""Scale to zero (docs/scaling.md, "Scale to zero"), on a fake clock: an idle pool goes
to zero after its idle window, a wake request brings it back to one at once, and a
pool asleep on purpose is never failed over."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from controlplane.core.scaler import Capacity, PoolSignals, size_pool
from controlplane.kernel.model import Health
from controlplane.kernel.pool.scale import ASLEEP_SIGNAL, ScaleRecord, ScalingPolicy
from tests.unit.world import World

POLICY = ScalingPolicy(
    horizon_s=5, stable_window_s=300, min_active=0, burst_warm=0, idle_to_zero_s=60
)
TEN = Capacity(lambda h: 10.0, "typed")


@dataclass
class Pool:
    """One pool ticked once a second as the leader does, its ACTIVE following at once."""

    policy: ScalingPolicy = POLICY
    stored: ScaleRecord | None = None
    history: list[ScaleRecord] = field(default_factory=list)
    active_now: int = 1

    def tick(self, now: float, load: float, wake_at: float | None = None) -> ScaleRecord:
        signals = PoolSignals(now, load, 0.0, 0.0, None, self.active_now, wake_at=wake_at)
        sized = size_pool("east", self.stored, signals, TEN, self.policy, now=now, ttft_slo_s=None)
        self.stored = sized.record
        self.active_now = sized.record.active
        self.history.append(sized.record)
        return sized.record


def test_an_idle_pool_goes_to_zero_after_its_window_not_before() -> None:
    pool = Pool()
    for t in range(0, 30):
        pool.tick(float(t), 5.0)
    for t in range(30, 89):  # idle from 30: the window ends at 90
        assert pool.tick(float(t), 0.0).active == 1
    rec = pool.tick(90.0, 0.0)
    assert rec.active == 0 and rec.asleep
    assert rec.warm == 1  # zero_state warm: one asleep, a wake in seconds
    assert any("idle_to_zero_s 60" in r for r in rec.reasons)
    assert pool.tick(200.0, 0.0).active == 0  # and it stays asleep


def test_a_wake_request_brings_a_pool_at_zero_to_one_at_once() -> None:
    pool = Pool()
    pool.tick(0.0, 0.0)
    pool.tick(61.0, 0.0)
    assert pool.history[-1].asleep
    rec = pool.tick(62.0, 0.0, wake_at=61.5)
    assert rec.active == 1 and rec.reasons[0].startswith("woken by a request")
    assert rec.woken_at == 61.5
    # the wake is demand: the pool stays up an idle window from it, then sleeps again
    for t in range(63, 121):
        assert pool.tick(float(t), 0.0, wake_at=61.5).active == 1
    assert pool.tick(122.0, 0.0, wake_at=61.5).active == 0


def test_an_old_wake_request_wakes_nothing() -> None:
    pool = Pool()
    pool.tick(0.0, 0.0, wake_at=-5.0)  # honoured (a first record) and then idle
    assert pool.tick(61.0, 0.0, wake_at=-5.0).active == 0


def test_zero_state_cold_keeps_nothing_warm() -> None:
    pool = Pool(policy=POLICY.model_copy(update={"zero_state": "cold", "burst_warm": 2}))
    pool.tick(0.0, 0.0)
    assert pool.tick(61.0, 0.0).warm == 0


def test_without_an_idle_window_nothing_changes() -> None:
    pool = Pool(policy=ScalingPolicy(min_active=1, burst_warm=0))
    pool.tick(0.0, 0.0)
    assert pool.tick(1000.0, 0.0, wake_at=999.0).active == 1


def test_an_idle_window_needs_min_active_zero() -> None:
    with pytest.raises(ValidationError, match="idle_to_zero_s needs min_active: 0"):
        ScalingPolicy(min_active=1, idle_to_zero_s=60)


def test_a_pool_at_zero_is_not_failed_over() -> None:
    """Its agent, alive, says asleep; gateways whose requests found no replica say
    down: the region stays NORMAL and keeps its routing."""
    world = World()
    for _ in range(10):
        world.report("us-east", "agent:us-east", Health.HEALTHY, **{ASLEEP_SIGNAL: 1.0})
        world.report("us-east", "gateway:g1", Health.UNHEALTHY)
        world.report("us-east", "gateway:g2", Health.UNHEALTHY)
        for other in ("us-west", "us-central", "eu-west"):
            world.all_report(other, Health.HEALTHY)
        world.tick()
    assert world.state("us-east") == "NORMAL"
    assert world.health["us-east"].verdict is Health.HEALTHY


def test_a_pool_down_without_the_asleep_signal_is_failed_over() -> None:
    """The contrast: the same votes without the agent saying asleep fail it over."""
    world = World()
    for _ in range(10):
        world.report("us-east", "agent:us-east", Health.UNHEALTHY)
        world.report("us-east", "gateway:g1", Health.UNHEALTHY)
        world.report("us-east", "gateway:g2", Health.UNHEALTHY)
        for other in ("us-west", "us-central", "eu-west"):
            world.all_report(other, Health.HEALTHY)
        world.tick()
    assert world.state("us-east") != "NORMAL"
