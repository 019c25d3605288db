"""``failoverctl doctor`` on a lab (issue 32): the real command against a real
control-plane replica (leader, scaler and cost guardrail on, the checkout's degradation
ladder), a real etcd, and two region agents (east, west) each running a warm pool of
three simulator processes (2 ACTIVE + 1 WARM) under real traffic.

First the lab is stale in exactly three ways, and doctor fails exactly questions 1, 5
and 7, exit 1: east's only WARM replica is lent out of rotation (a real loan, as the
capacity probe borrows one), so east's standby is under the sizing formula; west's
capacity record is 20 days old (the freshness rule is 14); west's last drills ended 8
and 9 days ago. Then the on-call fixes them the way the runbooks say (the loan ends,
west is probed and drilled again) and every one of the ten lines passes, each with its
evidence, exit 0, as text and as JSON. (This order, not healthy first: a lab whose
region drilled today cannot have its last drill 8 days old without deleting history.)

Run live: the simulators, the agents' wakes (their p95, with how far back it sees, and
the activation rate of the two wakes each pool does at start), the agents' reports (the
traffic's load, the engine version from each replica's /version), the scaler's
forecasts of that load and the scoring of each a horizon later (horizon 26 s: five
forecasts are scored about 45 s in; the traffic starts before the control plane, so
that the first forecast is of it), the leader's cold-start check, the cost report, the
loan, the deployed ladder's digest, and the doctor command itself (from this checkout:
its CI and alert rules). At 2 rps each region bears its load even fully cold, so
question 3 passes on that, not on the hit-rate alert (tests/unit/test_doctor.py checks
that path).

Seeded, because they cannot happen inside a test: the drills (a failover drill runs for
minutes with gateways, traffic and faults; and one 8 days old) and the capacity probes
(a probe step-loads a replica for about a minute; and one 20 days old). Each is recorded
through the drill service's own path, ``DrillService.run_once`` (the lock, the history
row, the audit entry and, for a probe, ``capacity/<region>`` with its audit entry from
``capacity_writes``) with the drill's readiness from ``record_readiness``, as the
verdict writes it; only what the run would have measured is chosen here: each drill's
end time and its criteria (all passed: a region-blackout's pre-warm and consistency, a
latency-injection's ladder order and consistency), each probe's time and figures (5 rps
per replica cold, beta 0.2, factor of safety 2), its engine and serving configuration
read from the live replica by the probe's own ``read_replica``. Everything doctor reads
comes through the control plane's RPCs from etcd."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.capacity.load import LoadGenerator, Planned
from chaos.capacity.replica_info import read_replica
from chaos.capacity.service import capacity_writes
from chaos.drills.result import Criterion, DrillResult
from chaos.drills.schedule import parse_schedule
from chaos.drills.service import DrillService, ProbeOutcome
from chaos.drills.verdict import record_readiness
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.ports import reserved_port
from chaos.lab.procs import until
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import CapacityRecord, HitProbe, WorkloadProfile
from controlplane.kernel.capacity.serving import ServingConfig
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.drills import CAPACITY_PROBE
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.file import load_ladder
from controlplane.kernel.pool.loans import borrow
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import Store
from controlplane.kernel.vllm.signals import LOAD_RAW_SIGNAL
from regions.agent.pool_config import AgentPoolConfig
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from tests.integration.cp_harness import FAST_TIMING, Running, running_replica
from tests.integration.test_failoverctl import ctl

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
REGIONS = ("east", "west")
DAY = 86400.0
SLO_S = 3.0  # first-token p99: a wake's budget is 1 s
# One replica bears 5 rps cold (R_base 10 / FOS 2): 2 ACTIVE bear 10, and the 15 rps
# each pool plans for needs 1 WARM, which each pool has.
STANDBY_RPS = 15.0
TRAFFIC_RPS = 2.0  # per region, to its ACTIVE replicas
LAB_S = 120.0  # the traffic's plan: longer than the test
# What a blackout drill and a latency drill judge (chaos/scenarios/*.yaml): together
# the three criteria question 5 asks for.
BLACKOUT = (
    "steady_state_before",
    "state_path",
    "prewarm_attainment",
    "session_consistency",
    "rto",
    "steady_state_after",
)
LATENCY = ("steady_state_before", "degradation_order", "session_consistency")
DRILLS = {"region-blackout": BLACKOUT, "latency-injection": LATENCY}


def lab_topology(etcd: EtcdServer, cluster: str) -> Topology:
    return parse_topology(
        {
            "cluster": cluster,
            "etcd": {"endpoints": list(etcd.endpoints)},
            "regions": [
                {
                    "name": r,
                    "zone": "us",
                    "agent": "127.0.0.1:9",
                    "capacity_rps": 10,  # typed: what a stale probe falls back to
                    "slo": {"ttft_p99_s": SLO_S},
                    "factor_of_safety": 2.0,
                }
                for r in REGIONS
            ],
            # agent reports every 0.5 s; fresh for 5 s on a loaded machine
            "timing": FAST_TIMING | {"report_stale_s": 5.0, "loop_period_s": 0.5},
            "scaling": {
                "horizon_s": 26,  # within doctor's 30 s +- 5: forecasts scored sooner
                "min_active": 2,
                "burst_warm": 0,
                "standby_rps": STANDBY_RPS,
                "checkpoint_s": 2,  # the scored forecasts reach scale/<unit> soon
            },
            "cost": {
                "prices": {"active": 4.0, "warm": 1.0},
                "pool_budgets": {r: 40.0 for r in REGIONS},
                "fleet_budget": 200.0,
            },
        }
    )


def pool_config() -> AgentPoolConfig:
    return AgentPoolConfig.model_validate(
        {
            "launcher": {"kind": "simulator"},
            "active": 2,  # woken together at start: a batch, the activation rate
            "warm": 1,
            "size": 3,  # no spare slot: a WARM replica lent is not replaced
            "reconcile_interval_s": 0.3,
            "dwell": {"active_min_s": 0, "idle_min_s": 3600, "warm_min_s": 3600},
        }
    )


@contextlib.asynccontextmanager
async def agents(topology: Topology, target: str) -> AsyncIterator[dict[str, AgentHandle]]:
    handles: dict[str, AgentHandle] = {}
    try:
        for r in REGIONS:
            handles[r] = await serve_agent(
                AgentConfig(
                    region=r,
                    pool=pool_config(),
                    control_planes=(target,),
                    etcd=topology.etcd.endpoints,
                    cluster=topology.cluster,
                    interval=0.5,
                )
            )
        yield handles
    finally:
        await asyncio.gather(*(h.stop(grace=0) for h in handles.values()))


def active_urls(handle: AgentHandle) -> list[str]:
    assert handle.pool is not None
    return handle.pool.active()


def traffic_plan(urls: Sequence[str]) -> list[Planned]:
    """TRAFFIC_RPS per region, spread over its ACTIVE replicas, for LAB_S."""
    body = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Is the platform ready for a spike?"}],
            "max_tokens": 8,
            "stream": True,
        }
    ).encode()
    step = 1.0 / TRAFFIC_RPS
    return [
        Planned(at_s=i * step, url=urls[i % len(urls)], body=body, prompt_tokens=16)
        for i in range(int(LAB_S * TRAFFIC_RPS))
    ]


# ---- what the drills and probes would have measured, recorded the system's way --------
def stamp(at: float) -> str:
    return f"{datetime.fromtimestamp(at, UTC):%Y%m%dT%H%M%SZ}"


def drill_result(region: str, scenario: str, ended_at: float) -> DrillResult:
    criteria = tuple(
        Criterion(name=c, passed=True, measured="as required", required="(the scenario's)")
        for c in DRILLS[scenario]
    )
    return DrillResult(
        id=f"{stamp(ended_at)}-{scenario}",
        scenario=scenario,
        title=scenario,
        region=region,
        started_at=ended_at - 180,
        ended_at=ended_at,
        passed=True,
        criteria=criteria,
    )


def probe_record(
    region: str, url: str, engine: str, serving: ServingConfig, at: float
) -> CapacityRecord:
    cold = HitProbe(hit_rate=0.0, baseline_p99_s=0.2, ultimate_rps=10.0, ultimate_bounded=True)
    warm = HitProbe(hit_rate=0.5, baseline_p99_s=0.1, ultimate_rps=11.1, ultimate_bounded=True)
    return CapacityRecord.model_validate(
        {
            "region": region,
            "measured_at": at,
            "engine_version": engine,
            "model": "tiny",
            "replica": url,
            "slo": CapacitySLO(ttft_p99_s=SLO_S),
            "factor_of_safety": 2.0,
            "probes": (cold, warm),
            "r_base_rps": 10.0,
            "beta": 0.2,
            "profile": WorkloadProfile(
                prompt_tokens_p50=16, prompt_tokens_p90=16, output_tokens=8, shared_prefix_share=0
            ),
            "serving": serving,
            "prober": "drills-lab",
        }
    )


@dataclass
class Recorder:
    """The drill service (chaos/drills/service.py) recording runs whose results are
    given rather than run: ``run_once`` takes the lock and commits the history row, the
    audit entry and a probe's writes, as after a real run."""

    store: Store
    keys: Keys
    pending: list[DrillResult | ProbeOutcome] = field(default_factory=list)

    def service(self) -> DrillService:
        return DrillService(
            self.store,
            self.keys,
            parse_schedule({"entries": []}),
            self._drill,
            SystemClock(),
            holder="drills-lab",
            probe=self._probe,
        )

    async def _drill(self, name: str, region: str | None, *, dry_run: bool = False) -> DrillResult:
        result = self.pending.pop()
        assert isinstance(result, DrillResult) and result.scenario == name
        await record_readiness(self.store, self.keys, result, (result.region,))  # the verdict's
        return result

    async def _probe(
        self, region: str, replica: str | None, *, dry_run: bool = False
    ) -> ProbeOutcome:
        outcome = self.pending.pop()
        assert isinstance(outcome, ProbeOutcome) and outcome.result.region == region
        return outcome

    async def drills(self, region: str, *ended_at: float) -> None:
        """A blackout drill, then a latency drill, ending at these times (in order)."""
        for scenario, at in zip(DRILLS, ended_at, strict=True):
            self.pending.append(drill_result(region, scenario, at))
            await self.service().run_once(scenario, region)

    async def probe(self, region: str, url: str, at: float) -> None:
        async with aiohttp.ClientSession() as http:
            info = await read_replica(http, url)  # the probe's own read of its replica
        record = probe_record(region, url, info.engine_version, info.serving, at)
        run_id = f"{stamp(at)}-{CAPACITY_PROBE}-{region}"
        result = DrillResult(
            id=run_id,
            scenario=CAPACITY_PROBE,
            title=CAPACITY_PROBE,
            region=region,
            started_at=at - 60,
            ended_at=at + 5,  # the run ends after its last measurement
            passed=True,
        )
        writes = capacity_writes(self.keys, "drills-lab", record, run_id, [url], at=at)
        self.pending.append(ProbeOutcome(result=result, writes=writes))
        await self.service().run_once(CAPACITY_PROBE, region, replica=url)


# ---- waiting for the live system -----------------------------------------------------
def cold_starts(scale: pb.ScaleResponse) -> dict[str, dict[str, Any]]:
    return {p.unit: json.loads(p.cold_start_json) for p in scale.pools if p.cold_start_json}


def records(scale: pb.ScaleResponse) -> dict[str, dict[str, Any]]:
    return {p.unit: json.loads(p.record_json) for p in scale.pools if p.record_json}


async def settled(
    stub: pb_grpc.ControlPlaneStub,
    what: str,
    ok: Callable[[str, dict[str, Any], dict[str, Any]], bool],
) -> None:
    """Until every pool's scale record and the leader's cold-start check of it say
    ``ok``: the scaler has scored five forecasts (doctor's minimum) and the pool's
    measured inputs reached the leader."""

    async def there() -> bool:
        scale = await stub.GetScale(pb.ScaleRequest())
        recs, colds = records(scale), cold_starts(scale)
        return all(
            r in recs
            and r in colds
            and int(recs[r].get("forecast_error_samples", 0)) >= 5
            and ok(r, recs[r], colds[r])
            for r in REGIONS
        )

    await until(there, within=90, every=0.5, what=what)


def measured(cold: dict[str, Any]) -> bool:
    return all(cold["measured"].get(k) for k in ("activation_s", "activation_rate", "replica_rps"))


async def doctor_json(target: str) -> tuple[int, dict[int, dict[str, str]]]:
    code, out, err = await ctl(target, "doctor", "--json")
    assert code in (0, 1), err
    body = json.loads(out)
    assert body["exit_code"] == code
    return code, {c["id"]: c for c in body["checks"]}


@dataclass
class Lab:
    run: Running
    handles: dict[str, AgentHandle]
    store: Store
    keys: Keys

    def urls(self, region: str) -> list[str]:
        return active_urls(self.handles[region])

    @property
    def recorder(self) -> Recorder:
        return Recorder(self.store, self.keys)


@contextlib.asynccontextmanager
async def traffic(handles: dict[str, AgentHandle]) -> AsyncIterator[None]:
    """Each pool's 2 ACTIVE replicas served TRAFFIC_RPS, until the block ends; entered
    once each agent's probe round has counted it (its raw load)."""

    async def all_active() -> bool:
        return all(len(active_urls(h)) == 2 for h in handles.values())

    await until(all_active, within=60, every=0.2, what="2 ACTIVE in each pool")
    async with LoadGenerator(request_timeout_s=10.0) as load:
        sending = [
            asyncio.create_task(load.run(traffic_plan(active_urls(h)))) for h in handles.values()
        ]

        async def counted() -> bool:
            return all(h.view.signals.get(LOAD_RAW_SIGNAL, 0.0) > 0 for h in handles.values())

        try:
            await until(counted, within=30, every=0.2, what="each agent counting the traffic")
            yield
        finally:
            for t in sending:
                t.cancel()
            await asyncio.gather(*sending, return_exceptions=True)


@contextlib.asynccontextmanager
async def lab(etcd: EtcdServer, cluster: str) -> AsyncIterator[Lab]:
    """The agents and their traffic first, the control plane after (on a port chosen
    beforehand, which the agents report to): its scaler's first forecast is of the
    steady traffic, not of the step from nothing to it."""
    topology = lab_topology(etcd, cluster)
    target = f"127.0.0.1:{reserved_port(set())}"
    store = EtcdStore(topology.etcd)
    await store.connect()
    try:
        async with (
            agents(topology, target) as handles,
            traffic(handles),
            running_replica(topology, ladder=load_ladder(), listen=target) as run,
        ):
            yield Lab(run, handles, store, Keys(cluster))
    finally:
        await store.close()


async def seed_week(lab: Lab, now: float) -> None:
    """East probed an hour ago, drilled 3 and 2 days ago; west probed 20 days ago (over
    capacity.max_age_s: stale), drilled 9 and 8 days ago (none in the week). In the
    order they happened: a region's readiness is its last drill's verdict."""
    rec = lab.recorder
    await rec.probe("east", lab.urls("east")[0], now - 3600)
    await rec.probe("west", lab.urls("west")[0], now - 20 * DAY)
    await rec.drills("east", now - 3 * DAY, now - 2 * DAY)
    await rec.drills("west", now - 9 * DAY, now - 8 * DAY)


async def heal(lab: Lab, now: float) -> None:
    """What the on-call does for questions 5 and 7 (runbooks/capacity-stale.md,
    region-barred.md): probe west, then drill it (a blackout and a latency drill)."""
    rec = lab.recorder
    await rec.probe("west", lab.urls("west")[0], now - 900)
    await rec.drills("west", now - 600, now)


def stale_seen(unit: str, rec: dict[str, Any], cold: dict[str, Any]) -> bool:
    """East's WARM replica lent (0 WARM now), its inputs measured; west's scaler on the
    typed capacity (its probe stale)."""
    if unit == "east":
        return cold["warm_now"] == 0 and measured(cold)
    return not cold["measured"]["replica_rps"]


def healthy_seen(unit: str, rec: dict[str, Any], cold: dict[str, Any]) -> bool:
    return measured(cold) and cold["warm_now"] >= cold["warm_needed"] >= 1


def check_stale(code: int, lines: dict[int, dict[str, str]]) -> None:
    failed = sorted(i for i, x in lines.items() if x["verdict"] != "PASS")
    assert (code, failed) == (1, [1, 5, 7]), json.dumps(lines, indent=1)
    assert all(lines[i]["verdict"] == "FAIL" and lines[i]["todo"] for i in failed)
    assert "east: 0 WARM now, 1 needed" in lines[1]["evidence"], lines[1]
    assert "west: no failover drill in the last 7 days" in lines[5]["evidence"], lines[5]
    assert "east: drill" in lines[5]["evidence"]  # east's week is fine
    assert "west: stale: measured 20.0 days ago" in lines[7]["evidence"], lines[7]


def check_healthy(code: int, lines: dict[int, dict[str, str]]) -> None:
    assert code == 0 and sorted(lines) == list(range(1, 11)), json.dumps(lines, indent=1)
    assert all(x["verdict"] == "PASS" and x["evidence"] and not x["todo"] for x in lines.values())
    said = {i: x["evidence"] for i, x in lines.items()}
    for r in REGIONS:
        assert f"{r}: 1 WARM now, 1 needed" in said[1]
        assert f"{r}: wake p95" in said[2] and "the oldest" in said[2]
        assert f"{r}: bears its" in said[3] or f"{r}: below hit rate" in said[3]
        assert f"{r}: horizon 26 s" in said[4] and f"{r}: forecast error" in said[4]
        assert f"{r}: drill" in said[5]
        assert f"{r}: measured" in said[7]
        assert f"{r}: $" in said[8]
        assert f"{r}: passed drill" in said[9]
        assert f"{r}: every up replica runs" in said[10]
    assert said[1].count("(all three inputs measured)") == 2
    assert said[5].count("recorded and passed: prewarm_attainment") == 2
    assert "runs in CI" in said[6]
    assert "runs the checkout's runbooks/degradation.yaml" in said[6]
    assert said[7].count("the one it runs") == 2


async def test_doctor_fails_exactly_the_stale_lines_then_passes_every_line(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async with lab(etcd, cluster_name) as the:
        await seed_week(the, time.time())
        async with borrow(the.store, the.keys, "east", borrower="capacity-probe@lab") as lent:
            assert lent not in the.urls("east")  # its WARM one: east has none left
            await settled(the.run.stub, "the loan and the stale probe seen", stale_seen)
            check_stale(*await doctor_json(the.run.target))
        # the loan has ended (the block left): east's replica is WARM again
        await heal(the, time.time())
        await settled(the.run.stub, "both pools measured and standing by", healthy_seen)
        check_healthy(*await doctor_json(the.run.target))
        code, out, err = await ctl(the.run.target, "doctor")
        shown = [x for x in out.splitlines() if x.split(" ", 1)[0] in {"PASS", "FAIL", "UNKNOWN"}]
        assert code == 0 and len(shown) == 10, out + err
        assert all(x.startswith("PASS") for x in shown), out
        print(out)  # the healthy lab's answers, for the log
