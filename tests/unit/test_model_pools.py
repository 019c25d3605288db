"""Model pools in the topology (docs/models.md): a region holds one pool per served
model; each pool is a failover unit of its own; a topology without pools is as before."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import generate_latest

from chaos.drills.measure import Observed, SessionLog, judge
from chaos.drills.result import Transition
from chaos.drills.scenario import Measurements
from controlplane.core.failover import PlanRefused, plan_failover
from controlplane.kernel.cluster_spec import cluster_spec
from controlplane.kernel.codec import encode
from controlplane.kernel.config import ConfigError, Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Health
from controlplane.metrics import ControlPlaneMetrics
from regions.dataplane.models import ModelRoutes, UnknownModel, home_units
from tests.unit.world import TIMING, World
from tests.unit.world import topology as plain_topology


def pools(region: int, *names: str) -> list[dict[str, Any]]:
    models = {"chat": ["llama-3", "llama-3-sql"], "code": ["qwen-coder"]}
    return [
        {
            "name": n,
            "models": models[n],
            "agent": f"127.0.0.1:{7000 + 10 * region + i}",
            "capacity_rps": 40 if n == "chat" else 10,
            "replicas": [f"http://127.0.0.1:{8000 + 10 * region + i}"],
        }
        for i, n in enumerate(names)
    ]


def pooled(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "cluster": "test",
        "regions": [
            {"name": "us-east", "zone": "us", "pools": pools(0, "chat", "code")},
            {"name": "us-west", "zone": "us", "pools": pools(1, "chat", "code")},
            {"name": "us-central", "zone": "us", "pools": pools(2, "chat")},
            {"name": "eu-west", "zone": "eu", "pools": pools(3, "chat", "code")},
        ],
        "timing": TIMING,
        "recovery": {"step_percent": 25, "step_interval_s": 2},
    }
    data.update(changes)
    return data


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        parse_topology(data, "t.yaml")
    return str(e.value)


def test_each_pool_is_a_failover_unit_with_the_pools_own_settings() -> None:
    t = parse_topology(pooled())
    assert t.names == (
        "us-east.chat",
        "us-east.code",
        "us-west.chat",
        "us-west.code",
        "us-central.chat",
        "eu-west.chat",
        "eu-west.code",
    )
    assert t.sites == ("us-east", "us-west", "us-central", "eu-west")
    unit = t.region("us-east.code")
    assert (unit.zone, unit.agent, unit.capacity_rps) == ("us", "127.0.0.1:7001", 10)
    assert unit.replicas == ("http://127.0.0.1:8001",)
    assert t.family("us-east.code") == "code" and t.site("us-east.code") == "us-east"
    assert t.unit_for("us-east", "llama-3-sql") == "us-east.chat"
    assert t.unit_for("us-central", "qwen-coder") is None
    assert t.models_of("us-east") == ("llama-3", "llama-3-sql", "qwen-coder")
    assert t.family_of_model("qwen-coder") == "code"
    assert t.family_of_model("mistral") is None
    # spills stay within the zone and the family
    groups = t.spill_groups()
    assert groups["us-east.chat"] == groups["us-central.chat"] != groups["us-east.code"]


def test_a_pool_takes_the_regions_thresholds_and_slo_unless_it_sets_its_own() -> None:
    data = pooled()
    data["regions"][0]["degraded_when"] = {"queue_over": 7}
    data["regions"][0]["factor_of_safety"] = 3
    data["regions"][0]["pools"][1]["degraded_when"] = {"queue_over": 2}
    t = parse_topology(data)
    assert t.region("us-east.chat").degraded_when.queue_over == 7
    assert t.region("us-east.code").degraded_when.queue_over == 2
    assert t.region("us-east.code").factor_of_safety == 3


def test_failover_to_names_regions_and_each_pool_gets_the_same_pools_there() -> None:
    data = pooled()
    data["regions"][0]["failover_to"] = ["us-central", "us-west"]
    t = parse_topology(data)
    assert t.region("us-east.chat").failover_to == ("us-central.chat", "us-west.chat")
    assert t.region("us-east.code").failover_to == ("us-west.code",)


def test_pool_mistakes_are_refused_naming_the_field_and_the_fix() -> None:
    data = pooled()
    data["regions"][0]["agent"] = "127.0.0.1:1"
    assert "regions[0]: a region with pools takes agent from each pool" in refused(data)
    data = pooled()
    data["regions"][1]["pools"][1]["name"] = "chat"
    assert "pool names must be unique in a region; repeated: ['chat']" in refused(data)
    data = pooled()
    data["regions"][1]["pools"][1]["models"] = ["llama-3"]
    assert "a model is answered by one pool of a region; in several: ['llama-3']" in refused(data)
    data = pooled()
    data["regions"][3]["pools"][1]["models"] = ["deepseek-coder"]
    assert "pools named 'code' answer different models" in refused(data)
    data = pooled()
    data["regions"][0]["pools"][0]["models"] = ["two words"]
    assert "regions[0].pools[0].models[0]" in refused(data)
    data = pooled()
    data["regions"][0]["failover_to"] = ["us-central"]  # no 'code' pool there
    assert "holds no pool 'code', but ['us-west'] of its zone do" in refused(data)


def test_a_region_without_pools_never_fails_over_to_pools() -> None:
    data = pooled()
    data["regions"].append(
        {
            "name": "ap-south",
            "zone": "us",
            "agent": "127.0.0.1:9",
            "capacity_rps": 5,
            "failover_to": ["us-east"],
        }
    )
    assert "region 'ap-south' (no pools: any model) fails over to ['us-east']" in refused(data)


def test_a_topology_without_pools_is_unchanged_and_so_is_its_cluster_spec() -> None:
    t = plain_topology()
    assert not t.pooled
    assert t.names == t.sites == ("us-east", "us-west", "us-central", "eu-west")
    assert t.unit_for("us-east", "any-model") == "us-east"
    assert t.family_of_model("any-model") == ""
    assert t.spill_groups() == {r.name: r.zone for r in t.regions}
    # the spec as every release before pools wrote it: no "models" key anywhere
    assert b"models" not in encode(cluster_spec(t))
    assert Keys("test").session("abc") == "/tectonic/test/sessions/abc"


def test_pools_are_in_the_cluster_spec_so_gateways_agree_on_models() -> None:
    t = parse_topology(pooled())
    spec = {r.name: r.models for r in cluster_spec(t).regions}
    assert spec["us-east.code"] == ("qwen-coder",)
    assert Keys("test").session("abc", "chat") == "/tectonic/test/sessions/abc/chat"


def test_a_target_without_the_models_pool_is_not_a_target() -> None:
    t = parse_topology(pooled())
    w = World(topo=t)
    for _ in range(3):
        for unit in t.names:
            w.all_report(unit, Health.HEALTHY)
        w.tick()
    snap = w.snapshot()
    plan = plan_failover(snap, t, "us-east.code", reason="drill", actor="test")
    assert set(plan.targets) == {"us-west.code"}  # the zone's, of the same pool
    with pytest.raises(PlanRefused) as e:
        plan_failover(
            snap, t, "us-east.code", reason="x", actor="t", requested=["us-west.chat"], forced=True
        )
    assert "serves no pool 'code'" in str(e.value)


def test_a_pool_that_fails_moves_only_its_own_traffic() -> None:
    t = parse_topology(pooled())
    w = World(topo=t)

    def tick(bad: set[str]) -> None:
        for unit in t.names:
            w.all_report(unit, Health.UNHEALTHY if unit in bad else Health.HEALTHY)
        w.tick()

    for _ in range(3):
        tick(set())
    for _ in range(3):
        tick({"us-east.code"})
    assert w.state("us-east.code") == "FAILING_OVER"
    assert set(w.targets("us-east.code")) == {"us-west.code"}
    assert all(w.state(u) == "NORMAL" for u in t.names if u != "us-east.code")
    # a region-wide fault: every pool of the region is unhealthy, every pool moves
    for _ in range(3):
        tick({"us-west.chat", "us-west.code"})
    assert w.state("us-west.chat") == "FAILING_OVER"
    assert set(w.targets("us-west.chat")) <= {"us-east.chat", "us-central.chat"}


def test_each_family_has_a_home_here_else_nearby_and_unknown_models_are_404() -> None:
    t = parse_topology(pooled())
    assert home_units(t, "us-central") == {"chat": "us-central.chat", "code": "us-east.code"}
    assert home_units(t, "eu-west") == {"chat": "eu-west.chat", "code": "eu-west.code"}
    routes = ModelRoutes(t, "us-central", {"chat": "C", "code": "K"})
    assert routes.for_model("qwen-coder") == "K" and routes.default == "C"
    assert routes.models_of("code") == ("qwen-coder",)
    with pytest.raises(UnknownModel) as e:
        routes.for_model("mistral")
    assert (e.value.status, e.value.param) == (404, "model")
    assert e.value.message == "The model `mistral` does not exist."


def test_a_topology_object_is_still_frozen_after_its_pools_are_unfolded() -> None:
    t = parse_topology(pooled())
    assert isinstance(t, Topology)
    with pytest.raises(ValueError):
        t.regions = ()  # type: ignore[misc]


def test_every_pool_has_an_info_series_to_join_its_region_label_on() -> None:
    t = parse_topology(pooled())
    text = ControlPlaneMetrics(t.names, t).scrape(leader=True).decode()
    assert (
        'tectonic_pool_info{model="llama-3",models="llama-3,llama-3-sql",pool="chat",'
        'pool_of="us-east",region="us-east.chat"} 1.0'
    ) in text
    plain = ControlPlaneMetrics(plain_topology().names, plain_topology()).scrape(leader=True)
    assert b"tectonic_pool_info" not in plain


def test_each_pools_series_carries_its_model_and_nothing_changes_without_pools() -> None:
    t = parse_topology(pooled())
    m = ControlPlaneMetrics(t.names, t)
    text = m.scrape(leader=True).decode()
    assert (
        'tectonic_transitions_total{from="NORMAL",model="qwen-coder",region="us-east.code",'
        'to="DEGRADED",trigger="degrade"} 0.0'
    ) in text
    region_series = [
        line for line in text.splitlines() if 'region="' in line and not line.startswith("#")
    ]
    assert region_series and all("model=" in line for line in region_series)
    # without pools: the registry's own exposition, byte for byte
    plain = ControlPlaneMetrics(plain_topology().names, plain_topology())
    assert plain.scrape(leader=True) == generate_latest(plain.registry)
    assert b"model=" not in plain.scrape(leader=True)


def _observed(region: str, units: tuple[str, ...], moved: tuple[str, ...]) -> Observed:
    path = ("FAILING_OVER", "RECOVERED", "NORMAL")
    return Observed(
        region=region,
        fault_t=1.0,
        samples=(),
        transitions=[
            Transition(t=2.0 + i, region=u, from_state="", to_state=s)
            for u in moved
            for i, s in enumerate(path)
        ],
        ladder=(),
        sessions=(SessionLog("s1", units[0], ((0.5, units[0]), (3.0, "us-west.chat"))),),
        units=units,
    )


def test_a_drill_on_a_region_judges_each_of_its_pools() -> None:
    m = Measurements(expect_states=("FAILING_OVER", "RECOVERED", "NORMAL"), max_failovers=1)
    judged = {
        c.name: c for c in judge(m, _observed("us-east", ("us-east.chat",), ("us-east.chat",)))
    }
    assert judged["state_path"].passed and judged["failovers"].passed  # one pool: its own path
    both = ("us-east.chat", "us-east.code")
    judged = {c.name: c for c in judge(m, _observed("us-east", both, both))}
    assert judged["state_path"].passed and "us-east.code:" in judged["state_path"].measured
    judged = {c.name: c for c in judge(m, _observed("us-east", both, ("us-east.chat",)))}
    assert not judged["state_path"].passed  # the code pool never failed over
