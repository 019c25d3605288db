"""The scaler's records where people look, end to end: a real control-plane replica on
a real etcd sizes every pool from its agents' reports (cp_harness.reporting: 10 rps
each, typed capacity), and GetScale, the installed ``failoverctl scale show`` (table
and --json) and the audit log say what it wants and why."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import grpc
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.procs import until as poll
from controlplane.kernel.config import Topology
from controlplane.kernel.pool.scale import ScaleRecord, ScalingPolicy
from tests.integration.cp_harness import fast_topology, reporting, running_replica
from tests.integration.http_api_helpers import CHROMIUM, chromium_page
from tests.integration.test_failoverctl import ctl

pytestmark = pytest.mark.etcd
UNITS = ["east", "west", "central", "eu"]


def topology(etcd: object, scaling: ScalingPolicy | None) -> Topology:
    topo = fast_topology(etcd.endpoints, f"s{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]
    return topo.model_copy(update={"scaling": scaling})


async def test_get_scale_and_failoverctl_scale_show(etcd: object) -> None:
    async with (
        running_replica(topology(etcd, ScalingPolicy(min_active=2))) as run,
        reporting(run.stub, {}),
    ):

        async def sized() -> bool:  # on the agents' reports (the first may be dark)
            resp = await run.stub.GetScale(pb.ScaleRequest())
            return all(
                p.record_json and ScaleRecord.model_validate_json(p.record_json).load_rps
                for p in resp.pools
            )

        await poll(sized, within=20, what="every pool sized by the leader")
        resp = await run.stub.GetScale(pb.ScaleRequest())
        assert resp.scaling and [p.unit for p in resp.pools] == UNITS
        east = ScaleRecord.model_validate_json(resp.pools[0].record_json)
        # 10 rps against typed capacity 100: one replica would do; min_active says 2
        assert east.active == 2 and east.load_rps == 10.0
        assert east.capacity.startswith("typed capacity_rps 100")
        one = await run.stub.GetScale(pb.ScaleRequest(unit="west"))
        assert [p.unit for p in one.pools] == ["west"]
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await run.stub.GetScale(pb.ScaleRequest(unit="mars"))
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT

        st = await run.stub.GetStatus(pb.GetStatusRequest())
        [east_status] = [r for r in st.regions if r.name == "east"]
        assert east_status.scale.active == 2 and "forecast" in east_status.scale.reason
        code, out, _ = await ctl(run.target, "status")
        assert code == 0 and "scale" in out

        code, out, _ = await ctl(run.target, "scale", "show")
        assert code == 0, out
        for unit in UNITS:
            assert unit in out
        assert "wants ACTIVE" in out and "typed capacity_rps 100" in out
        code, out, _ = await ctl(run.target, "scale", "show", "east", "--json")
        assert code == 0
        [entry] = json.loads(out)
        assert entry["unit"] == "east" and entry["record"]["active"] == 2
        code, _, err = await ctl(run.target, "scale", "show", "mars")
        assert code != 0 and "unknown" in err

        history = await run.stub.GetHistory(pb.HistoryRequest(region="east"))
        scaled = [e.reason for e in history.events if e.action == "scale"]
        # a size is audited when it changes: the first record may be the only entry, and
        # it may say the signal was dark (no report yet); the sized record's reasons are
        # the status's, checked above
        assert scaled and all(("forecast" in r) or ("signal dark" in r) for r in scaled), scaled


async def test_the_forecast_error_is_recorded_and_shown(etcd: object) -> None:
    # a 1 s horizon, checkpointed often: forecasts come due within the test's seconds
    policy = ScalingPolicy(horizon_s=1.0, activation_s=0.5, checkpoint_s=0.5)
    async with running_replica(topology(etcd, policy)) as run, reporting(run.stub, {}):

        async def scored() -> bool:
            resp = await run.stub.GetScale(pb.ScaleRequest(unit="east"))
            [p] = resp.pools
            return bool(p.record_json) and (
                ScaleRecord.model_validate_json(p.record_json).forecast_error_samples >= 5
            )

        await poll(scored, within=20, what="east's forecasts scored a horizon later")
        [p] = (await run.stub.GetScale(pb.ScaleRequest(unit="east"))).pools
        east = ScaleRecord.model_validate_json(p.record_json)
        # the agents report a flat 10 rps: the forecasts hit it
        assert east.forecast_error is not None and east.forecast_error < 0.25
        assert 0 < len(east.forecast_due) <= 8
        code, out, _ = await ctl(run.target, "scale", "show", "east")
        assert code == 0 and "forecast error" in out and "(n=" in out, out
        code, out, _ = await ctl(run.target, "doctor", "--json", "--region", "east")
        [q4] = [c for c in json.loads(out)["checks"] if c["id"] == 4]
        # the error passes; the 1 s horizon is off the 30 s asked, so the line fails
        assert q4["verdict"] == "FAIL" and "horizon 1 s" in q4["evidence"], q4
        assert "east: forecast error" in q4["evidence"] and "<= 25%" in q4["evidence"], q4


async def test_scale_show_says_when_scaling_is_off(etcd: object) -> None:
    async with running_replica(topology(etcd, None)) as run:
        code, out, err = await ctl(run.target, "scale", "show")
        assert code == 0
        assert "scaling is off" in err
        st = await run.stub.GetStatus(pb.GetStatusRequest())
        assert not any(r.HasField("scale") for r in st.regions)
        assert "no record yet" in out


async def test_the_dashboard_shows_what_the_scaler_wants(etcd: object, tmp_path: Path) -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):  # CI installs it (scripts/setup.sh): never skip there
            pytest.fail("chromium is missing: scripts/setup.sh installs it")
        pytest.skip("no chromium: scripts/setup.sh installs it")
    topo = topology(etcd, ScalingPolicy(min_active=2, burst_warm=1))
    async with (
        running_replica(topo, http_listen="127.0.0.1:0") as run,
        reporting(run.stub, {}),
    ):
        url = f"http://127.0.0.1:{run.replica.http_port}/"
        async with chromium_page(url, str(tmp_path / "profile")) as page:
            query = "document.querySelector('tr[data-region=east] [data-col=scale]')"

            async def shown() -> bool:
                text = await page.js(f"{query}?.textContent ?? ''")
                return str(text) == "scaler: 2 ACTIVE + 1 WARM"

            await poll(shown, within=20, what="east's scale on the dashboard")
            title = str(await page.js(f"{query}.title"))
            assert "forecast" in title and "typed capacity_rps" in title
