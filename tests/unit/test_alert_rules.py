"""The alert rules, the Grafana dashboard and the runbooks in runbooks/, against the code.

* Every alert has a severity, a summary, a description and a runbook link whose page
  and anchor (GitHub's, derived from the page's headings) exist.
* Every metric a rule or a panel queries is one the code exports, with its real suffix
  (counters ``_total``, histograms ``_bucket`` / ``_sum`` / ``_count``), and every label
  a selector or a grouping names is one that metric carries. The names come from the
  real registries (``ControlPlaneMetrics``, ``GatewayMetrics``; the region agent exports
  no Prometheus metrics of its own), exercised so that labelled series exist. The etcd
  rules read etcd's own metrics (``ETCD_METRICS``), checked on a real etcd's /metrics.
* Every ``failoverctl`` command the runbooks show exists, with the options shown
  (from the Typer app itself). A command marked "(coming)" on its line may not exist
  yet; once it does, it is checked like the others.
* Every alert has cases in ``tectonic-alerts.test.yaml``; with ``promtool`` on the PATH,
  ``promtool check rules`` passes and so do those cases (``promtool test rules``), on the
  shipped files as they are (labels and rendered annotations).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from chaos.lab.local_etcd import EtcdServer
from controlplane.cli.failoverctl import app as failoverctl_app
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import CapacityRecord, HitProbe, WorkloadProfile
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.model import (
    ControlFlags,
    Decision,
    FailoverPlan,
    FailoverProgress,
    FailoverStep,
    Health,
    Readiness,
    RegionHealth,
    RegionRecord,
    RegionState,
    Routing,
)
from controlplane.kernel.snapshot import RegionView, Snapshot
from controlplane.metrics import ControlPlaneMetrics
from regions.dataplane.failures import ErrorKind
from regions.gateway.metrics import GatewayMetrics
from regions.gateway.resume import STREAM_BROKEN_STATUS

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = REPO / "runbooks"
RULES = RUNBOOKS / "alerts" / "tectonic-alerts.yaml"
RULE_CASES = RUNBOOKS / "alerts" / "tectonic-alerts.test.yaml"  # promtool test rules
DASHBOARD = RUNBOOKS / "grafana" / "tectonic-dashboard.json"
# The one base of every runbook link (runbooks/README.md says how to change it).
BASE = "https://github.com/tectonic/tectonic/blob/main/runbooks/"
SEVERITIES = {"page", "ticket"}
TARGET_LABELS = {"instance", "job"}  # added by Prometheus to every scraped series

REQUIRED_ALERTS = {
    "TectonicRegionFailingOver",
    "TectonicRegionDegradedLong",
    "TectonicFailoverSlow",
    "TectonicPrewarmAttainmentLow",
    "TectonicNoLeader",
    "TectonicLeaderFlapping",
    "TectonicLeaderLoopStalled",
    "TectonicGatewayFailStatic",
    "TectonicConsistencyViolation",
    "TectonicGatewayErrorRateHigh",
    "TectonicGatewayPinBacklog",
    "TectonicRegionBarred",
    "TectonicDrillOverdue",
    "TectonicCapacityHigh",
    "TectonicCapacityExceeded",
    "TectonicCapacityStale",
    "TectonicStoreRefusingWrites",
    "TectonicEtcdDatabaseNearQuota",
    "TectonicEtcdDatabaseFull",
}
# etcd's own metrics that rules read (scraped from every member, not exported by
# Tectonic): name -> its labels besides the target's. Gauges since etcd 3.4;
# test_etcd_exports_the_metrics_the_rules_read checks them on the installed etcd.
ETCD_METRICS: dict[str, set[str] | None] = {
    "etcd_mvcc_db_total_size_in_bytes": set(),  # the database file, what the quota counts
    "etcd_server_quota_backend_bytes": set(),  # --quota-backend-bytes in effect
}
DAY = 86400.0


def capacity_topology(names: tuple[str, ...] = ("east", "west", "north")) -> Topology:
    return parse_topology(
        {
            "cluster": "alerts",
            "regions": [
                {"name": n, "zone": "us", "agent": "127.0.0.1:1", "capacity_rps": 50} for n in names
            ],
        }
    )


def capacity_record(region: str, measured_at: float, r_base: float = 10.0) -> CapacityRecord:
    probe = HitProbe(hit_rate=0.0, baseline_p99_s=0.1, ultimate_rps=r_base, ultimate_bounded=True)
    return CapacityRecord(
        region=region,
        measured_at=measured_at,
        engine_version="0.11.0",
        replica=f"http://{region}-0:8000",
        slo=CapacitySLO(ttft_p99_s=1.0),
        factor_of_safety=2.0,
        probes=(probe,),
        r_base_rps=r_base,
        beta=0.5,
        profile=WorkloadProfile(
            prompt_tokens_p50=500, prompt_tokens_p90=2000, output_tokens=64, shared_prefix_share=0.5
        ),
    )


# ---- what the code exports -----------------------------------------------------------


def _exercised_registries() -> list[CollectorRegistry]:
    """The real registries, with a child of every labelled metric created by the code
    paths that create them (a labelled family without children has no samples)."""
    cp = ControlPlaneMetrics(["east", "west"], capacity_topology(("east", "west")))
    plan = FailoverPlan(source="east", targets={"west": 1.0}, reason="down", actor="cp")
    progress = FailoverProgress(
        plan=plan, started_at=10.0, prewarm_result={"prefixes_total": 4, "prefixes_warmed": 3}
    )
    east = RegionView(
        name="east",
        record=RegionRecord(region="east", state=RegionState.FAILING_OVER, epoch=1),
        health=RegionHealth(region="east", verdict=Health.UNHEALTHY),
        readiness=Readiness(passed=False, drill="blackout", at=5.0),
        routing=Routing(targets={"west": 1.0}, epoch=1),
        capacity=capacity_record("east", measured_at=10.0),
    )
    west = RegionView(
        name="west", record=RegionRecord(region="west"), health=RegionHealth(region="west")
    )
    cp.tick_done(leader=True, snapshot=Snapshot(now=20.0, regions={"east": east, "west": west}))
    cp.transitioned(
        Decision(
            region="east",
            from_state=RegionState.NORMAL,
            to_state=RegionState.FAILING_OVER,
            trigger="fail_over",
            reason="down",
            actor="cp",
            at=10.0,
            epoch=1,
        )
    )
    cp.failover_step_done("east", FailoverStep.SWITCH, progress, at=11.0)
    cp.failover_step_done("east", FailoverStep.PREWARM, progress, at=12.0)
    cp.tick_timed(0.02)

    gw = GatewayMetrics({"east": "us", "west": "us"})
    gw.request("east", 200)
    gw.error("east", ErrorKind.CONNECT)
    gw.first_byte("east", 0.1)
    gw.retry("east")
    gw.degrade("east", "shed")
    gw.spill("east", "west")
    return [cp.registry, gw.registry]


_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}


def exported_metrics() -> dict[str, set[str] | None]:
    """Every series name the code exports -> its label names (None: not known, because
    the family had no sample to read them from)."""
    out: dict[str, set[str] | None] = {}
    for registry in _exercised_registries():
        for family in registry.collect():
            if family.samples:
                for s in family.samples:
                    labels = out.setdefault(s.name, set())
                    assert labels is not None
                    labels.update(s.labels)
            else:
                for suffix in _SUFFIXES.get(family.type, ("",)):
                    out.setdefault(family.name + suffix, None)
    return out


EXPORTED = {**exported_metrics(), **ETCD_METRICS}

# ---- PromQL: the metric names, selectors and groupings of an expression ---------------

PROMQL_FUNCTIONS = {
    # aggregations
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    # functions
    "abs",
    "absent",
    "absent_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_quantile",
    "histogram_count",
    "histogram_sum",
    "histogram_fraction",
    "holt_winters",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "ln",
    "log2",
    "log10",
    "minute",
    "month",
    "predict_linear",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sqrt",
    "time",
    "timestamp",
    "vector",
    "year",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "quantile_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "last_over_time",
    "present_over_time",
}
PROMQL_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
}

_STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
_STRINGS = re.compile(_STRING)
_SELECTOR = re.compile(rf"([A-Za-z_:][\w:]*)?\s*\{{((?:[^{{}}\"']|{_STRING})*)\}}")
_MATCHER = re.compile(rf"([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*({_STRING})")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GRAFANA_VAR = re.compile(r"\$\{?\w+\}?")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, function names) in a PromQL expression; Grafana's ``$variables``
    may appear where PromQL allows a literal."""
    e = _STRINGS.sub('""', expr)
    e = _GRAFANA_VAR.sub("1", e)
    e = _RANGE.sub("", e)
    e = _GROUPING.sub(" ", e)
    e = re.sub(r"\{[^{}]*\}", "", e)
    metrics: set[str] = set()
    functions: set[str] = set()
    for m in _IDENT.finditer(e):
        name, call = m.group(1), m.group(2)
        if name in PROMQL_KEYWORDS:
            continue
        (functions if call else metrics).add(name)
    return metrics, functions


def promql_selectors(expr: str) -> list[tuple[str | None, dict[str, str]]]:
    """Each ``name{label op "value", ...}`` of the expression: (name, {label: value})."""
    out = []
    for m in _SELECTOR.finditer(expr):
        labels = {lm.group(1): lm.group(3)[1:-1] for lm in _MATCHER.finditer(m.group(2))}
        out.append((m.group(1), labels))
    return out


def promql_grouping_labels(expr: str) -> set[str]:
    e = _STRINGS.sub('""', expr)
    return {
        label.strip()
        for m in _GROUPING.finditer(e)
        for label in m.group(2).split(",")
        if label.strip()
    }


def check_promql(expr: str, where: str) -> list[str]:
    """Problems with ``expr``: unknown metrics, functions, labels or enum values."""
    problems = []
    metrics, functions = promql_names(expr)
    if not metrics:
        problems.append(f"{where}: no metric in {expr!r}")
    for name in sorted(metrics - EXPORTED.keys()):
        problems.append(f"{where}: {name} is not exported by the code")
    for name in sorted(functions - PROMQL_FUNCTIONS):
        problems.append(f"{where}: {name}() is not a PromQL function")
    known_labels = set(TARGET_LABELS)
    for name in metrics & EXPORTED.keys():
        known_labels |= EXPORTED[name] or set()
    for selected, labels in promql_selectors(expr):
        have = EXPORTED.get(selected) if selected else None
        allowed = (have | TARGET_LABELS) if have is not None else known_labels
        for label, value in labels.items():
            if label not in allowed:
                problems.append(f"{where}: {selected or 'selector'} has no label {label!r}")
            enum = {"state": RegionState, "verdict": Health}.get(label)
            if enum is not None and "$" not in value:
                for v in re.split(r"\|", value):
                    if v not in {e.value for e in enum}:
                        problems.append(f"{where}: {label}={v!r} is not a {enum.__name__}")
    for label in sorted(promql_grouping_labels(expr) - known_labels):
        problems.append(f"{where}: grouping by {label!r}, which no metric here carries")
    return problems


def test_the_promql_reader_finds_metrics_and_skips_the_rest() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (region, le) (rate(x_bucket{region=~"$region",'
        ' code!="a{b}"}[$__rate_interval]))) > 1e3 and on (region) time() - y offset 5m'
        ' > bool 8 * 86400 or absent(z{state="NORMAL"})'
    )
    metrics, functions = promql_names(expr)
    assert metrics == {"x_bucket", "y", "z"}
    assert functions == {"histogram_quantile", "sum", "rate", "time", "absent"}
    assert promql_selectors(expr) == [
        ("x_bucket", {"region": "$region", "code": "a{b}"}),
        ("z", {"state": "NORMAL"}),
    ]
    assert promql_grouping_labels(expr) == {"region", "le"}
    # Wrong suffixes, typos, unknown labels and states are caught.
    bad = check_promql(
        'rate(tectonic_transitions[5m]) + tectonic_leader{regoin="x"}'
        ' + tectonic_region_state{state="FAILED"} + rat(tectonic_gateway_first_token_seconds[1m])'
        " + sum by (zone) (tectonic_region_health)",
        "t",
    )
    assert bad == [
        "t: tectonic_gateway_first_token_seconds is not exported by the code",
        "t: tectonic_transitions is not exported by the code",
        "t: rat() is not a PromQL function",
        "t: tectonic_leader has no label 'regoin'",
        "t: state='FAILED' is not a RegionState",
        "t: grouping by 'zone', which no metric here carries",
    ]
    assert check_promql("sum(rate(tectonic_transitions_total[5m]))", "t") == []


# ---- Markdown: GitHub's anchors and the runbook pages ---------------------------------


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped,
    spaces to hyphens, repeats numbered)."""
    seen: dict[str, int] = {}
    anchors = set()
    in_fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_fence or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_github_anchors() -> None:
    md = "# Runbook: a region failed over (FAILING_OVER)\n## Alerts\n```\n# not\n```\n## Alerts\n"
    assert github_anchors(md) == {
        "runbook-a-region-failed-over-failing_over",
        "alerts",
        "alerts-1",
    }


def runbook_pages() -> list[Path]:
    return sorted(RUNBOOKS.glob("*.md"))


def page_target_problems(url: str, where: str) -> list[str]:
    """A link ``page.md#anchor`` (relative to runbooks/) that leads nowhere."""
    page, _, anchor = url.partition("#")
    path = RUNBOOKS / page
    if not path.is_file():
        return [f"{where}: {page} does not exist in runbooks/"]
    if anchor and anchor not in github_anchors(path.read_text()):
        return [f"{where}: {page} has no heading with anchor #{anchor}"]
    return []


def test_runbook_links_between_pages_lead_somewhere() -> None:
    problems = []
    for page in runbook_pages():
        text = page.read_text()
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if target.startswith(("http://", "https://")):
                if target.startswith(BASE):
                    problems += page_target_problems(target[len(BASE) :], page.name)
                continue
            if target.startswith("#"):
                target = page.name + target
            if target.split("#")[0].endswith(".md"):
                problems += page_target_problems(target, page.name)
            elif not (RUNBOOKS / target.split("#")[0]).exists():
                problems.append(f"{page.name}: {target} does not exist")
    assert problems == []


# ---- the alert rules ----------------------------------------------------------------


def load_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    names = [g["name"] for g in doc["groups"]]
    assert len(names) == len(set(names)), f"repeated group names: {names}"
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_every_alert_has_severity_summary_description_and_a_runbook_that_exists() -> None:
    rules = load_rules()
    names = [r.get("alert") for r in rules]
    assert all(names), "every rule is an alerting rule with a name"
    assert len(names) == len(set(names)), f"repeated alert names: {names}"
    assert set(names) >= REQUIRED_ALERTS, f"missing: {REQUIRED_ALERTS - set(names)}"
    problems = []
    for rule in rules:
        name = rule["alert"]
        if set(rule) - {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}:
            problems.append(f"{name}: unknown keys {sorted(rule)}")
        if not str(rule.get("expr", "")).strip():
            problems.append(f"{name}: no expr")
        if "for" in rule and not re.fullmatch(r"(\d+[smhdwy])+", str(rule["for"])):
            problems.append(f"{name}: bad duration for: {rule['for']!r}")
        severity = rule.get("labels", {}).get("severity")
        if severity not in SEVERITIES:
            problems.append(f"{name}: severity {severity!r} not in {sorted(SEVERITIES)}")
        notes = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not str(notes.get(key, "")).strip():
                problems.append(f"{name}: no annotations.{key}")
        url = str(notes.get("runbook_url", ""))
        if not url.startswith(BASE):
            problems.append(f"{name}: runbook_url {url!r} does not start with {BASE}")
            continue
        problems += page_target_problems(url[len(BASE) :], name)
        if url.partition("#")[2] != name.lower():
            problems.append(f"{name}: runbook_url should link the anchor #{name.lower()}")
    assert problems == []


def test_every_rule_queries_only_what_the_code_exports() -> None:
    problems = []
    for rule in load_rules():
        problems += check_promql(str(rule["expr"]), rule["alert"])
    assert problems == []


def test_every_alert_has_promtool_cases() -> None:
    cases = yaml.safe_load(RULE_CASES.read_text())
    assert cases["rule_files"] == [RULES.name]
    tested = {t["alertname"] for case in cases["tests"] for t in case["alert_rule_test"]}
    assert {r["alert"] for r in load_rules()} <= tested


def test_promtool_accepts_the_rules_and_their_cases() -> None:
    """``promtool check rules``, then ``promtool test rules`` on the shipped cases and
    rules as they are: what an operator runs is what passes here."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):  # CI installs it (scripts/setup.sh): never skip there
            pytest.fail("promtool is missing: scripts/setup.sh installs it")
        pytest.skip("promtool is not installed (scripts/setup.sh installs it)")

    def run(*args: str) -> None:
        # From elsewhere than runbooks/alerts: rule_files resolve against the cases' file.
        out = subprocess.run(
            [promtool, *args], capture_output=True, text=True, timeout=120, cwd=REPO
        )
        assert out.returncode == 0, out.stdout + out.stderr

    run("check", "rules", str(RULES.relative_to(REPO)))
    run("test", "rules", str(RULE_CASES.relative_to(REPO)))


def test_every_expected_alert_spells_out_its_annotations() -> None:
    """promtool compares annotations exactly (an alert listed without them expects
    none), so each expected alert carries its summary, description and its rule's
    runbook link; checked here also where promtool is not installed."""
    cases = yaml.safe_load(RULE_CASES.read_text())
    urls = {r["alert"]: str(r["annotations"]["runbook_url"]) for r in load_rules()}
    problems = []
    for case in cases["tests"]:
        for t in case["alert_rule_test"]:
            for exp in t.get("exp_alerts") or []:
                notes = exp.get("exp_annotations", {})
                where = f"{case['name']!r} {t['alertname']} at {t['eval_time']}"
                if set(notes) != {"summary", "description", "runbook_url"}:
                    problems.append(f"{where}: annotations {sorted(notes)}")
                elif notes["runbook_url"] != urls[t["alertname"]]:
                    problems.append(f"{where}: runbook_url {notes['runbook_url']}")
    assert problems == []


async def test_etcd_exports_the_metrics_the_rules_read(etcd: EtcdServer) -> None:
    """The etcd_* names in the rules are the installed etcd's real ones (3.4 from
    Debian; 3.5, the chart's, uses the same names), gauges with no labels of their own."""
    read = {
        name
        for rule in load_rules()
        for name in promql_names(str(rule["expr"]))[0]
        if name.startswith("etcd_")
    }
    assert read == set(ETCD_METRICS)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://{etcd.endpoint}/metrics", timeout=5) as r:
            return str(r.read().decode())

    families = {f.name: f for f in text_string_to_metric_families(await asyncio.to_thread(scrape))}
    for name, labels in ETCD_METRICS.items():
        assert name in families, f"etcd exports no {name}"
        family = families[name]
        assert family.type == "gauge"
        assert [set(s.labels) for s in family.samples] == [labels]
    quota = families["etcd_server_quota_backend_bytes"].samples[0].value
    size = families["etcd_mvcc_db_total_size_in_bytes"].samples[0].value
    assert 0 < size < quota  # the session's member, far from its quota


# ---- the dashboard ------------------------------------------------------------------


def dashboard_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside


def test_dashboard_variables_and_panels() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert 36 <= dash["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    region = variables["region"]
    assert region["type"] == "query" and region["datasource"]["uid"] == "${datasource}"
    query = region["query"]["query"] if isinstance(region["query"], dict) else region["query"]
    m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
    assert m is not None, query
    metric, label = m.groups()
    problems = check_promql(f"count by ({label}) ({metric})", "variable region")
    panels = list(dashboard_panels(dash))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    queried: set[str] = set()
    for p in panels:
        where = f"panel {p['title']!r}"
        if p["type"] in ("row", "text"):
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{where}: datasource is not ${{datasource}}")
        if not p.get("targets"):
            problems.append(f"{where}: no query")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${datasource}":
                problems.append(f"{where} {t['refId']}: datasource is not ${{datasource}}")
            problems += check_promql(t["expr"], f"{where} {t['refId']}")
            queried |= promql_names(t["expr"])[0]
            if "tectonic_gateway_first_token_seconds_bucket" in t["expr"]:
                queried.add("first_token " + t["expr"].split("(")[1].split(",")[0])
    assert problems == []
    assert {
        "tectonic_region_state",
        "tectonic_routing_weight",
        "tectonic_failover_duration_seconds_bucket",
        "tectonic_prewarm_attained_fraction",
        "tectonic_gateway_session_moves_total",
        "tectonic_gateway_requests_total",
        "tectonic_gateway_errors_total",
        "tectonic_leader",
        "tectonic_gateway_consistency_violations_total",
        "tectonic_gateway_degraded_total",
        "tectonic_loop_tick_duration_seconds_bucket",
        "first_token 0.5",
        "first_token 0.99",
    } <= queried


def test_every_status_selector_counts_streams_cut_mid_way() -> None:
    """A stream cut after its first byte is counted ``code="502"`` (regions/gateway/
    proxy.py): every rule and panel that picks statuses out of the gateways' requests
    (the 5xx error rates) must pick it too."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [(r["alert"], str(r["expr"])) for r in load_rules()]
    exprs += [
        (f"panel {p['title']!r}", t["expr"])
        for p in dashboard_panels(dash)
        for t in p.get("targets", [])
    ]
    picked = []
    for where, expr in exprs:
        for name, labels in promql_selectors(expr):
            if name == "tectonic_gateway_requests_total" and "code" in labels:
                picked.append(where)
                if not re.fullmatch(labels["code"], str(STREAM_BROKEN_STATUS)):
                    picked.append(f"{where}: code=~{labels['code']!r} misses broken streams")
    assert "TectonicGatewayErrorRateHigh" in picked and "panel '5xx share by region'" in picked
    assert [w for w in picked if "misses" in w] == []


def test_dashboard_links_the_runbooks() -> None:
    dash = json.loads(DASHBOARD.read_text())
    texts = [p for p in dashboard_panels(dash) if p["type"] == "text"]
    assert texts, "a text panel links the runbooks"
    urls = re.findall(r"\]\(([^)]+)\)", texts[0]["options"]["content"])
    urls += [link["url"] for link in dash.get("links", [])]
    linked = set()
    problems = []
    for url in urls:
        assert url.startswith(BASE), url
        problems += page_target_problems(url[len(BASE) :], "dashboard")
        linked.add(url[len(BASE) :].partition("#")[0])
    assert problems == []
    rule_pages = {
        str(r["annotations"]["runbook_url"])[len(BASE) :].partition("#")[0] for r in load_rules()
    }
    assert rule_pages <= linked, f"the dashboard does not link {rule_pages - linked}"


# ---- failoverctl commands in the runbooks -------------------------------------------


# ;, && or | outside double quotes (an even number of quotes follows)
_SHELL_SEPARATOR = re.compile(r'(?:;|&&|\|)(?=(?:[^"]*"[^"]*")*[^"]*$)')


def failoverctl_commands(markdown: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, command, marked coming) for each ``failoverctl ...`` in a code span."""
    lines = markdown.splitlines()
    for m in re.finditer(r"`([^`]+)`", markdown):
        span = " ".join(m.group(1).split())
        first = markdown.count("\n", 0, m.start())
        last = markdown.count("\n", 0, m.end())
        coming = any("(coming" in lines[i] for i in range(first, last + 1))
        for piece in _SHELL_SEPARATOR.split(span):
            piece = piece.strip()
            if re.match(r"^(\S*/)?failoverctl(\s|$)", piece):
                yield first + 1, piece, coming


def failoverctl_root() -> Any:
    """failoverctl's command tree: a click-style group (Typer vendors its own click, so
    it is read by its attributes: ``commands``, ``params``, ``opts``, ``is_flag``)."""
    return typer.main.get_group(failoverctl_app)


def command_problem(root: Any, command: str) -> str | None:
    """Why ``command`` would not parse as shown (unknown command or option), or None."""
    try:
        words = shlex.split(command)[1:]
    except ValueError as e:
        return f"cannot split: {e}"
    cmd, path = root, "failoverctl"
    while words and hasattr(cmd, "commands"):
        word = words[0]
        if word.startswith("-"):
            option = _option(cmd, word)
            if option is None:
                return f"{path} has no option {word}"
            takes_value = not (word == "--help" or option.is_flag or "=" in word)
            words = words[2 if takes_value else 1 :]
            continue
        if word not in cmd.commands:
            return f"no command {word!r}"
        cmd, path, words = cmd.commands[word], f"{path} {word}", words[1:]
    for word in words:
        if word.startswith("-") and word != "-" and _option(cmd, word) is None:
            return f"{path} has no option {word}"
    return None


def _option(cmd: Any, word: str) -> Any:
    flag = word.split("=", 1)[0]
    for p in cmd.params:
        if p.param_type_name == "option" and flag in (*p.opts, *p.secondary_opts):
            return p
    return "help" if flag == "--help" else None


def test_the_command_reader() -> None:
    root = failoverctl_root()
    assert command_problem(root, "failoverctl history --region R --limit 30") is None
    assert command_problem(root, 'failoverctl --server a:1 failover R --to T -r "x y"') is None
    assert command_problem(root, "failoverctl sessions pin S --region R --reason x") is None
    assert command_problem(root, "failoverctl histry") == "no command 'histry'"
    assert command_problem(root, "failoverctl history --regoin R") == (
        "failoverctl history has no option --regoin"
    )
    assert command_problem(root, "failoverctl --help") is None
    md = (
        'Run `failoverctl status; failoverctl pause -r "a; b"`\n'
        "and `failoverctl readiness` (coming).\n"
    )
    assert list(failoverctl_commands(md)) == [
        (1, "failoverctl status", False),
        (1, 'failoverctl pause -r "a; b"', False),
        (2, "failoverctl readiness", True),
    ]


def test_runbooks_show_only_failoverctl_commands_that_exist() -> None:
    root = failoverctl_root()
    problems, seen = [], 0
    for page in runbook_pages():
        for line, command, coming in failoverctl_commands(page.read_text()):
            seen += 1
            why = command_problem(root, command)
            if why is None or (coming and why.startswith("no command")):
                continue
            problems.append(f"{page.name}:{line}: {command!r}: {why}")
    assert seen > 20
    assert problems == []


# ---- the metrics the alerts added -----------------------------------------------------


def test_leader_exports_routing_readiness_and_pause() -> None:
    m = ControlPlaneMetrics()
    get = m.registry.get_sample_value

    def view(name: str, **kw: Any) -> RegionView:
        return RegionView(
            name=name, record=RegionRecord(region=name), health=RegionHealth(region=name), **kw
        )

    east = view(
        "east",
        readiness=Readiness(passed=False, drill="blackout", at=1000.0),
        routing=Routing(targets={"west": 0.25, "north": 0.75}, epoch=2),
    )
    west = view("west", readiness=Readiness(passed=False, at=900.0, override_reason="INC-1"))
    snap = Snapshot(
        now=2000.0, regions={"east": east, "west": west}, control=ControlFlags(paused=True)
    )
    m.tick_done(leader=True, snapshot=snap)
    assert get("tectonic_routing_weight", {"region": "east", "target": "north"}) == 0.75
    assert get("tectonic_routing_weight", {"region": "west", "target": "west"}) == 1.0
    assert get("tectonic_region_barred", {"region": "east"}) == 1
    assert get("tectonic_region_barred", {"region": "west"}) == 0  # overridden
    assert get("tectonic_region_drill_timestamp_seconds", {"region": "east"}) == 1000.0
    assert get("tectonic_automation_paused") == 1

    # Routing home again: the targets it no longer names go; readiness gone too.
    east = east.model_copy(update={"routing": Routing(targets={"east": 1.0}), "readiness": None})
    snap = Snapshot(now=2001.0, regions={"east": east, "west": west})
    m.tick_done(leader=True, snapshot=snap)
    assert get("tectonic_routing_weight", {"region": "east", "target": "north"}) is None
    assert get("tectonic_routing_weight", {"region": "east", "target": "east"}) == 1.0
    assert get("tectonic_region_barred", {"region": "east"}) == 0
    assert get("tectonic_region_drill_timestamp_seconds", {"region": "east"}) is None
    assert get("tectonic_automation_paused") == 0

    m.tick_done(
        leader=True, snapshot=snap.model_copy(update={"control": ControlFlags(paused=True)})
    )
    m.tick_done(leader=False, snapshot=None)  # a follower: no region gauges, not paused
    assert get("tectonic_routing_weight", {"region": "east", "target": "east"}) is None
    assert get("tectonic_region_barred", {"region": "west"}) is None
    assert get("tectonic_region_drill_timestamp_seconds", {"region": "west"}) is None
    assert get("tectonic_automation_paused") == 0


def test_leader_exports_capacity_utilisation_against_the_planners_bearing() -> None:
    topo = capacity_topology()
    m = ControlPlaneMetrics(topo.names, topo)
    get = m.registry.get_sample_value
    now = 100 * DAY

    def view(name: str, load: float, hit: float = 0.0, **kw: Any) -> RegionView:
        signals = {"load_rps": load, "prefix_hit_rate": hit}
        return RegionView(
            name=name,
            record=RegionRecord(region=name),
            health=RegionHealth(region=name, signals=signals),
            **kw,
        )

    # east: probed an hour ago, 2 ACTIVE replicas of R_base 10, beta 0.5, FOS 2: at hit
    # rate 0.5 it bears 2 x 10 / (1 - 0.25) / 2 = 13.33 rps, and serves 9.
    east = view("east", 9.0, 0.5, capacity=capacity_record("east", now - 3600), active_replicas=2)
    # west: probed 30 days ago (max 14): stale, the typed 50 rps used; it serves 60.
    west = view("west", 60.0, capacity=capacity_record("west", now - 30 * DAY))
    north = view("north", 0.0)  # never probed: typed, not stale, no age
    regions = {"east": east, "west": west, "north": north}
    m.tick_done(leader=True, snapshot=Snapshot(now=now, regions=regions))
    assert get("tectonic_region_allowed_rps", {"region": "east"}) == pytest.approx(40 / 3)
    assert get("tectonic_region_capacity_utilization", {"region": "east"}) == pytest.approx(0.675)
    assert get("tectonic_region_capacity_stale", {"region": "east"}) == 0
    assert get("tectonic_region_capacity_age_seconds", {"region": "east"}) == 3600
    assert get("tectonic_region_allowed_rps", {"region": "west"}) == 50
    assert get("tectonic_region_capacity_utilization", {"region": "west"}) == pytest.approx(1.2)
    assert get("tectonic_region_capacity_stale", {"region": "west"}) == 1
    assert get("tectonic_region_capacity_age_seconds", {"region": "west"}) == 30 * DAY
    assert get("tectonic_region_capacity_utilization", {"region": "north"}) == 0
    assert get("tectonic_region_capacity_stale", {"region": "north"}) == 0
    assert get("tectonic_region_capacity_age_seconds", {"region": "north"}) is None

    # No ACTIVE replica left in east while it still serves: it bears nothing (+Inf, which
    # the page alert's "> 1.0" catches); west's record deleted: its age goes.
    regions["east"] = east.model_copy(update={"active_replicas": 0})
    regions["west"] = west.model_copy(update={"capacity": None})
    m.tick_done(leader=True, snapshot=Snapshot(now=now + 1, regions=regions))
    assert math.isinf(get("tectonic_region_capacity_utilization", {"region": "east"}) or 0)
    assert get("tectonic_region_allowed_rps", {"region": "east"}) == 0
    assert get("tectonic_region_capacity_stale", {"region": "west"}) == 0
    assert get("tectonic_region_capacity_age_seconds", {"region": "west"}) is None

    m.tick_done(leader=False, snapshot=None)  # a follower exports none of them
    for name in ("utilization", "stale"):
        assert get(f"tectonic_region_capacity_{name}", {"region": "east"}) is None
    assert get("tectonic_region_allowed_rps", {"region": "east"}) is None
    assert get("tectonic_region_capacity_age_seconds", {"region": "east"}) is None
    # Without a topology (nothing to judge by) no capacity gauge is exported at all.
    bare = ControlPlaneMetrics(topo.names)
    bare.tick_done(leader=True, snapshot=Snapshot(now=now, regions=regions))
    assert (
        bare.registry.get_sample_value("tectonic_region_capacity_utilization", {"region": "west"})
        is None
    )
