"""The shipped alert rules and Grafana dashboard against a real Prometheus scraping a
whole lab (chaos.lab.run: etcd, simulators, agents, gateways, two control planes) every
second, through a region blackout.

Debian's ``prometheus`` runs in a temp dir with a generated prometheus.yml that scrapes
every process of the lab (``LocalDeployment.metrics_targets``) and loads
runbooks/alerts/tectonic-alerts.yaml as shipped. Everything is checked from
Prometheus's own HTTP API:

* on the healthy lab: every target is up, no alert fires, the dashboard's ``region``
  variable finds the lab's regions, and no query of
  runbooks/grafana/tectonic-dashboard.json errors or comes back empty (its template
  variables substituted the way Grafana does, with "All" regions);
* then the region-blackout drill runs on us-east (holding the drill lock, as the drill
  service does): the region fails over and comes back, the planned-failover ticket
  fires with ``cause="drill"``, and the paging failover alert is never even pending;
* then every vLLM server of us-east is SIGKILLed by the test itself, a real outage:
  the paging failover alert fires after its ``for:`` (seen in /api/v1/alerts and
  /api/v1/rules), the ticket does not, the agent's own metrics show its replicas down,
  and once the servers are back and the region NORMAL again the alert resolves; the
  dashboard's "State transitions" query counts NORMAL -> FAILING_OVER; every rule
  evaluated without error throughout.

A missing ``prometheus`` binary fails the test in CI and skips it elsewhere.

What is judged is targets, alerts, rules and states, each waited for in a window many
times what it takes (the alert's 30 s is the rule's own), and the drill's verdict, whose
windows (RTO and pre-warm: 30 s) are many times what a blackout takes; so
scripts/test.sh runs this module two at a time with other outcome-only labs
(OUTCOMES_PAIRED there): add nothing that times or judges a latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from chaos.drills.scenario import find_scenario
from chaos.drills.traffic import Traffic
from chaos.lab.deployment import LocalDeployment
from chaos.lab.procs import until
from chaos.lab.run import drill_on, running_lab
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from regions.pool.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "runbooks" / "alerts" / "tectonic-alerts.yaml"
DASHBOARD = REPO / "runbooks" / "grafana" / "tectonic-dashboard.json"
FAILOVER_ALERT = "TectonicRegionFailingOver"
PLANNED_ALERT = "TectonicRegionFailedOverPlanned"
SCRAPE_S = 1  # scrape and rule evaluation interval
REGION = "us-east"  # the region blacked out


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):  # CI installs it (scripts/setup.sh): never skip there
            pytest.fail("prometheus is missing: scripts/setup.sh installs it")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    return path


# ---- Prometheus: config, process, API ------------------------------------------------


def prometheus_config(targets: dict[str, list[str]]) -> dict[str, Any]:
    # The shipped rules file is loaded as it is: the failover alert's `for: 30s` is
    # waited for in real time, no copy with shortened durations is needed.
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_S}s",
            "scrape_timeout": f"{SCRAPE_S}s",
            "evaluation_interval": f"{SCRAPE_S}s",
        },
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": hosts}]}
            for job, hosts in targets.items()
            if hosts
        ],
    }


@contextlib.contextmanager
def prometheus_process(binary: str, workdir: Path, config: dict[str, Any]) -> Iterator[str]:
    """Prometheus on a free 127.0.0.1 port with its TSDB in ``workdir``; its base URL."""
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
        log.close()


class PromError(Exception):
    pass


@dataclass
class Prom:
    http: aiohttp.ClientSession
    url: str

    async def api(self, path: str, **params: str) -> Any:
        async with self.http.get(f"{self.url}/api/v1/{path}", params=params) as r:
            body = await r.json(content_type=None)
        if body.get("status") != "success":
            raise PromError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    async def ready(self) -> bool:
        try:
            async with self.http.get(f"{self.url}/-/ready") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    async def query(self, expr: str) -> list[dict[str, Any]]:
        return list((await self.api("query", query=expr))["result"])

    async def query_range(
        self, expr: str, start: float, end: float, step: float
    ) -> list[dict[str, Any]]:
        data = await self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}"
        )
        return list(data["result"])

    async def alerts(self, name: str, state: str = "firing") -> list[dict[str, Any]]:
        found = (await self.api("alerts"))["alerts"]
        return [a for a in found if a["labels"]["alertname"] == name and a["state"] == state]

    async def rules(self) -> list[dict[str, Any]]:
        groups = (await self.api("rules"))["groups"]
        return [rule for g in groups for rule in g["rules"]]


@contextlib.asynccontextmanager
async def prometheus(dep: LocalDeployment, workdir: Path) -> AsyncIterator[Prom]:
    binary = prometheus_binary()
    with prometheus_process(binary, workdir, prometheus_config(dep.metrics_targets())) as url:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            prom = Prom(http, url)
            try:
                await until(prom.ready, within=30, every=0.2, what="prometheus ready")
            except AssertionError as e:
                log = (workdir / "prometheus.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"{e}; its log:\n{log}") from None
            yield prom


# ---- the dashboard, as Grafana would query it ----------------------------------------


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    expr: str
    instant: bool


def dashboard_queries() -> list[PanelQuery]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[PanelQuery]:
        for p in panels:
            yield from walk(p.get("panels", []))  # a collapsed row holds its panels
            for t in p.get("targets", []):
                if t.get("expr"):
                    yield PanelQuery(p["title"], t["expr"], bool(t.get("instant")))

    return list(walk(json.loads(DASHBOARD.read_text())["panels"]))


@dataclass(frozen=True)
class GrafanaRange:
    """A dashboard time range and the intervals Grafana derives from it for a data
    source whose scrape interval is set to ``SCRAPE_S``: ``$__interval`` is the range
    over the panel's data points, at least the scrape interval; ``$__rate_interval``
    is max($__interval + scrape interval, 4 x scrape interval)."""

    start: float
    end: float
    max_points: int = 1000

    @property
    def interval_s(self) -> int:
        return max(SCRAPE_S, round((self.end - self.start) / self.max_points))

    def expr(self, expr: str, region: str = ".*") -> str:
        """``expr`` with the variables substituted; ``region`` ".*" is the variable's
        "All" (its allValue)."""
        subs = {
            "$__rate_interval": f"{max(self.interval_s + SCRAPE_S, 4 * SCRAPE_S)}s",
            "$__interval": f"{self.interval_s}s",
            "$__range": f"{round(self.end - self.start)}s",
            "${region}": region,
            "$region": region,
        }
        for var, value in subs.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"a template variable left in {expr}"
        return expr

    async def run(self, prom: Prom, q: PanelQuery) -> list[dict[str, Any]]:
        expr = self.expr(q.expr)
        if q.instant:
            return await prom.query(expr)
        return await prom.query_range(expr, self.start, self.end, self.interval_s)


# Panels of what the lab does not run: their queries must still evaluate, and may be
# empty (the lab's agents keep no warm pool, so no wake is measured; its leader sizes no
# pool, no scaling:; it prices nothing, no cost:; its gateways run without admission
# control).
OFF_IN_THE_LAB = {
    "Warm pool: shortfall, failed activations",
    "Admission: 429 share by priority",
    "Cost: $ per hour by pool, zone and fleet",
    "Budget utilisation (spend / budget)",
    "Pool efficiency (served / paid capacity)",
    "Activation p95 against its budget (first-token SLO / 3)",
    "WARM standby against the sizing formula",
}


async def dashboard_problems(prom: Prom, window: GrafanaRange) -> list[str]:
    """Each query of the dashboard that errors or returns no series."""
    problems = []
    for q in dashboard_queries():
        try:
            result = await window.run(prom, q)
        except PromError as e:
            problems.append(f"{q.panel!r}: {q.expr} -> error {e}")
            continue
        if not result and q.panel not in OFF_IN_THE_LAB:
            problems.append(f"{q.panel!r}: {q.expr} -> empty")
    return problems


# ---- waiting on the lab, through Prometheus ------------------------------------------


async def targets_not_up(prom: Prom, dep: LocalDeployment) -> list[str]:
    """Every target of the lab that Prometheus has not scraped successfully (yet)."""
    active = (await prom.api("targets", state="active"))["activeTargets"]
    health = {(t["labels"]["job"], t["labels"]["instance"]): t for t in active}
    problems = []
    for job, hosts in dep.metrics_targets().items():
        for host in hosts:
            t = health.get((job, host))
            if t is None or t["health"] != "up":
                why = "not discovered" if t is None else f"{t['health']}: {t['lastError']}"
                problems.append(f"{job} {host}: {why}")
    return problems


async def region_state_is(prom: Prom, state: str) -> bool:
    expr = f'max by (region) (tectonic_region_state{{region="{REGION}", state="{state}"}}) == 1'
    return bool(await prom.query(expr))


def rule_errors(rules: list[dict[str, Any]]) -> list[str]:
    return [f"{r['name']}: {r.get('lastError')}" for r in rules if r.get("health") != "ok"]


async def test_prometheus_scrapes_the_lab_fires_the_failover_alert_and_draws_the_dashboard(
    tmp_path: Path,
) -> None:
    prometheus_binary()  # before starting a lab for nothing
    # One server per region: the blackout kills all of us-east's either way, and fewer
    # processes leave the two cores to the ones under test. The lab's timings are the
    # compressed ones (probes every 0.5 s, 3 s dwell, 1 s recovery steps).
    spec = DeploymentSpec(replicas_per_region=1)
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-test-prom-"))
    problems: list[str] = []  # dashboard findings: all reported together at the end
    async with running_lab(spec, workdir, say=lambda m: None) as dep:
        traffic = Traffic(dep.gateway_urls, interval_s=0.5)
        traffic.add(9, list(spec.regions))
        await traffic.start()
        try:
            async with prometheus(dep, tmp_path) as prom:
                problems += await healthy_lab(prom, dep)
                await drill_pages_no_one(prom, dep)
                problems += await blackout_and_recovery(prom, dep)
        finally:
            await traffic.stop()
    assert not problems, "dashboard queries:\n" + "\n".join(problems)


async def healthy_lab(prom: Prom, dep: LocalDeployment) -> list[str]:
    """Every process scraped, nothing firing, the dashboard's queries answered; returns
    the dashboard queries that still error or come back empty after a while."""
    start = time.time()

    targets = dep.metrics_targets()
    assert {job: len(hosts) for job, hosts in targets.items()} == {
        "controlplane": 2,
        "agent": 3,
        "gateway": 3,
        "vllm": 3,
    }
    down: list[str] = []

    async def all_up() -> bool:
        down[:] = await targets_not_up(prom, dep)
        return not down

    with contextlib.suppress(AssertionError):
        await until(all_up, within=30, every=0.5, what="every target up")
    assert not down, f"targets not up: {down}"
    async with aiohttp.ClientSession() as http:  # the live dashboard the demo points at
        for url in dep.dashboard_urls.values():
            async with http.get(url) as r:
                assert r.status == 200 and "text/html" in r.headers["content-type"]
    regions = await prom.api("label/region/values", **{"match[]": "tectonic_region_state"})
    assert sorted(regions) == sorted(dep.spec.regions)  # the dashboard's region variable
    agent_view = await prom.query('tectonic_agent_region_health{verdict="HEALTHY"} == 1')
    assert {s["metric"]["region"] for s in agent_view} == set(dep.spec.regions)

    # rate() needs two samples in $__rate_interval: give the queries a few scrapes
    deadline = time.monotonic() + 20
    while True:
        problems = await dashboard_problems(prom, GrafanaRange(start, time.time()))
        if not problems or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    firing = [a for a in (await prom.api("alerts"))["alerts"] if a["state"] == "firing"]
    assert not firing, f"alerts firing on a healthy lab: {firing}"
    return problems


async def drill_pages_no_one(prom: Prom, dep: LocalDeployment) -> None:
    """The blackout drill fails the region over and back: a ticket with its cause, no
    page (not even pending) at any evaluation while it runs."""
    paged: list[dict[str, Any]] = []
    planned: list[dict[str, Any]] = []

    async def watch() -> None:
        while True:
            for state in ("pending", "firing"):
                paged.extend(a for a in await prom.alerts(FAILOVER_ALERT, state) if mine(a))
            planned.extend(a for a in await prom.alerts(PLANNED_ALERT) if mine(a))
            await asyncio.sleep(0.5)

    store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
    await store.connect()
    watcher = asyncio.create_task(watch())
    try:
        result = await drill_on(
            dep, store, find_scenario("region-blackout"), REGION, sessions=6, say=lambda m: None
        )
        await asyncio.sleep(2 * SCRAPE_S)  # the last evaluations after the drill's end
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await store.close()
    assert result.passed, [c for c in result.criteria if not c.passed]
    assert await region_state_is(prom, "NORMAL")
    assert not paged, f"the drill paged: {paged}"
    assert planned and {a["labels"]["cause"] for a in planned} == {"drill"}, planned


def mine(alert: dict[str, Any]) -> bool:
    return bool(alert["labels"].get("region") == REGION)


async def blackout_and_recovery(prom: Prom, dep: LocalDeployment) -> list[str]:
    """The failover alert fires and resolves (asserted); returns what the dashboard's
    "State transitions" query got wrong about the blackout, if anything."""
    t0 = time.time()
    killed = dep.stop_servers(REGION)  # SIGKILL, as the blackout drill does
    assert killed

    async def firing() -> bool:
        return any(a["labels"]["region"] == REGION for a in await prom.alerts(FAILOVER_ALERT))

    # detection (a few probe intervals), then the rule's `for: 30s`
    await until(firing, within=75, every=0.5, what=f"{FAILOVER_ALERT} firing for {REGION}")
    rule = next(r for r in await prom.rules() if r["name"] == FAILOVER_ALERT)
    assert rule["state"] == "firing" and rule["health"] == "ok"
    assert not [a for a in await prom.alerts(PLANNED_ALERT) if mine(a)]  # an outage: no ticket
    # the agent's own view of the blackout, scraped from its --metrics-listen
    assert await prom.query(f'tectonic_agent_replica_up{{region="{REGION}"}} == 0')
    assert await prom.query(
        f'tectonic_agent_region_health{{region="{REGION}", verdict="UNHEALTHY"}} == 1'
    )

    dep.start_servers(REGION)

    async def normal() -> bool:
        return await region_state_is(prom, "NORMAL")

    async def resolved() -> bool:
        return not await firing()

    await until(normal, within=90, every=0.5, what=f"{REGION} NORMAL again")
    await until(resolved, within=30, every=0.5, what=f"{FAILOVER_ALERT} resolved")
    rules = await prom.rules()
    assert next(r for r in rules if r["name"] == FAILOVER_ALERT)["state"] == "inactive"
    assert not rule_errors(rules), rule_errors(rules)

    # The dashboard's "State transitions" panel over the blackout counts its transition.
    window = GrafanaRange(t0 - 5, time.time())
    panel = next(q for q in dashboard_queries() if q.panel == "State transitions")
    series = await window.run(prom, panel)
    counted = [
        float(v)
        for s in series
        if s["metric"].get("region") == REGION and s["metric"].get("to") == "FAILING_OVER"
        for _, v in s["values"]
    ]
    if counted and max(counted) > 0:
        return []
    return [f"{panel.panel!r}: {panel.expr} never counted {REGION} -> FAILING_OVER: {series}"]
