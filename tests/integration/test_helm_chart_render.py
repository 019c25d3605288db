"""The Helm chart (deploy/helm/tectonic) rendered and linted, and its manifests checked
against the schemas, on a machine without a cluster.

Helm's own Go SDK renders the chart with its default values and the value sets in its
ci/ folder, and lints it; every rendered manifest is validated against the Kubernetes
JSON schemas (kubernetes-validate) of the chart's oldest Kubernetes and the newest the
package ships; the InferencePool, a CRD those schemas lack, against the Gateway API
Inference Extension's own CRD schema (transcribed below), and KEDA's ScaledObject against
KEDA's CRD (vendored in tests/integration/crds/keda/); bad values fail rendering
with a message naming the field (values.schema.json and the templates' checks).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

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
    manifests_of,
    render,
    render_error,
    rendered,
)

# The harness's fixtures (helm_chart_helpers.py), imported for pytest to find them.
FIXTURES = (helm, kubernetes_validate, rendered)

# The chart's kubeVersion floor (Chart.yaml) and the newest schemas kubernetes-validate
# 1.37 ships: a manifest valid for both is valid for the versions between.
KUBE_VERSIONS = ("1.30.0", "1.37.0")
# Kinds whose schemas are CRDs, not Kubernetes': kubernetes-validate has none for them.
CRD_KINDS = {"InferencePool", "ScaledObject", "ServiceMonitor", "PodMonitor", "PrometheusRule"}
KEDA_CRD = Path(__file__).parent / "crds" / "keda" / "keda.sh_scaledobjects.yaml"

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
    expected = {  # the gateway is on by default (ci/external-etcd-values.yaml turns it off)
        "default": {"controlplane", "agent", "gateway"},
        "all-on": {"controlplane", "agent", "gateway", "picker", "drills", "model-server", "etcd"},
        "external-etcd": {"agent", "picker", "drills"},
        "pools": {"controlplane", "agent", "gateway", "picker", "model-server", "etcd"},
        "advisory": {"controlplane", "agent", "gateway", "model-server"},
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
            continue  # no Kubernetes schema: the tests of each CRD below
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


def strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists its
    properties and takes no others: the API server prunes unknown fields silently, so a
    misspelt field would vanish there instead of failing."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def keda_schema() -> dict[str, Any]:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "ScaledObject"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = strict(version["schema"]["openAPIV3Schema"])
    return schema


def check_scaled_object(jsonschema: ModuleType, so: dict[str, Any]) -> dict[str, Any]:
    """Valid for KEDA's CRD, its CEL rule included; returns the spec."""
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    jsonschema.validate(so, keda_schema())
    spec: dict[str, Any] = so["spec"]
    # The CRD's CEL rule: "minReplicaCount must be less than or equal to maxReplicaCount".
    assert spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100)
    return spec


def agent_args(rendered: Rendered, unit_name: str) -> dict[str, str]:
    deployment = rendered.one("Deployment", f"tt-tectonic-agent-{unit_name}")
    (agent,) = deployment["spec"]["template"]["spec"]["containers"]
    return {flag: value for flag, _, value in (a.partition("=") for a in agent["args"])}


def test_scaled_objects_follow_the_agents_workload_and_unit() -> None:
    jsonschema = import_tool("jsonschema")
    advisory = _rendered("advisory")
    objects = {so["metadata"]["name"]: so for so in advisory.of_kind("ScaledObject")}
    # one per unit whose pool says keda.enabled: not us-west's code pool (no warm pool)
    assert set(objects) == {"tt-tectonic-keda-us-east", "tt-tectonic-keda-us-west-chat"}
    cp = advisory.one("Service", "tt-tectonic-controlplane")
    (grpc,) = [p["port"] for p in cp["spec"]["ports"] if p["name"] == "grpc"]
    for name, unit in (("us-east", "us-east"), ("us-west-chat", "us-west.chat")):
        so = objects[f"tt-tectonic-keda-{name}"]
        spec = check_scaled_object(jsonschema, so)
        args = agent_args(advisory, name)
        assert "--pool-advisory" in args  # the pool scales nothing: KEDA does
        kind, workload = args["--kube-workload"].split("/")
        assert spec["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": {"deployment": "Deployment", "statefulset": "StatefulSet"}[kind],
            "name": workload,
        }
        assert so["metadata"]["namespace"] == args["--kube-namespace"]
        (trigger,) = spec["triggers"]
        assert (trigger["type"], trigger["metricType"]) == ("external", "AverageValue")
        assert args["--region"] == unit
        assert trigger["metadata"] == {
            "scalerAddress": f"{cp['metadata']['name']}.{NAMESPACE}.svc:{grpc}",
            "unit": unit,
        }
        # Advisory: the agent reads the workload's scale and never writes it.
        role = advisory.one("Role", f"tt-tectonic-agent-{name}")
        assert [r["verbs"] for r in role["rules"] if r["apiGroups"] == ["apps"]] == [["get"]]
    east = objects["tt-tectonic-keda-us-east"]["spec"]
    chat = objects["tt-tectonic-keda-us-west-chat"]["spec"]
    assert (east["minReplicaCount"], east["maxReplicaCount"], east["pollingInterval"]) == (2, 8, 10)
    assert (chat["minReplicaCount"], chat["maxReplicaCount"], chat["pollingInterval"]) == (
        1,
        16,
        15,
    )
    assert "--pool-advisory" not in agent_args(advisory, "us-west-code")
    for name in sorted(VALUE_SETS):  # advisory is opt-in: nowhere else
        if name != "advisory":
            assert _rendered(name).of_kind("ScaledObject") == []
            assert all("--pool-advisory" not in c["args"] for _, c in _rendered(name).containers())
    bad = json.loads(json.dumps(objects["tt-tectonic-keda-us-east"]))
    bad["spec"]["scaleTargetRef"]["nmae"] = "vllm"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, keda_schema())


ADVISORY_POOL = {"enabled": True, "advisory": True, "keda": {"enabled": True}}
SCALING = {"scaling": {"horizon_s": 30}}


def keda_values(pool: dict[str, Any], **more: Any) -> dict[str, Any]:
    """One region of the default topology, its platform's StatefulSet in another
    namespace, with ``pool``; ``more`` merged in at the top (topology: over the default's)."""
    topology = {"regions": [{"name": "us-east", "zone": "us", "capacity_rps": 100}], **SCALING}
    region = {"name": "us-east", "discovery": {"service": "vllm", "namespace": "models"}}
    values: dict[str, Any] = {
        "topology": {**topology, **more.pop("topology", {})},
        "regions": [
            {**region, "pool": {"workload": "statefulset/vllm", "active": 1, "warm": 1, **pool}}
        ],
    }
    return {**values, **more}


def test_a_scaled_object_of_a_statefulset_elsewhere_and_a_remote_control_plane(
    helm: ModuleType,
) -> None:
    jsonschema = import_tool("jsonschema")
    pool = {**ADVISORY_POOL, "keda": {"enabled": True, "minReplicas": 0}}
    values = keda_values(pool, controlPlane={"enabled": False, "addresses": "cp.example:50051"})
    (so,) = [m for m in manifests_of(render(helm, values)) if m["kind"] == "ScaledObject"]
    spec = check_scaled_object(jsonschema, so)
    assert so["metadata"]["namespace"] == "models"
    assert spec["scaleTargetRef"]["kind"] == "StatefulSet"
    assert spec["scaleTargetRef"]["name"] == "vllm"
    assert spec["minReplicaCount"] == 0  # kept, not taken for "unset"
    assert spec["triggers"][0]["metadata"] == {
        "scalerAddress": "cp.example:50051",
        "unit": "us-east",
    }


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            keda_values({"enabled": True, "keda": {"enabled": True}}),
            "regions[us-east].pool.keda.enabled: KEDA would fight the warm pool",
        ),
        (
            keda_values({"advisory": True, "keda": {"enabled": True}}),
            "set pool.enabled and pool.advisory too",
        ),
        (
            keda_values(ADVISORY_POOL, topology={"scaling": None}),
            "only with topology.scaling set",
        ),
        (
            keda_values(
                ADVISORY_POOL,
                topology={"security": {"tls": {"ca": "/c", "cert": "/t", "key": "/k"}}},
            ),
            "topology.security (tls or tokens) refuses",
        ),
        (
            keda_values(
                ADVISORY_POOL, controlPlane={"enabled": False, "addresses": "a:50051,b:50051"}
            ),
            "controlPlane.addresses lists 2",
        ),
        (
            keda_values({**ADVISORY_POOL, "keda": {"enabled": True, "minReplicas": 20}}),
            "minReplicas (20) must be at most maxReplicas (16)",
        ),
    ],
)
def test_keda_without_what_it_needs_fails_saying_what(
    helm: ModuleType, values: dict[str, Any], message: str
) -> None:
    assert message in render_error(helm, values)


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
        (
            {"regions": [{"name": "us-east", "pool": {"keda": {"maxReplicas": 0}}}]},
            "/regions/0/pool/keda/maxReplicas",
        ),
        (
            {"regions": [{"name": "us-east", "pool": {"advisory": "yes"}}]},
            "/regions/0/pool/advisory",
        ),
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
