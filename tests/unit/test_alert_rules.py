"""The alert rules in runbooks/alerts/, against the code.

* Every alert has a severity, a summary, a description and a runbook link whose page
  and anchor (GitHub's, derived from the page's headings) exist.
* Every metric a rule queries is one the code exports, with its real suffix (counters
  ``_total``, histograms ``_bucket`` / ``_sum`` / ``_count``), and every label a selector
  or a grouping names is one that metric carries (``alert_promql.py``: the names come
  from the real registries, exercised so that labelled series exist). The etcd rules
  read etcd's own metrics (``ETCD_METRICS``), checked on a real etcd's /metrics.
* Every alert has cases in ``tectonic-alerts.test.yaml``; with ``promtool`` on the PATH,
  ``promtool check rules`` passes and so do those cases (``promtool test rules``), on the
  shipped files as they are (labels and rendered annotations).

The dashboard's queries and links: test_alert_dashboard.py; the runbook pages' links and
``failoverctl`` commands: test_alert_runbooks.py; the metrics the alerts added:
test_alert_metrics.py.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from chaos.lab.local_etcd import EtcdServer
from tests.unit.alert_promql import (
    ETCD_METRICS,
    check_promql,
    promql_grouping_labels,
    promql_names,
    promql_selectors,
)
from tests.unit.alert_rules_helpers import (
    BASE,
    REPO,
    RULE_CASES,
    RULES,
    load_rules,
    page_target_problems,
)

SEVERITIES = {"page", "ticket"}
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


# ---- the PromQL reader (alert_promql.py) ----------------------------------------------


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
    both = 'rate({__name__=~"a_(gateway|picker)_x_total", code=~"5.."}[5m]) / w'
    assert promql_names(both) == ({"a_gateway_x_total", "a_picker_x_total", "w"}, {"rate"})
    assert promql_selectors(both) == [
        ("a_gateway_x_total", {"code": "5.."}),
        ("a_picker_x_total", {"code": "5.."}),
    ]
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
    # Both data planes' names are checked: the picker's too.
    assert check_promql('{__name__=~"tectonic_(gateway|picker)_store_up"} == 0', "t") == []
    assert check_promql('{__name__=~"tectonic_(gateway|picker)_stor_up"} == 0', "t") == [
        "t: tectonic_gateway_stor_up is not exported by the code",
        "t: tectonic_picker_stor_up is not exported by the code",
    ]


# ---- the alert rules ----------------------------------------------------------------


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
