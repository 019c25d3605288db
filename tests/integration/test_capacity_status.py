"""Live capacity utilisation (CBU) everywhere status is shown, end to end: a real replica
on a real etcd holding capacity probes as the probe writes them (``capacity/<region>``),
read over gRPC (GetStatus, GetCapacity), HTTP (/v1/status, /metrics), the installed
``failoverctl`` (status, capacity show) and the dashboard in a real browser.

The observers keep reporting ``load_rps`` 10 for every region (cp_harness.reporting)
and no hit rate, so each region is judged cold:

- east: probed an hour ago, 1 ACTIVE replica, R_base 12, factor of safety 2: it bears
  6 rps and serves 10, CBU 1.67 (past page_cbu);
- central: probed 30 days ago (max_age_s is 14 days): stale, its typed 50 rps used,
  CBU 0.2;
- west and eu: never probed: typed 100 rps, CBU 0.1.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import grpc
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.procs import until as poll
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import (
    CapacityRecord,
    HitProbe,
    ProbeStep,
    WorkloadProfile,
)
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from tests.integration.cp_harness import (
    Running,
    fast_topology,
    region,
    reporting,
    running_replica,
    until,
)
from tests.integration.http_api_helpers import (
    CHROMIUM,
    chromium_page,
    get_json,
    http_client,
    metric_samples,
    sample,
)
from tests.integration.test_failoverctl import ctl

pytestmark = pytest.mark.etcd
DAY = 86400.0
LOAD = 10.0  # what cp_harness.report says every region serves


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"k{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


def cold_probe() -> HitProbe:
    steps = (
        ProbeStep(offered_rps=2, p99_ttft_s=0.10, error_rate=0.0, throughput_rps=2),
        ProbeStep(offered_rps=4, p99_ttft_s=0.30, error_rate=0.0, throughput_rps=4),
        ProbeStep(offered_rps=12, p99_ttft_s=0.95, error_rate=0.003, throughput_rps=12),
        ProbeStep(offered_rps=14, p99_ttft_s=1.40, error_rate=0.004, throughput_rps=13),
        ProbeStep(offered_rps=16, p99_ttft_s=2.50, error_rate=0.08, throughput_rps=11),
    )
    return HitProbe(
        hit_rate=0.0,
        baseline_p99_s=0.1,
        knee_rps=3.0,
        ultimate_rps=12.0,
        ultimate_bounded=True,
        failure_rps=16.0,
        steps=steps,
    )


def record(region: str, measured_at: float) -> CapacityRecord:
    warm = HitProbe(hit_rate=0.6, baseline_p99_s=0.05, ultimate_rps=17.0, ultimate_bounded=False)
    return CapacityRecord(
        region=region,
        measured_at=measured_at,
        engine_version="0.11.0",
        replica=f"http://{region}-warm-0:8000",
        slo=CapacitySLO(ttft_p99_s=1.0),
        factor_of_safety=2.0,
        probes=(warm, cold_probe()),
        r_base_rps=12.0,
        beta=0.5,
        t_recover_s=7.5,
        profile=WorkloadProfile(
            prompt_tokens_p50=500, prompt_tokens_p90=2000, output_tokens=64, shared_prefix_share=0.5
        ),
        probe_s=240.0,
        prober="drills-1",
    )


async def with_probes(run: Running, now: float) -> tuple[CapacityRecord, CapacityRecord]:
    """east probed an hour ago, central 30 days ago; then wait until the loads are in."""
    keys = Keys(run.replica.topology.cluster)
    east, central = record("east", now - 3600), record("central", now - 30 * DAY)
    await run.replica.store.put(keys.capacity("east"), encode(east))
    await run.replica.store.put(keys.capacity("central"), encode(central))
    await until(
        lambda s: (
            s.responder_is_leader
            and all(r.capacity.load_rps == LOAD for r in s.regions)
            and all(r.health == pb.HEALTHY for r in s.regions)
        ),
        run.stub,
        {},
    )
    return east, central


async def test_grpc_status_and_get_capacity_carry_each_regions_bearing(topology: Topology) -> None:
    now = time.time()
    async with running_replica(topology) as run:
        east_rec, _ = await with_probes(run, now)
        st = await run.stub.GetStatus(pb.GetStatusRequest())
        east = region(st, "east").capacity
        assert east.source == "measured" and "1 ACTIVE replica" in east.reason
        assert east.allowed_rps == pytest.approx(6.0) and east.cbu == pytest.approx(LOAD / 6)
        assert (east.warn_cbu, east.page_cbu, east.hit_rate) == (0.8, 1.0, 0.0)
        assert east.measured_at == pytest.approx(now - 3600)
        assert (east.knee_rps, east.ultimate_rps, east.ultimate_bounded) == (3.0, 12.0, True)
        assert (east.r_base_rps, east.beta, east.factor_of_safety) == (12.0, 0.5, 2.0)
        assert east.t_recover_s == 7.5 and east.engine_version == "0.11.0"
        central = region(st, "central").capacity
        assert central.source == "stale" and "30.0 days ago" in central.reason
        assert central.allowed_rps == 50 and central.cbu == pytest.approx(0.2)
        assert central.HasField("measured_at")  # the stale probe is shown, not used
        west = region(st, "west").capacity
        assert west.source == "typed" and west.reason == "no capacity probe yet"
        assert west.allowed_rps == 100 and west.cbu == pytest.approx(0.1)
        assert not west.HasField("measured_at") and not west.HasField("knee_rps")

        one = await run.stub.GetCapacity(pb.CapacityRequest(region="east"))
        assert [r.region for r in one.regions] == ["east"] and one.generated_at >= now
        assert one.regions[0].bearing == east
        assert CapacityRecord.model_validate_json(one.regions[0].record_json) == east_rec
        every = await run.stub.GetCapacity(pb.CapacityRequest())
        assert [r.region for r in every.regions] == ["east", "west", "central", "eu"]
        assert every.regions[1].record_json == b"" and every.regions[2].record_json
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await run.stub.GetCapacity(pb.CapacityRequest(region="mars"))
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown region" in (e.value.details() or "")


async def test_http_status_and_metrics_carry_the_bearing(topology: Topology) -> None:
    now = time.time()
    async with (
        running_replica(topology, http_listen="127.0.0.1:0") as run,
        http_client(run.replica) as http,
        reporting(run.stub, {}),
    ):
        await with_probes(run, now)
        code, st = await get_json(http, "/v1/status")
        assert code == 200
        cap = {r["name"]: r["capacity"] for r in st["regions"]}
        assert cap["east"]["source"] == "measured"
        assert cap["east"]["cbu"] == pytest.approx(LOAD / 6)
        assert cap["east"]["allowed_rps"] == pytest.approx(6.0)
        assert cap["east"]["knee_rps"] == 3.0 and cap["east"]["t_recover_s"] == 7.5
        assert cap["east"]["measured_at"] == pytest.approx(now - 3600)
        assert cap["central"]["source"] == "stale" and cap["central"]["allowed_rps"] == 50
        assert cap["west"]["source"] == "typed" and cap["west"]["measured_at"] is None

        async def leader_exports() -> bool:
            got = await metric_samples(http)
            return sample(got, "tectonic_region_capacity_stale", region="central") == 1

        await poll(leader_exports, within=10, what="the leader's capacity gauges")
        m = await metric_samples(http)
        cbu = sample(m, "tectonic_region_capacity_utilization", region="east")
        assert cbu == pytest.approx(LOAD / 6)
        assert sample(m, "tectonic_region_allowed_rps", region="east") == pytest.approx(6.0)
        assert sample(m, "tectonic_region_allowed_rps", region="central") == 50
        assert sample(m, "tectonic_region_capacity_stale", region="east") == 0
        assert sample(m, "tectonic_region_capacity_stale", region="west") == 0
        age = sample(m, "tectonic_region_capacity_age_seconds", region="central")
        assert age == pytest.approx(30 * DAY, abs=60)
        assert sample(m, "tectonic_region_capacity_age_seconds", region="west") is None


async def test_failoverctl_status_and_capacity_show(topology: Topology) -> None:
    now = time.time()
    async with running_replica(topology) as run, reporting(run.stub, {}):
        await with_probes(run, now)
        code, out, _ = await ctl(run.target, "status")
        assert code == 0 and "cbu" in out
        rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│")}
        assert "1.67" in rows["east"] and "(stale)" not in rows["east"]
        assert "0.20 (stale)" in rows["central"] and "0.10 (typed)" in rows["west"]
        code, out, _ = await ctl(run.target, "status", "--json")
        regions = {r["name"]: r for r in json.loads(out)["regions"]}
        assert code == 0 and regions["east"]["capacity"]["source"] == "measured"
        assert regions["central"]["capacity"]["measured_at"] == pytest.approx(now - 30 * DAY)

        code, out, _ = await ctl(run.target, "capacity", "show", "east")
        assert code == 0
        assert "east: CBU 1.67 · allowed now 6.0 rps at hit rate 0.00 · serving 10.0 rps" in out
        assert "capacity: measured: probed 1.0 h ago" in out
        assert "R_base 12.0 rps (cold), beta 0.50, factor of safety 2, T_recover 7.5 s" in out
        assert "engine 0.11.0, replica http://east-warm-0:8000 by drills-1, took 240 s" in out
        # one table per probe, coldest first; each step judged against the record's SLA
        assert out.index("probe at hit rate 0.00") < out.index("probe at hit rate 0.60")
        assert "knee 3.0 rps, ultimate 12.0 rps, allowed 6.0 rps, failure 16.0 rps" in out
        assert "ultimate 17.0 rps (no step broke the SLA: a lower bound)" in out  # warm
        assert "no steps stored" in out
        step_rows = [line for line in out.splitlines() if line.startswith("│")]
        assert [r.split("│")[-2].strip() for r in step_rows] == [
            "within SLA",
            "within SLA",
            "within SLA",
            "over SLA",
            "failure",
        ]
        code, out, _ = await ctl(run.target, "capacity", "show")
        assert code == 0 and "no capacity probe yet: failovers plan on the typed" in out
        assert "central: CBU 0.20 (stale)" in out and "30.0 days ago" in out

        code, out, _ = await ctl(run.target, "capacity", "show", "--json")
        entries = {e["region"]: e for e in json.loads(out)}
        assert code == 0 and list(entries) == ["east", "west", "central", "eu"]
        assert entries["east"]["bearing"]["cbu"] == pytest.approx(LOAD / 6)
        assert entries["east"]["record"]["r_base_rps"] == 12.0
        assert len(entries["east"]["record"]["probes"][1]["steps"]) == 5
        assert entries["west"]["record"] is None and entries["west"]["bearing"]["source"] == "typed"

        code, _, err = await ctl(run.target, "capacity", "show", "mars")
        assert code == 2 and "unknown region" in err
        code, out, _ = await ctl(run.target, "capacity", "show", "--help")
        assert code == 0 and "Example" in out


async def test_dashboard_shows_each_regions_cbu(topology: Topology, tmp_path: Path) -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):  # CI installs it (scripts/setup.sh): never skip there
            pytest.fail("chromium is missing: scripts/setup.sh installs it")
        pytest.skip("no chromium: scripts/setup.sh installs it")
    async with (
        running_replica(topology, http_listen="127.0.0.1:0") as run,
        reporting(run.stub, {}),
    ):
        await with_probes(run, time.time())
        url = f"http://127.0.0.1:{run.replica.http_port}/"
        async with chromium_page(url, str(tmp_path / "profile")) as page:

            async def cell(name: str) -> str:
                q = f"document.querySelector('tr[data-region={name}] td[data-col=cbu]')"
                return str(await page.js(f"{q}?.textContent ?? ''"))

            async def shown() -> bool:
                return (await cell("east")).startswith("1.67")

            await poll(shown, within=20, what="east's CBU on the dashboard")
            assert "10.0 of 6.0 rps · measured" in await cell("east")
            assert "stale probe: typed capacity" in await cell("central")
            assert (await cell("west")).startswith("0.10")
            level = await page.js(
                "document.querySelector('tr[data-region=east] td[data-col=cbu] .bar span')"
                ".className"
            )
            assert level == "cbu-page"
            west_level = await page.js(
                "document.querySelector('tr[data-region=west] td[data-col=cbu] .bar span')"
                ".className"
            )
            assert west_level == "cbu-ok"
            state = "document.querySelector('tr[data-region=east] td:nth-child(2)').textContent"
            assert await page.js(state) == "NORMAL"  # the columns before it kept their place
