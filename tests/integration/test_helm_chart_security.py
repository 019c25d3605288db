"""The Helm chart's (deploy/helm/tectonic) permissions and hardening, and the
Dockerfile, checked on a machine without a cluster, a container daemon or a registry.

RBAC is namespaced and least-privilege (the agent's Role, the drills' opt-in Role, and
exactly the calls regions/kube and chaos/kube make); the model server is reached only
by the agent and the data plane; every container runs non-root, read-only, without
capabilities; checkov scans every rendered manifest and the Dockerfile, hadolint lints
the Dockerfile, and the Dockerfile builds a non-root image from a wheel.

What cannot run here, and so is not checked: the image build, an API server (RBAC,
admission, CEL rules), the kubelet (probes), a network plugin (NetworkPolicy), Chaos Mesh,
and GPU memory (docs/kubernetes.md).

Checkov without a Prisma Cloud key reports no severities (every finding's severity is
null), so no finding can be told to be LOW: every failed check fails the test unless the
template skips it with a reason (a ``checkov.io/skipN: CHECK=reason`` annotation, or
``# checkov:skip=CHECK: reason`` in the Dockerfile).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from chaos.kube.service import TargetConfig
from tests.integration.helm_chart_helpers import (
    NAMESPACE,
    REPO,
    VALUE_SETS,
    Rendered,
    _rendered,
    helm,
    manifests_of,
    render,
    rendered,
    tool_binary,
)

# The harness's fixtures (helm_chart_helpers.py), imported for pytest to find them.
FIXTURES = (helm, rendered)

DOCKERFILE = REPO / "Dockerfile"


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
POOL = {  # + the workload's scale, by resourceNames
    ("", "pods", "patch"),
    ("autoscaling", "horizontalpodautoscalers", "list"),  # no HPA fights the pool
    ("keda.sh", "scaledobjects", "list"),  # nor a KEDA ScaledObject
}
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
