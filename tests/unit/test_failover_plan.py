"""Safety rules and target choice of the failover planner (pure)."""

from __future__ import annotations

import pytest

from controlplane.core.failover import (
    PlanRefused,
    plan_failover,
    routing_after_switch,
    routing_recovery_step,
)
from controlplane.kernel.model import Health, Readiness, RegionHealth, Routing
from tests.unit.world import World


def world_with(health: dict[str, Health], load: dict[str, float] | None = None) -> World:
    w = World()
    for r in w.topo.names:
        w.health[r] = RegionHealth(
            region=r,
            verdict=health.get(r, Health.HEALTHY),
            signals={"load_rps": (load or {}).get(r, 0.0)},
        )
    return w


def plan(w: World, source: str, **kw: object):  # type: ignore[no-untyped-def]
    return plan_failover(w.snapshot(), w.topo, source, reason="test", actor="t", **kw)  # type: ignore[arg-type]


def test_targets_share_load_by_headroom_within_the_zone() -> None:
    w = world_with({"us-east": Health.UNHEALTHY}, load={"us-west": 40, "us-central": 20})
    p = plan(w, "us-east")
    # headroom: us-west 100-40=60, us-central 50-20=30; eu-west is another zone
    assert p.targets == pytest.approx({"us-west": 2 / 3, "us-central": 1 / 3}, abs=1e-5)
    assert "eu-west" not in p.targets and not p.warm_first


def test_never_into_barred_unhealthy_unknown_or_full_regions() -> None:
    w = world_with(
        {"us-east": Health.UNHEALTHY, "us-west": Health.UNKNOWN}, load={"us-central": 60}
    )
    with pytest.raises(PlanRefused) as e:
        plan(w, "us-east")
    assert e.value.code == "no_target" and "UNKNOWN" in str(e.value)
    w = world_with({"us-east": Health.UNHEALTHY})
    w.readiness["us-west"] = Readiness(passed=False, drill="blackout")
    p = plan(w, "us-east")
    assert set(p.targets) == {"us-central"}


def test_force_overrides_rules_but_needs_a_reason() -> None:
    w = world_with({"us-east": Health.UNHEALTHY})
    p = plan(w, "us-east", requested=["eu-west"], forced=True)
    assert p.targets == {"eu-west": 1.0} and p.forced
    with pytest.raises(PlanRefused, match="zone"):
        plan(w, "us-east", requested=["eu-west"])
    with pytest.raises(PlanRefused, match="reason"):
        plan_failover(
            w.snapshot(),
            w.topo,
            "us-east",
            reason=" ",
            actor="t",
            requested=["eu-west"],
            forced=True,
        )


def test_never_route_away_from_the_last_healthy_region() -> None:
    w = world_with(
        {"us-west": Health.UNHEALTHY, "us-central": Health.UNHEALTHY, "eu-west": Health.UNHEALTHY}
    )
    with pytest.raises(PlanRefused) as e:
        plan(w, "us-east", requested=["us-west"], manual=True)
    assert e.value.code == "no_target"
    with pytest.raises(PlanRefused) as e:  # not even with force
        plan(w, "us-east", requested=["us-west"], manual=True, forced=True)
    assert e.value.code == "last_healthy"


def test_unknown_region_and_cooldown() -> None:
    w = world_with({})
    with pytest.raises(PlanRefused) as e:
        plan(w, "mars-1")
    assert e.value.code == "unknown_region"
    rec = w.snapshot().regions["us-east"].record.model_copy(update={"last_failover_at": w.now - 10})
    w.records["us-east"] = (rec, 5)
    with pytest.raises(PlanRefused) as e:
        plan(w, "us-east")
    assert e.value.code == "cooldown"


def test_the_cooldown_holds_automation_not_an_operator() -> None:
    # A manual failover inside the cooldown is planned as usual, without --force: the
    # cooldown keeps automation from bouncing a region, not an operator from draining it.
    w = world_with({})
    rec = w.snapshot().regions["us-east"].record.model_copy(update={"last_failover_at": w.now - 10})
    w.records["us-east"] = (rec, 5)
    p = plan(w, "us-east", manual=True)
    assert not p.forced and p.manual and p.targets


def test_switch_redirects_traffic_already_sent_to_the_source() -> None:
    w = world_with({})
    w.routing["us-east"] = (Routing(targets={"us-west": 1.0}, epoch=1), 3)
    p = plan(w, "us-west", requested=["us-central"], manual=True)
    routes = routing_after_switch(w.snapshot(), p)
    assert routes["us-west"].targets == {"us-central": 1.0}
    assert routes["us-east"].targets == {"us-central": 1.0} and routes["us-east"].epoch == 2


def test_recovery_steps_move_weight_home_gradually() -> None:
    r = Routing(targets={"us-west": 0.5, "us-central": 0.5}, epoch=4)
    s1 = routing_recovery_step(r, "us-east", 0.25)
    assert s1.targets == pytest.approx({"us-east": 0.25, "us-west": 0.375, "us-central": 0.375})
    assert routing_recovery_step(s1, "us-east", 1.0).targets == {"us-east": 1.0}
