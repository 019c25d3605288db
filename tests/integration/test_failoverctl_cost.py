"""failoverctl cost against a real control-plane replica on a real etcd: ``cost show``
per pool, zone and fleet (``--json``); ``cost lift`` stored, audited, shown in status
and ended by the leader by itself; ``cost unlift``; bad input refused, nothing changed."""

from __future__ import annotations

import json
import uuid

import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.kernel.config import Topology
from controlplane.kernel.pool.cost import CostPolicy, Prices
from controlplane.kernel.pool.scale import ScalingPolicy
from tests.integration.cp_harness import fast_topology, reporting, running_replica, until
from tests.integration.test_failoverctl import ctl, healthy

pytestmark = pytest.mark.etcd

COST = CostPolicy(
    prices=Prices(active=4.0, warm=1.0),
    pool_budgets={"east": 20.0},
    zone_budgets={"us": 50.0},
    fleet_budget=100.0,
)


@pytest.fixture
def topology(etcd: object) -> Topology:
    topo = fast_topology(etcd.endpoints, f"c{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]
    return topo.model_copy(update={"scaling": ScalingPolicy(), "cost": COST})


async def test_cost_show_and_a_lift_that_ends_by_itself(topology: Topology) -> None:
    async with running_replica(topology) as run, reporting(run.stub, {}):
        await healthy(run)
        code, out, err = await ctl(run.target, "cost", "show", "--json")
        assert code == 0, err
        report = json.loads(out)
        assert [p["unit"] for p in report["pools"]] == ["east", "west", "central", "eu"]
        east = report["pools"][0]
        assert east["budget"] == 20.0 and east["zone"] == "us" and east["lift"] is None
        scopes = {(s["scope"], s["name"]): s for s in report["scopes"]}
        assert scopes[("zone", "us")]["budget"] == 50.0 and scopes[("zone", "eu")]["budget"] is None
        assert scopes[("fleet", "fleet")]["budget"] == 100.0
        code, out, err = await ctl(run.target, "cost", "show")
        assert code == 0 and "east" in out and "fleet" in out, err

        # bad input: refused with what to do, nothing stored
        code, _, err = await ctl(run.target, "cost", "lift", "nowhere", "--reason", "r")
        assert code == 2 and "unknown region" in err
        code, _, err = await ctl(run.target, "cost", "lift", "east", "--reason", "r", "--for", "9d")
        assert code == 2 and "at most" in err

        code, _, err = await ctl(
            run.target, "cost", "lift", "east", "--reason", "INC-9: launch", "--for", "2s"
        )
        assert code == 0, err
        st = await run.stub.GetStatus(pb.GetStatusRequest())
        east_st = next(r for r in st.regions if r.name == "east")
        assert east_st.HasField("budget_lift") and east_st.budget_lift.reason == "INC-9: launch"
        code, out, _ = await ctl(run.target, "cost", "show", "--json")
        assert json.loads(out)["pools"][0]["lift"]["reason"] == "INC-9: launch"

        # the leader ends it at its end, audited as an unlift naming it
        await until(lambda s: not any(r.HasField("budget_lift") for r in s.regions), run.stub, {})
        code, out, _ = await ctl(run.target, "history", "--region", "east", "--json")
        events = json.loads(out)
        actions = [e["action"] for e in events]
        assert "budget_lift" in actions and "budget_unlift" in actions
        ended = next(e for e in events if e["action"] == "budget_unlift")
        assert "expired" in ended["reason"] and "INC-9" in ended["reason"]

        code, _, err = await ctl(run.target, "cost", "unlift", "east", "--reason", "done")
        assert code == 0, err
