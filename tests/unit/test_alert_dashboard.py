"""The Grafana dashboard in runbooks/grafana/, against the code and the alert rules.

Its variables and every panel query only what the code exports (with the real suffixes
and labels, read by ``alert_promql.py``) through the ``${datasource}`` variable; every
status selector on the gateways' requests, in a panel or a rule, counts the streams cut
mid-way; the dashboard links the runbooks, every page the rules link among them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from regions.gateway.resume import STREAM_BROKEN_STATUS
from tests.unit.alert_promql import check_promql, promql_names, promql_selectors
from tests.unit.alert_rules_helpers import BASE, DASHBOARD, load_rules, page_target_problems

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
            if "first_token_seconds_bucket" in t["expr"]:
                queried.add("first_token " + t["expr"].split("(")[1].split(",")[0])
    assert problems == []
    assert {
        "tectonic_region_state",
        "tectonic_routing_weight",
        "tectonic_failover_duration_seconds_bucket",
        "tectonic_prewarm_attained_fraction",
        *(
            f"tectonic_{data_plane}_{name}_total"
            for data_plane in ("gateway", "picker")  # the endpoint picker's own names too
            for name in ("session_moves", "requests", "errors", "consistency_violations")
        ),
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
