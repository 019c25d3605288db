"""The Helm chart's monitoring (deploy/helm/tectonic, ``monitoring`` values), checked on a
machine without a cluster or the Prometheus Operator.

One source: the chart's files/ hold byte-for-byte copies of runbooks/alerts/
tectonic-alerts.yaml and runbooks/grafana/tectonic-dashboard.json
(scripts/sync_chart_monitoring.py), and a copy that differs fails here. With everything
on and a runbook base of our own (rendered once): the PrometheusRule's groups are the
rules file's, each runbook_url under the new base; the ServiceMonitors and the bundled
etcd's PodMonitor name ports that the Services and pods of the same render have, and that
those ports are where each process serves /metrics; the dashboard ConfigMap holds the
dashboard, labelled for Grafana's sidecar. Off by default: none of these objects.

kubernetes-validate has no schemas for monitoring.coreos.com: the ServiceMonitor,
PodMonitor and PrometheusRule are checked against the Prometheus Operator's CRD schemas
for the fields the chart sets (transcribed below), with additionalProperties: false on
every object (the API server prunes unknown fields silently, so a misspelt field would
vanish there instead of failing).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from scripts.sync_chart_monitoring import COPIES
from tests.integration.helm_chart_helpers import (
    CHART,
    NAMESPACE,
    REPO,
    VALUE_SETS,
    Rendered,
    _rendered,
    helm,
    import_tool,
    kubernetes_validate,
    load_values,
    manifests_of,
    render,
    render_error,
)

# The harness's fixtures (helm_chart_helpers.py), imported for pytest to find them.
FIXTURES = (helm, kubernetes_validate)

RULES = REPO / "runbooks" / "alerts" / "tectonic-alerts.yaml"
DASHBOARD = REPO / "runbooks" / "grafana" / "tectonic-dashboard.json"
SOURCE_BASE = "https://github.com/tectonic/tectonic/blob/main/runbooks"
BASE = "https://runbooks.example.com/tectonic"
MONITOR_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
KUBE_VERSIONS = ("1.30.0", "1.37.0")  # as test_helm_chart_render.py's
SYNC = "run python scripts/sync_chart_monitoring.py"

MONITORING: dict[str, Any] = {
    "runbookBaseUrl": BASE + "/",  # a trailing slash is dropped, not doubled
    "serviceMonitor": {
        "enabled": True,
        "interval": "30s",
        "labels": {"release": "kube-prometheus-stack"},
    },
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "dashboard": {
        "enabled": True,
        "namespace": "grafana",
        "annotations": {"grafana_folder": "Tectonic"},
    },
}

# ---- the Prometheus Operator's CRDs, the fields the chart sets ---------------------------
# From example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,podmonitors,
# prometheusrules}.yaml of prometheus-operator/prometheus-operator (v0.82-0.84),
# descriptions left out; additionalProperties: false is ours.
DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
    r"(([0-9]+)s)?(([0-9]+)ms)?)$",
}
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": {**STRINGS, "minProperties": 1}},
    "required": ["matchLabels"],
}
NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {}}},
}
ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {
        "port": {"type": "string", "minLength": 1},
        "path": {"type": "string"},
        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": DURATION,
    },
}


def monitor_spec(endpoints: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [endpoints, "selector"],
        "properties": {
            "jobLabel": {"type": "string"},
            "selector": SELECTOR,
            "namespaceSelector": NAMESPACE_SELECTOR,
            endpoints: {"type": "array", "minItems": 1, "items": ENDPOINT},
        },
    }


RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "properties": {
        "alert": {"type": "string"},
        "record": {"type": "string"},
        "expr": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "for": DURATION,
        "keep_firing_for": {**DURATION, "minLength": 1},
        "labels": STRINGS,
        "annotations": STRINGS,
    },
}
RULE_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "groups": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": DURATION,
                    "labels": STRINGS,
                    "limit": {"type": "integer"},
                    "query_offset": DURATION,
                    "rules": {"type": "array", "items": RULE},
                },
            },
        }
    },
}
SPECS = {
    "ServiceMonitor": monitor_spec("endpoints"),
    "PodMonitor": monitor_spec("podMetricsEndpoints"),
    "PrometheusRule": RULE_SPEC,
}
# Kubernetes' own rules for names and labels (apimachinery's validation).
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def check_crd_object(jsonschema: ModuleType, m: dict[str, Any]) -> dict[str, Any]:
    """apiVersion, kind, metadata and the spec of a monitoring.coreos.com object; its spec."""
    assert m["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(m) == {"apiVersion", "kind", "metadata", "spec"}
    meta = m["metadata"]
    assert set(meta) <= {"name", "namespace", "labels", "annotations"}
    assert len(meta["name"]) <= 253 and DNS_SUBDOMAIN.match(meta["name"])
    assert len(meta["namespace"]) <= 63 and DNS_LABEL.match(meta["namespace"])
    for key, value in meta.get("labels", {}).items():
        prefix, _, name = key.rpartition("/")
        assert not prefix or DNS_SUBDOMAIN.match(prefix), key
        assert len(name) <= 63 and LABEL_NAME.match(name), key
        assert isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.match(value), key
    jsonschema.validate(m["spec"], SPECS[m["kind"]])
    spec: dict[str, Any] = m["spec"]
    return spec


# ---- rendering --------------------------------------------------------------------------
def with_monitoring(values: dict[str, Any], monitoring: dict[str, Any]) -> dict[str, Any]:
    return {**values, "monitoring": monitoring}


@pytest.fixture(scope="module")
def monitored(helm: ModuleType) -> Rendered:
    """The all-on value set with every monitoring object on and a runbook base of our own."""
    values = with_monitoring(load_values(VALUE_SETS["all-on"]), MONITORING)
    return Rendered("all-on+monitoring", values, manifests_of(render(helm, values)))


@pytest.fixture(scope="module")
def jsonschema() -> ModuleType:
    return import_tool("jsonschema")


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def pods_of(rendered: Rendered) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, pod template) of every Deployment and StatefulSet."""
    return [
        (w["metadata"]["namespace"], w["spec"]["template"])
        for w in rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet")
    ]


def flag(container: dict[str, Any], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"{name}=")]
    return value


# The flag with which each component's process serves /metrics, host:port or URL.
METRICS_FLAG = {
    "controlplane": "--http-listen",
    "agent": "--metrics-listen",
    "gateway": "--listen",  # the gateway serves /metrics beside the API
    "picker": "--http-listen",
    "etcd": "--listen-metrics-urls",
}


def assert_serves_metrics(pod: dict[str, Any], port_name: str) -> None:
    """The pod's container port ``port_name`` is the one its process serves /metrics on."""
    component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
    for container in pod["spec"]["containers"]:
        numbers = [p["containerPort"] for p in container["ports"] if p["name"] == port_name]
        if numbers:
            address = flag(container, METRICS_FLAG[component])
            assert address.endswith(f":{numbers[0]}"), (component, port_name, address)
            return
    raise AssertionError(f"{component}: no container port {port_name!r}")


# ---- one source -------------------------------------------------------------------------
def test_the_charts_copies_are_the_runbooks_files_byte_for_byte() -> None:
    assert {c.parent for c in COPIES.values()} == {CHART / "files"}
    assert set(COPIES) == {RULES, DASHBOARD}
    for source, copy in COPIES.items():
        where = f"{copy.relative_to(REPO)} (a copy of {source.relative_to(REPO)})"
        assert copy.is_file(), f"{where} is missing: {SYNC}"
        assert copy.read_bytes() == source.read_bytes(), f"{where} differs: {SYNC}"


# ---- off by default ---------------------------------------------------------------------
@pytest.mark.parametrize("value_set", sorted(set(VALUE_SETS) - {"all-on"}))
def test_no_value_set_renders_monitoring_objects_unless_asked(value_set: str) -> None:
    """all-on turns monitoring on (the tests below read its objects)."""
    rendered = _rendered(value_set)
    assert not rendered.values.get("monitoring"), value_set
    for kind in MONITOR_KINDS:
        assert rendered.of_kind(kind) == [], kind
    names = {cm["metadata"]["name"] for cm in rendered.of_kind("ConfigMap")}
    assert "tt-tectonic-dashboard" not in names


def test_each_switch_renders_only_its_own_objects(helm: ModuleType) -> None:
    kinds = {
        "serviceMonitor": {"ServiceMonitor"},
        "prometheusRule": {"PrometheusRule"},
        "dashboard": {"ConfigMap"},
    }
    baseline = manifests_of(render(helm, {}))
    for switch, expected in kinds.items():
        docs = manifests_of(render(helm, {"monitoring": {switch: {"enabled": True}}}))
        added = [d for d in docs if d not in baseline]
        assert {d["kind"] for d in added} == expected, switch
    # External etcd (the default): no PodMonitor, only the bundled etcd has one.
    docs = manifests_of(render(helm, {"monitoring": {"serviceMonitor": {"enabled": True}}}))
    assert [d for d in docs if d["kind"] == "PodMonitor"] == []


# ---- the PrometheusRule -----------------------------------------------------------------
def test_the_prometheus_rule_is_the_rules_file_under_the_runbook_base(
    monitored: Rendered, jsonschema: ModuleType
) -> None:
    (rule,) = monitored.of_kind("PrometheusRule")
    spec = check_crd_object(jsonschema, rule)
    assert rule["metadata"]["name"] == "tt-tectonic-alerts"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == "tt"

    expected = yaml.safe_load(RULES.read_text())["groups"]
    urls = 0
    for group in expected:
        for r in group["rules"]:
            url = r.get("annotations", {}).get("runbook_url")
            if url is not None:
                assert url.startswith(SOURCE_BASE + "/"), url
                r["annotations"]["runbook_url"] = BASE + url.removeprefix(SOURCE_BASE)
                urls += 1
    assert urls >= 20  # every alert of the file has one
    assert spec["groups"] == expected
    rendered_urls = [
        r["annotations"]["runbook_url"] for g in spec["groups"] for r in g["rules"] if "alert" in r
    ]
    assert len(rendered_urls) == urls
    for url in rendered_urls:
        assert url.startswith(BASE + "/") and "//" not in url.removeprefix("https://"), url


def test_the_default_runbook_base_keeps_the_rules_file_as_it_is(helm: ModuleType) -> None:
    docs = manifests_of(render(helm, {"monitoring": {"prometheusRule": {"enabled": True}}}))
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


# ---- the ServiceMonitors and the PodMonitor ---------------------------------------------
def test_service_monitors_scrape_the_metrics_ports_of_the_components_services(
    monitored: Rendered, jsonschema: ModuleType
) -> None:
    components = set()
    for monitor in monitored.of_kind("ServiceMonitor"):
        spec = check_crd_object(jsonschema, monitor)
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        selector = spec["selector"]["matchLabels"]
        namespaces = spec["namespaceSelector"]["matchNames"]
        assert namespaces == [NAMESPACE]
        services = [
            s
            for s in monitored.of_kind("Service")
            if s["metadata"]["namespace"] in namespaces
            and labels_match(selector, s["metadata"]["labels"])
        ]
        assert services, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        component = selector["app.kubernetes.io/component"]
        components.add(component)
        assert spec["jobLabel"] == "app.kubernetes.io/component"
        for endpoint in spec["endpoints"]:
            assert (endpoint["path"], endpoint["interval"]) == ("/metrics", "30s")
            for service in services:
                assert service["metadata"]["labels"]["app.kubernetes.io/component"] == component
                ports = {p["name"]: p for p in service["spec"]["ports"]}
                name = service["metadata"]["name"]
                assert endpoint["port"] in ports, f"Service {name}: no port {endpoint['port']}"
                target = ports[endpoint["port"]]["targetPort"]
                pods = [
                    pod
                    for ns, pod in pods_of(monitored)
                    if ns == service["metadata"]["namespace"]
                    and labels_match(service["spec"]["selector"], pod["metadata"]["labels"])
                ]
                assert pods, f"Service {name} selects no pod"
                for pod in pods:
                    assert_serves_metrics(pod, target)
    assert components == {"controlplane", "agent", "gateway", "picker"}


def test_the_bundled_etcd_is_scraped_by_a_pod_monitor(
    monitored: Rendered, jsonschema: ModuleType
) -> None:
    (monitor,) = monitored.of_kind("PodMonitor")
    spec = check_crd_object(jsonschema, monitor)
    selector = spec["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "etcd"
    # etcd's headless Service has no metrics port: why this is a PodMonitor.
    etcd_service = monitored.one("Service", "tt-tectonic-etcd")
    assert "metrics" not in {p["name"] for p in etcd_service["spec"]["ports"]}
    pods = [
        pod
        for ns, pod in pods_of(monitored)
        if ns in spec["namespaceSelector"]["matchNames"]
        and labels_match(selector, pod["metadata"]["labels"])
    ]
    assert len(pods) == 1  # the StatefulSet's template
    for endpoint in spec["podMetricsEndpoints"]:
        assert (endpoint["path"], endpoint["interval"]) == ("/metrics", "30s")
        assert_serves_metrics(pods[0], endpoint["port"])


# ---- the dashboard ----------------------------------------------------------------------
def test_the_dashboard_configmap_is_the_dashboard_for_grafanas_sidecar(
    monitored: Rendered, kubernetes_validate: ModuleType
) -> None:
    cm = monitored.one("ConfigMap", "tt-tectonic-dashboard")
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(cm, version, strict=True)
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Tectonic"}
    (text,) = cm["data"].values()
    shipped = DASHBOARD.read_text()
    assert SOURCE_BASE + "/" in shipped  # the Runbooks panel and the dashboard's links
    # byte for byte, but for the runbook links under monitoring.runbookBaseUrl
    assert text == shipped.replace(SOURCE_BASE + "/", BASE + "/")
    assert SOURCE_BASE not in text and json.loads(text)["links"][0]["url"].startswith(BASE + "/")


def test_the_sidecar_label_and_the_namespace_are_configurable(helm: ModuleType) -> None:
    dashboard = {
        "enabled": True,
        "sidecarLabel": "example.com/dashboard",
        "sidecarLabelValue": "tectonic",
    }
    docs = manifests_of(render(helm, {"monitoring": {"dashboard": dashboard}}))
    (cm,) = [d for d in docs if d["metadata"]["name"] == "tt-tectonic-dashboard"]
    assert cm["metadata"]["namespace"] == NAMESPACE
    labels = cm["metadata"]["labels"]
    assert labels["example.com/dashboard"] == "tectonic" and "grafana_dashboard" not in labels


# ---- lint and bad values ----------------------------------------------------------------
def test_lint_is_clean_with_monitoring_on(helm: ModuleType, monitored: Rendered) -> None:
    report = helm.lint(
        str(CHART), monitored.values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0"
    )
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    ("monitoring", "field"),
    [
        ({"runbookBaseUrl": "runbooks.example.com"}, "/monitoring/runbookBaseUrl"),
        ({"serviceMonitor": {"interval": "15 seconds"}}, "/monitoring/serviceMonitor/interval"),
        ({"serviceMonitor": {"labels": {"release": 1}}}, "/monitoring/serviceMonitor/labels"),
        ({"prometheusRule": {"enabled": "yes"}}, "/monitoring/prometheusRule/enabled"),
        ({"dashboard": {"namespace": "Grafana"}}, "/monitoring/dashboard/namespace"),
        ({"dashboard": {"sidecarLabel": ""}}, "/monitoring/dashboard/sidecarLabel"),
        ({"podMonitor": {"enabled": True}}, "additional properties 'podMonitor' not allowed"),
    ],
)
def test_a_bad_monitoring_value_fails_rendering_naming_it(
    helm: ModuleType, monitoring: dict[str, Any], field: str
) -> None:
    assert field in render_error(helm, {"monitoring": monitoring})


def test_the_chart_reads_its_copies_not_the_runbooks_directory() -> None:
    """Helm reads files inside the chart only: the template names files/, never runbooks/."""
    template = (CHART / "templates" / "monitoring.yaml").read_text()
    gets = re.findall(r'\.Files\.Get "([^"]+)"', template)
    assert sorted(gets) == sorted(str(c.relative_to(CHART)) for c in COPIES.values())
    assert all(Path(CHART / g).is_file() for g in gets)
