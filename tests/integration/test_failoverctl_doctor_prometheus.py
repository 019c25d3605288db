"""``failoverctl doctor --prometheus URL`` against a real Prometheus (Debian's binary,
scraping every second) and a real control-plane replica on a real etcd.

Prometheus scrapes the replica's own ``/metrics`` (the leader's
``tectonic_budget_utilisation``, from a topology with a ``cost:`` section) and a region
agent's metrics (the agent's own :class:`AgentMetrics` behind its :class:`MetricsHttp`,
with a pool: the activation histogram starts at zero, as the agent's does) for a few
seconds, in which east's agent records four wakes of 0.2 s and one 50 s resume (IDLE ->
ACTIVE: not a cold start, so not in the p95); the bound is the leader's cold-start
budget (a third of the topology's first-token SLO). Doctor's question 2 then passes on
Prometheus's wake p95 and says it could see only seconds of the 90 days back, question 8
gives each budget's peak of the week with the same; with Prometheus unreachable (the URL from
``TECTONIC_PROMETHEUS_URL``) both lines are UNKNOWN and say why, and the rest answer.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest

from chaos.lab.procs import until
from controlplane.cli.doctor_prom import ACTIVATION_WAKES, ALLOWED, BUDGET, BUDGET_MAX
from controlplane.kernel.config import Topology
from regions.agent.metrics import AgentMetrics, MetricsHttp
from tests.integration import test_failoverctl_doctor
from tests.integration.cp_harness import reporting, running_replica
from tests.integration.test_failoverctl import ctl, healthy
from tests.integration.test_prometheus_lab import (
    Prom,
    prometheus_binary,
    prometheus_config,
    prometheus_process,
)

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(90)]
# the doctor test's topology (a cost section: east's budget, the fleet's): its fixture
topology = test_failoverctl_doctor.topology


def seen_s(evidence: str, unit: str) -> float:
    """How far back a finding of ``unit`` says Prometheus could see, in seconds."""
    m = re.search(
        rf"{re.escape(unit)}: [^;]*? in the (\d+)s Prometheus holds \(of \d+d asked\)", evidence
    )
    assert m, evidence
    return float(m.group(1))


async def test_doctor_reads_the_history_prometheus_holds(
    topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = prometheus_binary()
    agent = AgentMetrics("east", pool=True)
    exporter = MetricsHttp(agent)
    agent_port = await exporter.start("127.0.0.1:0")
    try:
        await asked(topology, agent, agent_port, monkeypatch, binary)
    finally:
        await exporter.stop()


async def asked(
    topology: Topology,
    agent: AgentMetrics,
    agent_port: int,
    monkeypatch: pytest.MonkeyPatch,
    binary: str,
) -> None:
    async with (
        running_replica(topology, http_listen="127.0.0.1:0") as run,
        reporting(run.stub, {}),
    ):
        await healthy(run)
        targets = {
            "agent": [f"127.0.0.1:{agent_port}"],
            "controlplane": [f"127.0.0.1:{run.replica.http_port}"],
        }
        with (
            tempfile.TemporaryDirectory() as tmp,
            prometheus_process(binary, Path(tmp), prometheus_config(targets)) as url,
        ):
            started = time.monotonic()  # nothing Prometheus holds is older than this
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
                prom = Prom(http, url)
                await until(prom.ready, within=20, every=0.2, what="prometheus ready")

                async def scraped(expr: str, least: float) -> bool:
                    return any(float(s["value"][1]) >= least for s in await prom.query(expr))

                # the zero histogram and the leader's budget gauge scraped, then wakes
                await until(lambda: scraped(ACTIVATION_WAKES, 0), within=20, what="histogram")
                await until(lambda: scraped(BUDGET_MAX, 0), within=20, what="budget gauge")
                for _ in range(4):
                    agent.activated("wake", True, 0.2)
                agent.activated("resume", True, 50.0)
                await until(lambda: scraped(ACTIVATION_WAKES, 3.5), within=20, what="4 wakes")

            code, out, err = await ctl(run.target, "doctor", "--json", "--prometheus", url)
            body = json.loads(out)
            by_id = {c["id"]: c for c in body["checks"]}
            assert [c["id"] for c in body["checks"]] == list(range(1, 11)), err
            q2, q8 = by_id[2], by_id[8]
            # east: the four 0.2 s wakes (the 50 s resume left out), under 1 s / 3; counted
            # by increase(), which extrapolates a few seconds of samples to their edges (4-6)
            assert re.search(
                r"east: wake p95 0\.\d\d s <= \d+\.\d\d s \(SLO [\d.]+ s / 3\) "
                r"over [4-6] wake\(s\)",
                q2["evidence"],
            ), q2
            # how far back it could see: at most since Prometheus started (1 s of rounding)
            held_s = time.monotonic() - started + 1
            assert 0 < seen_s(q2["evidence"], "east") <= held_s, q2
            assert f"from Prometheus at {url}" in q2["evidence"]
            # west has no agent scraped: not a pass
            assert "west: Prometheus holds no tectonic_agent_pool_activation" in q2["evidence"]
            assert q2["verdict"] == "UNKNOWN" and q2["todo"], q2
            # the week's peak of every budget, with how far back it could see
            assert q8["verdict"] == "PASS", q8
            for scope in ("east", "fleet"):
                assert 0 < seen_s(q8["evidence"], scope) <= held_s, q8
            assert re.search(
                r"east: at most \d+% of its budget in the \d+s Prometheus holds", q8["evidence"]
            )

            # Prometheus gone (its URL from the environment): those lines UNKNOWN, why
            monkeypatch.setenv("TECTONIC_PROMETHEUS_URL", url)
        code, out, err = await ctl(run.target, "doctor", "--json")
        body = json.loads(out)
        by_id = {c["id"]: c for c in body["checks"]}
        assert [c["id"] for c in body["checks"]] == list(range(1, 11)), err
        for q in (by_id[2], by_id[8]):
            assert q["verdict"] == "UNKNOWN", q
            assert f"Prometheus at {url} could not answer: unreachable" in q["evidence"], q
        assert "east: $" in by_id[8]["evidence"]  # the utilisation now still answers
        assert by_id[9]["verdict"] == "FAIL" and code == 1


async def test_a_weeks_peak_under_a_lift_passes_and_one_after_it_fails(
    topology: Topology,
) -> None:
    """east's budget $4/h against the $8/h of its two replicas, lifted for a few seconds
    while Prometheus scrapes the leader: question 8 passes and says the peak was
    allowed. Once the lift has ended (the leader ends it) and Prometheus has scraped
    east over its budget without it, the week's check fails and says how far."""
    binary = prometheus_binary()
    assert topology.cost is not None
    cost = topology.cost.model_copy(update={"pool_budgets": {"east": 4.0}})
    # two replicas listed for east (no pool publishes its own): $8/h at $4 each
    two = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    regions = [
        r.model_copy(update={"replicas": two}) if r.name == "east" else r for r in topology.regions
    ]
    over = topology.model_copy(update={"cost": cost, "regions": regions})
    east = '{scope="pool",name="east"}'
    async with (
        running_replica(over, http_listen="127.0.0.1:0") as run,
        reporting(run.stub, {}),
    ):
        await healthy(run)
        code, _, err = await ctl(run.target, "cost", "lift", "east", "-r", "INC-1", "--for", "15s")
        assert code == 0, err
        targets = {"controlplane": [f"127.0.0.1:{run.replica.http_port}"]}
        with (
            tempfile.TemporaryDirectory() as tmp,
            prometheus_process(binary, Path(tmp), prometheus_config(targets)) as url,
        ):
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
                prom = Prom(http, url)
                await until(prom.ready, within=20, every=0.2, what="prometheus ready")

                async def scraped(expr: str) -> bool:
                    return bool(await prom.query(expr))

                await until(
                    lambda: scraped(f"{ALLOWED}{east} == 1 and on () {BUDGET}{east} > 1"),
                    within=20,
                    what="east over its budget under the lift, scraped",
                )
                allowed = "over budget only under a lift or a failover's allowance"
                q8 = await question_8(run.target, url, allowed)
                assert q8["verdict"] == "PASS", q8["evidence"]
                assert "east: at most 200% of its budget in the " in q8["evidence"], q8["evidence"]
                await until(
                    lambda: scraped(f"{ALLOWED}{east} == 0 and on () {BUDGET}{east} > 1"),
                    within=30,
                    what="the lift ended, east over its budget without it, scraped",
                )
                q8 = await question_8(run.target, url, "200% with no lift or failover's allowance")
                assert q8["verdict"] == "FAIL", q8["evidence"]
                assert "east: at most 200% of its budget" in q8["evidence"], q8["evidence"]


async def question_8(target: str, url: str, says: str) -> dict[str, str]:
    """Question 8 once its evidence ``says`` (Prometheus answers from what it has
    ingested by then); failing that within the window, the last answer."""
    last: dict[str, str] = {}

    async def answered() -> bool:
        _, out, err = await ctl(target, "doctor", "--json", "--prometheus", url)
        by_id = {c["id"]: c for c in json.loads(out)["checks"]}
        assert 8 in by_id, err
        last.update(by_id[8])
        return says in last["evidence"]

    try:
        await until(answered, within=20, every=0.5, what=f"question 8 to say {says!r}")
    except AssertionError as e:
        raise AssertionError(f"{e}; its last answer: {last}") from None
    return last
