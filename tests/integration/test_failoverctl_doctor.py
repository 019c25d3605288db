"""failoverctl doctor against a real control-plane replica on a real etcd: every question
answered once, each with its evidence, a non-PASS with what to do; the exit code by the
lines (1: the lab has never drilled, and the cost guardrail is not built), 3 when the
control plane is unreachable."""

from __future__ import annotations

import json
import uuid

import pytest

from controlplane.kernel.config import Topology
from tests.integration.cp_harness import fast_topology, reporting, running_replica
from tests.integration.test_failoverctl import ctl, healthy

pytestmark = pytest.mark.etcd


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"c{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


async def test_doctor_answers_every_question_with_evidence(topology: Topology) -> None:
    async with running_replica(topology) as run, reporting(run.stub, {}):
        await healthy(run)
        code, out, err = await ctl(run.target, "doctor", "--json")
        assert code == 1, err
        body = json.loads(out)
        checks = body["checks"]
        assert [c["id"] for c in checks] == list(range(1, 11)) and body["exit_code"] == 1
        assert all(c["verdict"] in {"PASS", "FAIL", "UNKNOWN"} and c["evidence"] for c in checks)
        assert all(c["todo"] for c in checks if c["verdict"] != "PASS")
        by_id = {c["id"]: c for c in checks}
        assert by_id[8]["evidence"] == "no budget configured: the cost guardrail is not built"
        assert by_id[9]["verdict"] == "FAIL" and "never drilled" in by_id[9]["evidence"]

        code, out, _ = await ctl(run.target, "doctor", "--region", "east")
        lines = [x for x in out.splitlines() if x.split(" ", 1)[0] in {"PASS", "FAIL", "UNKNOWN"}]
        assert code == 1 and len(lines) == 10, out
        assert "west" not in out

    code, _, err = await ctl("127.0.0.1:1", "--timeout", "1", "doctor")
    assert code == 3 and "unreachable" in err
