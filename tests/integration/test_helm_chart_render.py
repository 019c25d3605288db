"""The Helm chart (deploy/helm/tectonic) rendered and linted, and its manifests checked
against the schemas, on a machine without a cluster.

Helm's own Go SDK renders the chart with its default values and the value sets in its
ci/ folder, and lints it; every rendered manifest is validated against the Kubernetes
JSON schemas (kubernetes-validate) of the chart's oldest Kubernetes and the newest the
package ships; the InferencePool, a CRD those schemas lack, against the Gateway API
Inference Extension's own CRD schema (transcribed below); bad values fail rendering
with a message naming the field (values.schema.json and the templates' checks).
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest

from tests.integration.helm_chart_helpers import (
    CHART,
    NAMESPACE,
    VALUE_SETS,
    Rendered,
    _rendered,
    helm,
    import_tool,
    kubernetes_validate,
    load_values,
    render_error,
    rendered,
)

# The harness's fixtures (helm_chart_helpers.py), imported for pytest to find them.
FIXTURES = (helm, kubernetes_validate, rendered)

# The chart's kubeVersion floor (Chart.yaml) and the newest schemas kubernetes-validate
# 1.37 ships: a manifest valid for both is valid for the versions between.
KUBE_VERSIONS = ("1.30.0", "1.37.0")
# Kinds whose schemas are CRDs, not Kubernetes': kubernetes-validate has none for them.
CRD_KINDS = {"InferencePool"}

# GIE's InferencePool spec, from config/crd/bases/inference.networking.k8s.io_inferencepools.yaml
# of kubernetes-sigs/gateway-api-inference-extension at 84436a96b9e6 (v1), descriptions and
# defaults left out. additionalProperties: false is ours: the API server prunes unknown
# fields silently, so a misspelt field would vanish there instead of failing.
_PORT = {
    "type": "object",
    "required": ["number"],
    "additionalProperties": False,
    "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}},
}
INFERENCE_POOL_SPEC: dict[str, Any] = {
    "type": "object",
    "required": ["selector", "targetPorts"],
    "additionalProperties": False,
    "properties": {
        "appProtocol": {"type": "string", "enum": ["http", "kubernetes.io/h2c"]},
        "endpointPickerRef": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {
                "failureMode": {"type": "string", "enum": ["FailOpen", "FailClose"]},
                "group": {
                    "type": "string",
                    "maxLength": 253,
                    "pattern": r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                    r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
                },
                "kind": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 63,
                    "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$",
                },
                "name": {"type": "string", "minLength": 1, "maxLength": 253},
                "port": _PORT,
            },
        },
        "selector": {
            "type": "object",
            "required": ["matchLabels"],
            "additionalProperties": False,
            "properties": {
                "matchLabels": {
                    "type": "object",
                    "minProperties": 1,
                    "maxProperties": 64,
                    "additionalProperties": {
                        "type": "string",
                        "maxLength": 63,
                        "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
                    },
                }
            },
        },
        "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": _PORT},
    },
}


# ---- render and lint --------------------------------------------------------------------
def test_every_value_set_renders_the_components_it_turns_on(rendered: Rendered) -> None:
    kinds = {m["kind"] for m in rendered.manifests}
    assert {"ConfigMap", "Deployment", "Service", "Role", "RoleBinding"} <= kinds
    components = {
        m["metadata"]["labels"].get("app.kubernetes.io/component")
        for m in rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet")
    }
    expected = {
        "default": {"controlplane", "agent"},
        "all-on": {"controlplane", "agent", "gateway", "picker", "drills", "model-server", "etcd"},
        "external-etcd": {"agent", "picker", "drills"},
        "pools": {"controlplane", "agent", "gateway", "picker", "model-server", "etcd"},
    }
    assert components == expected[rendered.name]
    for m in rendered.manifests:  # namespaced objects name their namespace: none in default
        assert m["metadata"].get("namespace"), f"{m['kind']}/{m['metadata']['name']}"


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_lint_is_clean(helm: ModuleType, value_set: str) -> None:
    report = helm.lint(
        str(CHART),
        load_values(VALUE_SETS[value_set]),
        strict=True,
        namespace=NAMESPACE,
        kube_version=f"v{KUBE_VERSIONS[0]}",
    )
    assert report["errors"] == []
    # Severity 1 is information ("icon is recommended"); 2 warnings, 3 errors.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


# ---- Kubernetes schemas -----------------------------------------------------------------
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_manifest_is_valid_for_kubernetes(
    rendered: Rendered, kubernetes_validate: ModuleType, kube_version: str
) -> None:
    checked = 0
    for m in rendered.manifests:
        if m["kind"] in CRD_KINDS:
            continue  # no Kubernetes schema: test_inference_pool_matches_the_gie_crd
        # strict: a field the schema does not know is an error, not ignored
        kubernetes_validate.validate(m, kube_version, strict=True)
        checked += 1
    assert checked >= 8


def test_inference_pool_matches_the_gie_crd(helm: ModuleType) -> None:
    jsonschema = import_tool("jsonschema")
    pools = _rendered("all-on").of_kind("InferencePool")
    assert {p["metadata"]["name"] for p in pools} == {
        "tt-tectonic-pool-us-east",
        "tt-tectonic-pool-us-west",
    }
    services = {s["metadata"]["name"]: s for s in _rendered("all-on").of_kind("Service")}
    for pool in pools:
        assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
        spec = pool["spec"]
        jsonschema.validate(spec, INFERENCE_POOL_SPEC)
        ref = spec["endpointPickerRef"]
        # The CRD's CEL rule: "port is required when kind is 'Service' or unspecified".
        assert ref.get("kind", "Service") != "Service" or "port" in ref
        picker = services[ref["name"]]  # the chart's picker Service, on that port
        assert ref["port"]["number"] in [p["port"] for p in picker["spec"]["ports"]]
        assert ref["failureMode"] == "FailOpen"
        assert spec["selector"]["matchLabels"]["tectonic.io/pool-state"] == "active"
    bad = json.loads(json.dumps(pools[0]["spec"]))
    bad["endpointPickerRef"]["failureMode"] = "FailSoft"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, INFERENCE_POOL_SPEC)


# ---- bad values -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"controlPlane": {"replicas": "two"}}, "/controlPlane/replicas"),
        ({"controlPlane": {"replicas": 0}}, "/controlPlane/replicas"),
        ({"regions": [{"discovery": {"service": "vllm"}}]}, "/regions/0': missing property 'name'"),
        (
            {"topology": {"regions": [{"zone": "us", "capacity_rps": 100}]}},
            "/topology/regions/0': missing property 'name'",
        ),
        (
            {"topology": {"regions": [{"name": "US East", "zone": "us", "capacity_rps": 1}]}},
            "/topology/regions/0/name",
        ),
        ({"topology": {"etcd": {"endpoints": ["x:1"]}, "regions": []}}, "/topology/etcd"),
        ({"etcd": {"mode": "embedded"}}, "/etcd/mode"),
        ({"etcd": {"bundled": {"quotaBackendBytes": 1000}}}, "/etcd/bundled/quotaBackendBytes"),
        ({"inferencePool": {"failureMode": "FailSoft"}}, "/inferencePool/failureMode"),
        (
            {"regions": [{"name": "us-east", "pool": {"workload": "vllm"}}]},
            "/regions/0/pool/workload",
        ),
        (
            {
                "regions": [
                    {"name": "us-east", "pool": {"settings": {"launcher": {"kind": "vllm"}}}}
                ]
            },
            "/regions/0/pool/settings/launcher",
        ),
        ({"controlplane": {"replicas": 2}}, "additional properties 'controlplane' not allowed"),
    ],
)
def test_a_bad_value_fails_rendering_naming_it(
    helm: ModuleType, values: dict[str, Any], field: str
) -> None:
    assert field in render_error(helm, values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"regions": [{"name": "eu-west"}]}, 'regions[0].name: "eu-west" is not a region'),
        (
            {
                "topology": {
                    "regions": [
                        {"name": "us-east", "zone": "us", "capacity_rps": 1},
                        {"name": "us-west", "zone": "us", "capacity_rps": 1},
                    ]
                }
            },
            'topology.regions[1].agent: region "us-west" runs in another cluster',
        ),
        ({"regions": [{"name": "us-east"}]}, "regions[us-east].discovery.service"),
        ({"modelServer": {"enabled": True}}, "modelServer.model"),
        ({"inferencePool": {"enabled": True}}, "set picker.enabled too"),
        (
            {"controlPlane": {"enabled": False}},
            "controlPlane.addresses: set it",
        ),
    ],
)
def test_values_that_contradict_each_other_fail_naming_the_field(
    helm: ModuleType, values: dict[str, Any], message: str
) -> None:
    assert message in render_error(helm, values)
