"""failoverctl over model pools (docs/models.md), the installed CLI against a real
control-plane replica on a real etcd: ``status`` groups each region's pools under it
(its JSON, and the HTTP API's ``/v1/status``, name each pool's region, pool and
models); ``failover REGION --model M`` moves only the pool answering M, ``failover
REGION`` plans every pool of the region, and a model no pool of the region answers is
bad input that changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator

import pytest
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from controlplane.kernel.config import Topology, parse_topology
from tests.integration.cp_harness import FAST_TIMING, region, running_replica
from tests.integration.http_api_helpers import get_json, http_client
from tests.integration.test_failoverctl import ctl

pytestmark = pytest.mark.etcd

MODELS = {"chat": "llama-3", "code": "qwen-coder"}
UNITS = [f"{r}.{p}" for r in ("east", "west") for p in MODELS]


@pytest.fixture
def topology(etcd: object) -> Topology:
    endpoints = etcd.endpoints  # type: ignore[attr-defined]
    return parse_topology(
        {
            "cluster": f"c{uuid.uuid4().hex[:8]}",
            "etcd": {"endpoints": list(endpoints)},
            "regions": [
                {
                    "name": r,
                    "zone": "us",
                    "pools": [
                        {"name": p, "models": [m], "agent": "127.0.0.1:9", "capacity_rps": 50}
                        for p, m in MODELS.items()
                    ],
                }
                for r in ("east", "west")
            ],
            # no recovery while the test looks at a failed-over pool
            "timing": {**FAST_TIMING, "recovery_dwell_s": 60},
        }
    )


@contextlib.asynccontextmanager
async def reporting(stub: pb_grpc.ControlPlaneStub) -> AsyncIterator[None]:
    """Every pool's observers report it healthy, in the background."""

    async def loop() -> None:
        while True:
            for unit in UNITS:
                for obs, kind in ((f"agent:{unit}", pb.AGENT), ("gateway:g1", pb.GATEWAY)):
                    report = pb.HealthReport(
                        region=unit, observer=obs, kind=kind, health=pb.HEALTHY
                    )
                    await stub.ReportHealth(report)
            await asyncio.sleep(0.2)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_status_groups_pools_and_failover_takes_a_model(topology: Topology) -> None:
    async with (
        running_replica(topology, http_listen="127.0.0.1:0") as run,
        reporting(run.stub),
        http_client(run.replica) as http,
    ):
        for _ in range(100):
            st = await run.stub.GetStatus(pb.GetStatusRequest())
            if st.responder_is_leader and all(r.health == pb.HEALTHY for r in st.regions):
                break
            await asyncio.sleep(0.1)
        t = run.target
        code, out, _ = await ctl(t, "status", "--json")
        assert code == 0
        pools = [
            (r["name"], r["pool_of"], r["pool"], r["models"]) for r in json.loads(out)["regions"]
        ]
        assert pools == [
            (f"{r}.{p}", r, p, [m]) for r in ("east", "west") for p, m in MODELS.items()
        ]
        status, body = await get_json(http, "/v1/status")  # the HTTP API says the same
        assert status == 200
        assert [(r["name"], r["pool_of"], r["pool"], r["models"]) for r in body["regions"]] == pools
        code, out, _ = await ctl(t, "status")
        lines = out.splitlines()
        cells = [line.strip("│ ").split(" ", 1)[0] for line in lines]
        east = cells.index("east")  # the region's row, its pools under it
        assert "east.chat (llama-3)" in lines[east + 1] and "east.code" in lines[east + 2]

        code, out, err = await ctl(
            t, "failover", "east", "--model", "mistral", "--reason", "x", "--yes"
        )
        assert code == 2 and "no pool of east answers model 'mistral'" in err
        code, out, _ = await ctl(t, "failover", "east", "--reason", "plan", "--dry-run", "--json")
        plans = json.loads(out)
        assert [set(p["plan"]["targets"]) for p in plans] == [{"west.chat"}, {"west.code"}]

        code, out, err = await ctl(
            t, "failover", "east", "--model", "qwen-coder", "--reason", "bad rollout", "--yes"
        )
        assert code == 0, err
        assert "traffic now goes to west.code 100%" in err
        st = await run.stub.GetStatus(pb.GetStatusRequest())
        assert region(st, "east.code").state == pb.FAILING_OVER
        assert region(st, "east.chat").state == pb.NORMAL
