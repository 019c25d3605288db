"""The Helm chart's defaults (deploy/helm/tectonic), checked on a machine without a
cluster: what an install with no values, or with only the one value the chart asks for,
gets; the ``helm test`` Pods; the pod metadata and scheduling options every workload
takes; the gateway's and picker's HorizontalPodAutoscalers.

An install with no values fails, asking for etcd's endpoints (or ``etcd.mode: bundled``):
each cluster of a deployment must share one etcd, so the chart does not make one per
release by default. With the endpoints (the "default" value set of
helm_chart_helpers.py) or the bundled etcd, it runs a data plane: the gateway, which
forwards to the Service its region's agent discovers. A region's gateway with nothing to
forward to fails the render, naming what to set.

The ``helm test`` Pods run a Python script in the Tectonic image; here that script runs
against a real control plane, agent and vLLM simulator on a real etcd, with the
environment the Pods get, and fails as it should against a region that is not there.
What only a cluster can tell (that the Pods start, reach the Services and pass the
NetworkPolicies) is not checked.
"""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.ports import reserved_port
from chaos.lab.procs import Proc, start_agent, start_controlplane, start_simulator
from controlplane.kernel.security import hash_token, new_token
from tests.integration.helm_chart_helpers import (
    CHART,
    NAMESPACE,
    RELEASE,
    REPO,
    Rendered,
    _rendered,
    helm,
    kubernetes_validate,
    load_values,
    manifests_of,
    render,
    render_error,
    rendered,
    topology_of,
)

# The harness's fixtures (helm_chart_helpers.py), imported for pytest to find them.
FIXTURES = (helm, kubernetes_validate, rendered)

ETCD_REQUIRED = (
    "etcd.external.endpoints is required (host:port of your etcd members), "
    "or set etcd.mode: bundled"
)
KUBE_VERSIONS = ("1.30.0", "1.37.0")  # as test_helm_chart_render.py's
TEST_PODS = {f"{RELEASE}-tectonic-test-controlplane", f"{RELEASE}-tectonic-test-region-healthy"}
ALL_ON = CHART / "ci" / "all-on-values.yaml"


def workloads(rendered: Rendered) -> list[dict[str, Any]]:
    return rendered.of_kind("Deployment") + rendered.of_kind("StatefulSet")


def component(m: dict[str, Any]) -> str:
    label: str = m["metadata"]["labels"]["app.kubernetes.io/component"]
    return label


def args_of(workload: dict[str, Any]) -> dict[str, str]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return {flag: value for flag, _, value in (a.partition("=") for a in container["args"])}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


# ---- an install without values, or with only etcd ---------------------------------------
def test_an_install_without_values_fails_asking_for_the_etcd_endpoints(helm: ModuleType) -> None:
    with pytest.raises(helm.HelmError) as caught:
        render(helm, {}, required=False)
    assert ETCD_REQUIRED in str(caught.value)
    # an empty list is no answer either, and a bad endpoint is named by the schema
    assert ETCD_REQUIRED in render_error(helm, {"etcd": {"external": {"endpoints": []}}})
    bad = render_error(helm, {"etcd": {"external": {"endpoints": ["etcd"]}}})
    assert "/etcd/external/endpoints/0" in bad


def test_the_bundled_etcd_alone_makes_a_complete_install(
    helm: ModuleType, kubernetes_validate: ModuleType
) -> None:
    values = {"etcd": {"mode": "bundled"}}
    bundled = Rendered("bundled", values, manifests_of(render(helm, values, required=False)))
    assert {component(m) for m in workloads(bundled)} == {
        "controlplane",
        "agent",
        "gateway",
        "etcd",
    }
    etcd = bundled.one("StatefulSet", f"{RELEASE}-tectonic-etcd")
    assert etcd["spec"]["replicas"] == 1
    assert topology_of(bundled).etcd.endpoints == (
        f"{RELEASE}-tectonic-etcd-0.{RELEASE}-tectonic-etcd.{NAMESPACE}.svc:2379",
    )
    assert {p["metadata"]["name"] for p in bundled.of_kind("Pod")} == TEST_PODS
    for kube_version in KUBE_VERSIONS:
        for m in bundled.manifests:
            kubernetes_validate.validate(m, kube_version, strict=True)


def test_the_default_gateway_forwards_to_the_service_its_agent_discovers() -> None:
    default = _rendered("default")
    assert {component(m) for m in workloads(default)} == {"controlplane", "agent", "gateway"}
    gateway = default.one("Deployment", f"{RELEASE}-tectonic-gateway-us-east")
    assert gateway["spec"]["replicas"] == 2
    assert args_of(gateway)["--region"] == "us-east"
    service = default.one("Service", f"{RELEASE}-tectonic-gateway-us-east")
    assert [p["port"] for p in service["spec"]["ports"]] == [8080]
    agent = args_of(default.one("Deployment", f"{RELEASE}-tectonic-agent-us-east"))
    discovered = f"http://{agent['--kube-service']}.{agent['--kube-namespace']}.svc:8000"
    assert discovered == f"http://vllm.{NAMESPACE}.svc:8000"
    assert topology_of(default).region("us-east").replicas == (discovered,)
    assert default.of_kind("HorizontalPodAutoscaler") == []


ONE_REGION = [{"name": "us-east", "zone": "us", "capacity_rps": 100}]
POOLS = [
    {
        "name": "us-east",
        "zone": "us",
        "pools": [{"name": "chat", "models": ["llama"], "capacity_rps": 10}],
    }
]


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"regions": [{"name": "us-east", "discovery": {"service": "vllm"}}]}, "regions[us-east]"),
        (
            {"regions": [{"name": "us-east", "discovery": {"service": "vllm", "port": 0}}]},
            "regions[us-east]",
        ),
        (
            {
                "topology": {"regions": POOLS},
                "regions": [
                    {"name": "us-east", "pools": {"chat": {"discovery": {"service": "chat"}}}}
                ],
            },
            "regions[us-east].pools.chat",
        ),
    ],
)
def test_a_gateway_with_nothing_to_forward_to_fails_naming_what_to_set(
    helm: ModuleType, values: dict[str, Any], field: str
) -> None:
    error = render_error(helm, values)
    assert "gateway.enabled: the gateway has nothing to forward" in error
    for option in (f"{field}.discovery.port", f"{field}.pool.enabled", "gateway.enabled: false"):
        assert option in error


@pytest.mark.parametrize(
    ("values", "replicas"),
    [
        (  # the warm pool publishes the ACTIVE pods: nothing static
            {
                "regions": [
                    {
                        "name": "us-east",
                        "discovery": {"service": "vllm"},
                        "pool": {"enabled": True, "workload": "deployment/vllm"},
                    }
                ]
            },
            (),
        ),
        (  # the topology's own replicas are kept
            {
                "topology": {"regions": [{**ONE_REGION[0], "replicas": ["http://10.0.0.1:8000"]}]},
                "regions": [{"name": "us-east", "discovery": {"service": "vllm"}}],
            },
            ("http://10.0.0.1:8000",),
        ),
        (  # another namespace and port
            {
                "regions": [
                    {
                        "name": "us-east",
                        "discovery": {"service": "vllm", "namespace": "models", "port": 8080},
                    }
                ]
            },
            ("http://vllm.models.svc:8080",),
        ),
        (  # a model pool's own discovery
            {
                "topology": {"regions": POOLS},
                "regions": [
                    {
                        "name": "us-east",
                        "pools": {"chat": {"discovery": {"service": "chat", "port": 8000}}},
                    }
                ],
            },
            (f"http://chat.{NAMESPACE}.svc:8000",),
        ),
    ],
)
def test_a_gateway_forwards_to_what_its_region_gives(
    helm: ModuleType, values: dict[str, Any], replicas: tuple[str, ...]
) -> None:
    r = Rendered("case", values, manifests_of(render(helm, values)))
    assert r.one("Deployment", f"{RELEASE}-tectonic-gateway-us-east")
    topology = topology_of(r)
    (unit,) = topology.units_of("us-east")
    assert topology.region(unit).replicas == replicas


def test_without_the_gateway_nothing_needs_replicas(helm: ModuleType) -> None:
    values = {
        "regions": [{"name": "us-east", "discovery": {"service": "vllm"}}],
        "gateway": {"enabled": False},
    }
    r = Rendered("no-gateway", values, manifests_of(render(helm, values)))
    assert {component(m) for m in workloads(r)} == {"controlplane", "agent"}
    assert topology_of(r).region("us-east").replicas == ()


# ---- helm test ----------------------------------------------------------------------------
def hook_pods(rendered: Rendered) -> dict[str, dict[str, Any]]:
    """The ``helm test`` Pods by name: both of them."""
    pods = {p["metadata"]["name"]: p for p in rendered.of_kind("Pod")}
    assert set(pods) == TEST_PODS
    return pods


def test_the_helm_test_pods_are_hooks_that_check_the_control_plane_and_a_region(
    rendered: Rendered,
) -> None:
    pods = hook_pods(rendered)
    agents = [m for m in workloads(rendered) if component(m) == "agent"]
    control_plane = {args_of(a)["--control-plane"] for a in agents}
    units = {args_of(a)["--region"] for a in agents}
    for name, pod in pods.items():
        meta = pod["metadata"]
        assert meta["annotations"]["helm.sh/hook"] == "test"
        assert meta["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"
        assert meta["namespace"] == NAMESPACE
        spec = pod["spec"]
        assert spec["restartPolicy"] == "Never"
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        (container,) = spec["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["limits"]["memory"]
        assert container["command"] == ["python", "-c"]
        (script,) = container["args"]
        compile(script, name, "exec")  # valid Python
        assert '["failoverctl", "status", "--json"]' in script
        env = env_of(container)
        # failoverctl reaches the control plane where the agents report
        assert {env["TECTONIC_SERVER"]} == control_plane
        assert set(env["UNITS"].split(",")) == units
        assert env["CHECK"] == ("controlplane" if name.endswith("controlplane") else "region")
    # The control-plane check also asks its HTTP /readyz, where this release runs one.
    env = env_of(pods[f"{RELEASE}-tectonic-test-controlplane"]["spec"]["containers"][0])
    cps = [m for m in workloads(rendered) if component(m) == "controlplane"]
    if not cps:
        assert "READYZ_URL" not in env
        return
    (cp,) = cps
    service = rendered.one("Service", f"{RELEASE}-tectonic-controlplane")
    (http,) = [p for p in service["spec"]["ports"] if p["name"] == "http"]
    assert env["READYZ_URL"] == (
        f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{http['port']}/readyz"
    )
    (container,) = cp["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args_of(cp)["--http-listen"] == f"0.0.0.0:{ports[http['targetPort']]}"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # The region check's script looks for HEALTHY in what failoverctl prints.
    script = pods[f"{RELEASE}-tectonic-test-region-healthy"]["spec"]["containers"][0]["args"][0]
    assert '"HEALTHY"' in script
    # They admit no traffic (networkPolicy.enabled).
    policy = rendered.one("NetworkPolicy", f"{RELEASE}-tectonic-test")
    assert policy["spec"]["ingress"] == []
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_the_helm_test_pods_use_the_topologys_tls_files_and_token() -> None:
    all_on = _rendered("all-on")
    security = all_on.values["topology"]["security"]
    mounts = {m["mountPath"] for m in all_on.values["extraSecretMounts"]}
    for pod in hook_pods(all_on).values():
        (container,) = pod["spec"]["containers"]
        env = env_of(container)
        files = {
            "TECTONIC_CA": security["tls"]["ca"],
            "TECTONIC_CERT": security["tls"]["cert"],
            "TECTONIC_KEY": security["tls"]["key"],
            "TOKEN_FILE": security["token_file"],
        }
        assert {k: env[k] for k in files} == files
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        assert mounts <= mounted
        for path in files.values():  # each file in a mounted Secret
            assert any(path.startswith(m + "/") for m in mounts), path
        assert env["TECTONIC_ACTOR"] == "helm-test"  # tests.extraEnv
    for pod in hook_pods(_rendered("default")).values():
        env = env_of(pod["spec"]["containers"][0])
        assert not {"TECTONIC_CA", "TECTONIC_CERT", "TECTONIC_KEY", "TOKEN_FILE"} & set(env)


def test_tests_enabled_false_renders_no_hook_pods(helm: ModuleType) -> None:
    docs = manifests_of(render(helm, {"tests": {"enabled": False}}))
    assert [d for d in docs if d["kind"] == "Pod"] == []
    assert f"{RELEASE}-tectonic-test" not in {d["metadata"]["name"] for d in docs}


def run_check(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The Pod's script, with failoverctl from this environment on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return subprocess.run(
        [sys.executable, "-c", script],
        env={"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), **env},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


async def test_the_helm_test_checks_pass_against_a_running_control_plane(
    etcd: EtcdServer, cluster_name: str, tmp_path: Path
) -> None:
    """The scripts the Pods run, with the environment they get (the addresses turned
    into this machine's), against a control plane, an agent and a simulated vLLM."""
    pods = hook_pods(_rendered("default"))
    scripts = {env_of(p["spec"]["containers"][0])["CHECK"]: p for p in pods.values()}
    assert set(scripts) == {"controlplane", "region"}
    taken: set[int] = set()  # below the ephemeral range: no other test's connection takes them
    cp_port, http_port, agent_port = (reserved_port(taken) for _ in range(3))
    procs: list[Proc] = []
    try:
        sim = await asyncio.to_thread(start_simulator)
        procs.append(sim)
        topology = {
            "cluster": cluster_name,
            "etcd": {"endpoints": list(etcd.endpoints)},
            "regions": [{**ONE_REGION[0], "agent": f"127.0.0.1:{agent_port}"}],
            "timing": {
                "probe_interval_s": 0.2,
                "success_threshold": 2,
                "quorum": 1,
                "loop_period_s": 0.2,
                "retry_timeout_s": 0.5,
                "lease_ttl_s": 3,
            },
        }
        path = tmp_path / "topology.yaml"
        path.write_text(yaml.safe_dump(topology))
        cp = await asyncio.to_thread(
            start_controlplane,
            path,
            "cp-1",
            listen=f"127.0.0.1:{cp_port}",
            extra_args=("--http-listen", f"127.0.0.1:{http_port}"),
        )
        procs.append(cp)
        agent = await asyncio.to_thread(
            start_agent,
            region="us-east",
            control_planes=[cp.url],
            replicas=[sim.url],
            listen=f"127.0.0.1:{agent_port}",
        )
        procs.append(agent)
        local = {
            "TECTONIC_SERVER": cp.url,
            "READYZ_URL": f"http://127.0.0.1:{http_port}/readyz",
        }
        results: dict[str, subprocess.CompletedProcess[str]] = {}
        for check, pod in scripts.items():
            (container,) = pod["spec"]["containers"]
            env = {**env_of(container), "WAIT_S": "60"}
            env.update({k: v for k, v in local.items() if k in env})
            results[check] = await asyncio.to_thread(run_check, container["args"][0], env)
        for check, done in results.items():
            assert done.returncode == 0, f"{check}: {done.stdout}\n{done.stderr}"
            assert done.stdout.rstrip().endswith("OK"), done.stdout
        assert "control plane answers: leader cp-1" in results["controlplane"].stdout
        assert "us-east NORMAL/HEALTHY" in results["region"].stdout

        # A region that is not there never turns HEALTHY: the check fails, saying so.
        (region,) = scripts["region"]["spec"]["containers"]
        env = {**env_of(region), "TECTONIC_SERVER": cp.url, "WAIT_S": "0", "UNITS": "eu"}
        done = await asyncio.to_thread(run_check, region["args"][0], env)
        assert done.returncode == 1
        assert "FAILED after 0 s: none of eu is HEALTHY yet" in done.stderr

        # A control plane that does not answer: the check fails with failoverctl's reason.
        cp.kill()
        (cp_check,) = scripts["controlplane"]["spec"]["containers"]
        env = {**env_of(cp_check), "TECTONIC_SERVER": cp.url, "WAIT_S": "0"}
        del env["READYZ_URL"]  # (a remote control plane's: gRPC only)
        done = await asyncio.to_thread(run_check, cp_check["args"][0], env)
        assert done.returncode == 1
        assert "FAILED after 0 s: failoverctl status: exit 3" in done.stderr
    finally:
        for p in reversed(procs):
            p.kill()


# ---- pod annotations, priority classes, topology spread -----------------------------------
# The value of each component (its values key and what it is given under), by label.
COMPONENTS = {
    "controlplane": ("controlPlane",),
    "agent": ("agent",),
    "gateway": ("gateway",),
    "picker": ("picker",),
    "drills": ("drills",),
    "model-server": ("modelServer",),
    "etcd": ("etcd", "bundled"),
}


def pod_specs(rendered: Rendered) -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (component, pod template) of every Deployment and StatefulSet."""
    return {m["metadata"]["name"]: (component(m), m) for m in workloads(rendered)}


def test_pod_annotations_priority_and_spread_reach_every_workload() -> None:
    all_on = _rendered("all-on")
    values = all_on.values
    specs = pod_specs(all_on)
    assert {c for c, _ in specs.values()} == set(COMPONENTS)
    for name, (comp, workload) in specs.items():
        template = workload["spec"]["template"]
        annotations = template["metadata"].get("annotations", {})
        spec = template["spec"]
        own = values
        for key in COMPONENTS[comp]:
            own = own.get(key, {})
        expected = {**values["podAnnotations"], **own.get("podAnnotations", {})}
        assert expected.items() <= annotations.items(), name
        if comp not in ("etcd", "model-server"):  # Tectonic's own keep their checksum
            assert "checksum/topology" in annotations, name
        priority = own.get("priorityClassName") or values["priorityClassName"]
        assert spec["priorityClassName"] == priority, name
        constraints = own.get("topologySpreadConstraints") or values["topologySpreadConstraints"]
        rendered_constraints = spec["topologySpreadConstraints"]
        assert len(rendered_constraints) == len(constraints), name
        for given, got in zip(constraints, rendered_constraints, strict=True):
            assert {k: got[k] for k in given} == given, name
            # without a labelSelector of its own: the pod's own selector, which spreads
            # the component's (and region's) pods by themselves
            selector = workload["spec"]["selector"]["matchLabels"]
            assert got["labelSelector"] == {"matchLabels": selector}, name
    assert specs[f"{RELEASE}-tectonic-etcd"][1]["spec"]["template"]["spec"][
        "priorityClassName"
    ] == ("tectonic-store")
    # The helm test Pods: the global annotations and priority class.
    for pod in hook_pods(all_on).values():
        assert values["podAnnotations"].items() <= pod["metadata"]["annotations"].items()
        assert pod["spec"]["priorityClassName"] == values["priorityClassName"]


def test_by_default_pods_get_no_priority_and_no_spread() -> None:
    for name in ("default", "pools", "advisory", "external-etcd"):
        for _, (_, workload) in pod_specs(_rendered(name)).items():
            spec = workload["spec"]["template"]["spec"]
            assert "priorityClassName" not in spec
            assert "topologySpreadConstraints" not in spec
            annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
            assert set(annotations) <= {"checksum/topology"}


@pytest.mark.parametrize("comp", sorted(COMPONENTS))
def test_a_components_own_settings_win_over_the_global_ones(helm: ModuleType, comp: str) -> None:
    values = copy.deepcopy(load_values(ALL_ON))
    target = values
    for key in COMPONENTS[comp]:
        target = target.setdefault(key, {})
    spread = {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname"}
    target.update(
        podAnnotations={"example.com/team": comp, "example.com/own": "yes"},
        priorityClassName="own-class",
        topologySpreadConstraints=[{**spread, "whenUnsatisfiable": "DoNotSchedule"}],
    )
    r = Rendered(comp, values, manifests_of(render(helm, values)))
    seen = 0
    for name, (c, workload) in pod_specs(r).items():
        template = workload["spec"]["template"]
        annotations = template["metadata"].get("annotations", {})
        spec = template["spec"]
        if c == comp:
            seen += 1
            assert annotations["example.com/team"] == comp
            assert annotations["example.com/own"] == "yes"
            assert annotations["sidecar.istio.io/inject"] == "false"  # the global, merged
            assert spec["priorityClassName"] == "own-class"
            (constraint,) = spec["topologySpreadConstraints"]
            assert constraint["topologyKey"] == "kubernetes.io/hostname"
        else:
            assert "example.com/own" not in annotations, name
            assert spec["priorityClassName"] != "own-class", name
    assert seen >= 1


# ---- autoscaling ---------------------------------------------------------------------------
def test_autoscaling_gives_each_deployment_an_hpa_and_takes_its_replicas(
    kubernetes_validate: ModuleType,
) -> None:
    all_on = _rendered("all-on")
    hpas = {h["metadata"]["name"]: h for h in all_on.of_kind("HorizontalPodAutoscaler")}
    scaled = {
        m["metadata"]["name"]: m
        for m in all_on.of_kind("Deployment")
        if component(m) in ("gateway", "picker")
    }
    assert (
        set(hpas)
        == set(scaled)
        == {
            f"{RELEASE}-tectonic-{kind}-{region}"
            for kind in ("gateway", "epp")
            for region in ("us-east", "us-west")
        }
    )
    settings = {
        "gateway": all_on.values["gateway"]["autoscaling"],
        "picker": {**all_on.values["picker"]["autoscaling"], "targetCPUUtilizationPercentage": 70},
    }
    for name, hpa in hpas.items():
        deployment = scaled[name]
        assert "replicas" not in deployment["spec"]  # the HPA owns them
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["metadata"]["namespace"] == deployment["metadata"]["namespace"]
        spec = hpa["spec"]
        assert spec["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name,
        }
        want = settings[component(deployment)]
        assert (spec["minReplicas"], spec["maxReplicas"]) == (
            want["minReplicas"],
            want["maxReplicas"],
        )
        (metric,) = spec["metrics"]
        assert metric["resource"]["name"] == "cpu"
        assert metric["resource"]["target"] == {
            "type": "Utilization",
            "averageUtilization": want["targetCPUUtilizationPercentage"],
        }
        # Utilization is of the request: every container of the pods has one.
        for c in deployment["spec"]["template"]["spec"]["containers"]:
            assert c["resources"]["requests"]["cpu"]
        for kube_version in KUBE_VERSIONS:
            kubernetes_validate.validate(hpa, kube_version, strict=True)
    # Off (the default): replicas, no HPA.
    for name in ("default", "pools"):
        r = _rendered(name)
        assert r.of_kind("HorizontalPodAutoscaler") == []
        for m in r.of_kind("Deployment"):
            if component(m) in ("gateway", "picker"):
                assert m["spec"]["replicas"] == 2


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"gateway": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}}},
            "gateway.autoscaling.minReplicas (5) must be at most maxReplicas (3)",
        ),
        (
            {
                "picker": {
                    "enabled": True,
                    "autoscaling": {"enabled": True},
                    "resources": {"requests": {"cpu": None}},
                }
            },
            "picker.autoscaling: the HorizontalPodAutoscaler scales on CPU utilization of the "
            "request; set picker.resources.requests.cpu",
        ),
        (
            {"gateway": {"autoscaling": {"targetCPUUtilizationPercentage": "70%"}}},
            "/gateway/autoscaling/targetCPUUtilizationPercentage",
        ),
        (
            {"picker": {"autoscaling": {"enabeld": True}}},
            "additional properties 'enabeld' not allowed",
        ),
        ({"gateway": {"autoscaling": {"maxReplicas": 0}}}, "/gateway/autoscaling/maxReplicas"),
        ({"topologySpreadConstraints": [{"maxSkew": 1}]}, "/topologySpreadConstraints/0"),
        ({"agent": {"priorityClassName": "Not A Name"}}, "/agent/priorityClassName"),
        ({"drills": {"podAnnotations": {"a": 1}}}, "/drills/podAnnotations/a"),
        (
            {"etcd": {"bundled": {"topologySpreadConstraints": [{"maxSkew": 0}]}}},
            "/etcd/bundled/topologySpreadConstraints/0",
        ),
        ({"regions": [{"name": "us-east", "discovery": {"port": 70000}}]}, "discovery/port"),
        ({"tests": {"waitSeconds": -1}}, "/tests/waitSeconds"),
    ],
)
def test_bad_new_values_fail_naming_them(
    helm: ModuleType, values: dict[str, Any], message: str
) -> None:
    assert message in render_error(helm, values)


def test_the_control_plane_listens_open_only_without_tokens(helm: ModuleType) -> None:
    """Without the topology's tokens nothing checks one, so the chart says so with
    --insecure-listen-any (the control plane refuses a pod address otherwise); with
    tokens the HTTP API checks them and the flag is gone."""
    name = f"{RELEASE}-tectonic-controlplane"
    assert "--insecure-listen-any" in args_of(_rendered("default").one("Deployment", name))
    assert "--insecure-listen-any" in args_of(_rendered("all-on").one("Deployment", name))
    values = load_values(ALL_ON)
    values["topology"]["security"]["tokens"] = [
        {"name": "oncall", "role": "operator", "hash": hash_token(new_token(), n=1024)}
    ]
    with_tokens = Rendered("tokens", values, manifests_of(render(helm, values)))
    assert "--insecure-listen-any" not in args_of(with_tokens.one("Deployment", name))
