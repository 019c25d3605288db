"""``failoverctl capacity probe`` end to end: the installed CLI, a real control-plane
replica, a real drill service running the real ``CapacityProber``, and a region agent
whose warm pool (one ACTIVE, two WARM simulators) lends its WARM ones out of rotation.

A named replica in rotation is refused before anything is written. Then the probe
borrows both WARM replicas (two loans on one lease), step-loads one, then both at once
for the scaling efficiency, and the service commits ``capacity/<region>`` with its
audit entry and history row; the HTML report is written; both replicas are asleep and
WARM again; the status reads the measured capacity. Both go back also when the probe
aborts.

No figure of the probe is judged here, and its lowest steps (the only latencies that
could stop it: a probe aborts where its lowest step misses the SLA) answer in a seventh
of the SLO, so scripts/test.sh runs this module beside the benches' smoke tests
(OUTCOMES_ONLY there): add nothing that times or judges a latency."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from chaos.capacity.service import CapacityProber
from chaos.drills.requests import scenario_infos
from chaos.drills.scenario import load_all
from chaos.drills.schedule import parse_schedule
from chaos.drills.service import DrillService, history
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import until
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import CapacityRecord
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.codec import decode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.drills import CAPACITY_PROBE
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditEntry
from controlplane.kernel.pool.loans import read_members
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import EventType
from regions.agent.pool_config import AgentPoolConfig
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from regions.pool.states import ReplicaState
from tests.integration.cp_harness import fast_topology, running_replica
from tests.integration.test_failoverctl import ctl

pytestmark = [pytest.mark.etcd, pytest.mark.slow, pytest.mark.timeout(300)]
REGION = "east"
# 4 slots; the default workload's ~600-token prompts and 128 output tokens at 400/s:
# about 0.35 s a request, ~11 requests/s saturate a replica.
SIM_ARGS = ("--max-num-seqs", "4", "--decode-tokens-per-s", "400", "--log-level", "WARNING")
TUNE = {
    "step_s": 0.8,
    "start_rps": 4.0,
    "precision": 0.25,
    "max_steps": 8,
    "request_timeout_s": 10.0,
    "drain_timeout_s": 20.0,
    "recover_s": 2.0,
    "recover_window_s": 0.5,
    "seed": 3,
    # sustained steps short enough for a test (the figures are not what it checks)
    "min_requests": 24,
    "max_warmup_s": 2.0,
    "max_measure_s": 3.0,
    "max_sustained": 2,
    "min_screen_requests": 8,
}


@pytest.fixture
def topology(etcd: EtcdServer) -> Topology:
    data = fast_topology(etcd.endpoints, f"c{uuid.uuid4().hex[:8]}").model_dump(mode="json")
    data["regions"] = [
        {**r, "replicas": [], "slo": {"ttft_p99_s": 0.8}, "factor_of_safety": 2.0}
        if r["name"] == REGION
        else r
        for r in data["regions"]
    ]
    return parse_topology(data)


@pytest.fixture
async def agent_two_warm(topology: Topology) -> AsyncIterator[AgentHandle]:
    async with pool_agent(topology, warm=2) as handle:
        yield handle


@asynccontextmanager
async def pool_agent(topology: Topology, *, warm: int) -> AsyncIterator[AgentHandle]:
    """An agent whose pool is one ACTIVE simulator and ``warm`` WARM ones."""
    pool = AgentPoolConfig.model_validate(
        {
            "launcher": {"kind": "simulator", "extra_args": list(SIM_ARGS)},
            "active": 1,
            "warm": warm,
            "reconcile_interval_s": 0.5,
        }
    )
    config = AgentConfig(
        region=REGION,
        pool=pool,
        etcd=topology.etcd.endpoints,
        cluster=topology.cluster,
        interval=0.5,
    )
    handle = await serve_agent(config)
    keys = Keys(topology.cluster)
    store = EtcdStore(topology.etcd)
    await store.connect()
    try:

        async def all_warm() -> bool:
            m = await read_members(store, keys, REGION)
            return m is not None and len(m.active) == 1 and m.warm == warm

        await until(all_warm, within=30, every=0.1, what="the pool's ACTIVE and WARM replicas")
        yield handle
    finally:
        await store.close()
        await handle.stop(grace=0)


def replica_states(agent: AgentHandle) -> dict[str, ReplicaState]:
    assert agent.pool is not None
    return {r.url: r.state for r in agent.pool.pool.snapshot().replicas if r.url}


async def test_failoverctl_capacity_probe_measures_two_warm_replicas_and_gives_them_back(
    topology: Topology, agent_two_warm: AgentHandle, tmp_path: Path
) -> None:
    """Through the CLI and the drill service: a replica in rotation refused, then both
    WARM replicas borrowed at once (one alone, then the pair for the scaling
    efficiency), the record and its audit entry committed, both WARM again after."""
    agent = agent_two_warm
    keys = Keys(topology.cluster)
    store = EtcdStore(topology.etcd)
    await store.connect()
    prober = CapacityProber(
        store, keys, topology, holder="drills-test", reports=tmp_path, tune=TUNE
    )
    service = DrillService(
        store,
        keys,
        parse_schedule({"entries": []}),
        _no_drills,
        SystemClock(),
        holder="drills-test",
        tick_s=0.3,
        scenarios=scenario_infos(load_all()),
        probe=prober,
    )
    serving = asyncio.create_task(service.serve())
    try:
        async with running_replica(topology) as run:
            warm_before = {u for u, s in replica_states(agent).items() if s is ReplicaState.WARM}
            assert len(warm_before) == 2
            active = {u for u, s in replica_states(agent).items() if s is ReplicaState.ACTIVE}
            since = await _pool_revision(store, keys)
            code, out, err = await _ctl_when_published(
                run.target,
                "capacity",
                "probe",
                REGION,
                "--replica",
                next(iter(active)),
                "-r",
                "in rotation",
                "--json",
            )
            assert code == 1, err  # the service ran it and refused the ACTIVE replica
            refused = json.loads(out.splitlines()[-1])["run"]  # progress lines, then the result
            assert not refused["passed"] and "in rotation" in refused["aborted"]
            assert await store.get(keys.capacity(REGION)) is None  # nothing written

            code, out, err = await ctl(
                run.target,
                "capacity",
                "probe",
                REGION,
                "-r",
                "after the upgrade",
                "--json",
                timeout_s=180,  # a whole probe, cut short by TUNE: ~1 minute
            )
            assert code == 0, err
            shown = json.loads(out.splitlines()[-1])
            said = [json.loads(line)["detail"] for line in out.splitlines()[:-1]]
            assert any("rps offered" in d for d in said), said  # its steps as they ran
            assert await store.get(keys.drill_progress()) is None  # cleared at the end
            assert shown["run"]["scenario"] == CAPACITY_PROBE and shown["run"]["passed"]
            [entry] = shown["capacity"]
            assert entry["bearing"]["source"] == "measured"

            kv = await store.get(keys.capacity(REGION))
            assert kv is not None
            record = decode(CapacityRecord, kv.value, kv.key)
            assert record.replica in warm_before and record.region == REGION
            assert record.probes[0].hit_rate < record.probes[1].hit_rate  # cold, then warm
            assert record.r_base_rps > 0 and record.slo.ttft_p99_s == 0.8
            assert Path(shown["run"]["report_path"]).is_file()  # noqa: ASYNC240

            code, out, _ = await ctl(run.target, "history", "--json")
            actions = [e["action"] for e in json.loads(out)]
            assert "capacity_measured" in actions and actions.count("drill_run") == 2
            rows = await history(store, keys, None)
            assert [r.scenario for r in rows] == [CAPACITY_PROBE] * 2

            async def back_asleep() -> bool:
                m = await read_members(store, keys, REGION)
                states = replica_states(agent)
                return m is not None and not m.lent and states[record.replica] is ReplicaState.WARM

            # the pair: both WARM replicas lent at once, the efficiency measured on them
            assert record.scaling_measured and 0 < record.scaling_efficiency <= 1
            [entry] = [
                decode(AuditEntry, kv.value, kv.key)
                for kv in (await store.get_prefix(keys.audit_prefix())).kvs
                if decode(AuditEntry, kv.value, kv.key).action == "capacity_measured"
            ]
            assert {record.replica, entry.details["pair_replica"]} == warm_before
            assert entry.details["scaling_measured"] == "true"
            lent = await _lent_since(store, keys, since)
            assert max(len(m.lent) for m in lent) == 2 and lent[-1].lent == {}

            async def both_back() -> bool:
                return _both_warm(agent, warm_before)

            await until(back_asleep, within=30, every=0.2, what="the probed replica WARM again")
            await until(both_back, within=30, every=0.2, what="both probed replicas WARM again")
            code, out, _ = await ctl(run.target, "capacity", "show", REGION)
            assert code == 0 and "measured" in out and "probe at hit rate" in out
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await store.close()


async def test_a_probe_of_two_that_aborts_gives_both_back(
    topology: Topology, agent_two_warm: AgentHandle, tmp_path: Path
) -> None:
    keys = Keys(topology.cluster)
    store = EtcdStore(topology.etcd)
    await store.connect()
    try:
        warm = {u for u, s in replica_states(agent_two_warm).items() if s is ReplicaState.WARM}
        # an SLO no replica meets: the lowest cold step misses it, and the probe aborts
        tune = {**TUNE, "slo": CapacitySLO(ttft_p99_s=0.001)}
        prober = CapacityProber(
            store, keys, topology, holder="drills-test", reports=tmp_path, tune=tune
        )
        since = await _pool_revision(store, keys)
        outcome = await prober(REGION, None)
        assert not outcome.result.passed and "already misses the SLA" in outcome.result.aborted
        assert outcome.writes == () and await store.get(keys.capacity(REGION)) is None
        lent = await _lent_since(store, keys, since)
        assert max(len(m.lent) for m in lent) == 2  # both were borrowed
        assert lent[-1].lent == {}  # and both returned before the prober did
        assert _both_warm(agent_two_warm, warm)
    finally:
        await store.close()


def _both_warm(agent: AgentHandle, urls: set[str]) -> bool:
    states = replica_states(agent)
    return all(states[u] is ReplicaState.WARM for u in urls)


async def _pool_revision(store: EtcdStore, keys: Keys) -> int:
    kv = await store.get(keys.pool(REGION))
    assert kv is not None
    return kv.mod_revision


async def _lent_since(store: EtcdStore, keys: Keys, revision: int) -> list[PoolMembers]:
    """Every value of ``pools/<region>`` written after ``revision``, up to the current
    one, replayed from etcd's history (none missed, however brief)."""
    now = await _pool_revision(store, keys)
    seen: list[PoolMembers] = []
    if now == revision:
        return seen
    async for ev in store.watch_prefix(keys.pool(REGION), start_revision=revision + 1):
        if ev.type is EventType.PUT and ev.kv.key == keys.pool(REGION):
            seen.append(decode(PoolMembers, ev.kv.value, ev.kv.key))
        if ev.kv.mod_revision >= now:
            return seen
    raise AssertionError("the watch ended before the current revision")


async def _no_drills(name: str, region: str | None, *, dry_run: bool = False):  # type: ignore[no-untyped-def]
    raise AssertionError(f"no drill should run here, got {name}")


async def _ctl_when_published(target: str, *args: str) -> tuple[int, str, str]:
    """The first command waits for the drill service to publish its catalog."""
    for _ in range(50):
        code, out, err = await ctl(target, *args)
        if "no drill service has published" not in err:
            return code, out, err
        await asyncio.sleep(0.2)
    raise AssertionError("the drill service never published its catalog")
