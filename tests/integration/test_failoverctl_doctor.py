"""failoverctl doctor against a real control-plane replica on a real etcd: every question
answered once, each with its evidence, a non-PASS with what to do; the exit code by the
lines (1: the lab has never drilled), 3 when the control plane is unreachable. The
topology has a ``cost:`` section, so the budget question answers from GetCost and the
checkout's alert rules; the replica runs no degradation ladder, so GetStatus reports
none and question 6 cannot compare it. A lab where every line passes, and one that fails
exactly the three stale lines, is ``test_doctor_lab.py``."""

from __future__ import annotations

import json
import uuid

import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.procs import until as poll
from controlplane.kernel.config import Topology
from controlplane.kernel.pool.cost import CostPolicy, Prices
from tests.integration.cp_harness import fast_topology, reporting, running_replica
from tests.integration.test_failoverctl import ctl, healthy

pytestmark = pytest.mark.etcd


@pytest.fixture
def topology(etcd: object) -> Topology:
    topo = fast_topology(etcd.endpoints, f"c{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]
    policy = CostPolicy(
        prices=Prices(active=4.0, warm=1.0), pool_budgets={"east": 40.0}, fleet_budget=200.0
    )
    return topo.model_copy(update={"cost": policy})


async def test_doctor_answers_every_question_with_evidence(topology: Topology) -> None:
    async with running_replica(topology) as run, reporting(run.stub, {}):
        await healthy(run)
        # a second agent of east that read its replicas' /version (the harness's do not)
        engine = pb.HealthReport(
            region="east",
            observer="agent:east-b",
            kind=pb.AGENT,
            health=pb.HEALTHY,
            signals={"load_rps": 10},
            engine_version="0.11.0",
        )

        async def versioned() -> bool:
            await run.stub.ReportHealth(engine)
            st = await run.stub.GetStatus(pb.GetStatusRequest())
            return any(r.name == "east" and r.engine_version == "0.11.0" for r in st.regions)

        await poll(versioned, within=20, what="east's engine version in GetStatus")
        code, out, err = await ctl(run.target, "doctor", "--json")
        assert code == 1, err
        body = json.loads(out)
        checks = body["checks"]
        assert [c["id"] for c in checks] == list(range(1, 11)) and body["exit_code"] == 1
        assert all(c["verdict"] in {"PASS", "FAIL", "UNKNOWN"} and c["evidence"] for c in checks)
        assert all(c["todo"] for c in checks if c["verdict"] != "PASS")
        by_id = {c["id"]: c for c in checks}
        assert by_id[8]["verdict"] == "PASS", by_id[8]
        assert "TectonicBudgetBinding" in by_id[8]["evidence"]
        assert "east: $" in by_id[8]["evidence"] and "of $40.00/h" in by_id[8]["evidence"]
        assert by_id[9]["verdict"] == "FAIL" and "never drilled" in by_id[9]["evidence"]
        assert by_id[6]["verdict"] == "UNKNOWN" and "reports no ladder" in by_id[6]["evidence"]
        assert "east: every up replica runs 0.11.0" in by_id[10]["evidence"], by_id[10]
        assert "west: its agent reports no engine version" in by_id[10]["evidence"]

        code, out, _ = await ctl(run.target, "doctor", "--region", "east")
        lines = [x for x in out.splitlines() if x.split(" ", 1)[0] in {"PASS", "FAIL", "UNKNOWN"}]
        assert code == 1 and len(lines) == 10, out
        assert "west" not in out

    code, _, err = await ctl("127.0.0.1:1", "--timeout", "1", "doctor")
    assert code == 3 and "unreachable" in err
