"""Who reaches the control plane's HTTP API through the Helm chart (deploy/helm/tectonic),
and with which token, checked on a machine without a cluster.

The dashboard and ``/v1/*`` are not exposed by default: the control plane's Service is
ClusterIP, nothing renders an Ingress, and NOTES.txt prints the ``kubectl port-forward``
that reaches them. Its NetworkPolicy admits the HTTP port only from this release's
Tectonic pods, pods labelled ``tectonic.io/api-client: "true"``
(``networkPolicy.apiClients``) and the peers listed; the gRPC ports stay open unless
``networkPolicy.grpcPeers`` lists some. ``security.tokenSecret`` mounts one key of a
Secret, its role's token, into every Tectonic pod at the path the topology's
``security.token_file`` names; a setup that cannot work fails the render naming the
value to set. The reference layout's values (``examples/three-clusters/``, shown in
docs/kubernetes.md) run mutual TLS and tokens.

What cannot be checked here: that a network plugin enforces the policies (and admits
the kubelet's probes), that the Secret holds the keys, that the certificates are valid
for the names the clusters dial.
"""

from __future__ import annotations

import copy
import posixpath
import re
from types import ModuleType
from typing import Any

import pytest
import yaml

from controlplane.kernel.security import Role
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

CP = f"{RELEASE}-tectonic-controlplane"
CLIENT_LABEL = {"tectonic.io/api-client": "true"}
EXAMPLES = CHART / "examples" / "three-clusters"
KUBERNETES_MD = REPO / "docs" / "kubernetes.md"
# Tectonic's own pods (the app.kubernetes.io/component label) and the
# security.tokenSecret key each mounts by default: the token of its role.
ROLE_OF = {
    "controlplane": Role.OPERATOR,
    "agent": Role.REPORTER,
    "gateway": Role.REPORTER,
    "picker": Role.REPORTER,
    "drills": Role.DRILL_RUNNER,
    "test": Role.VIEWER,
}
DEFAULT_TOKEN_FILE = "/etc/tectonic/token/token"


# ---- helpers ----------------------------------------------------------------------------
def rendered_with(helm: ModuleType, name: str, values: dict[str, Any]) -> Rendered:
    return Rendered(name, values, manifests_of(render(helm, values)))


def notes_of(helm: ModuleType, values: dict[str, Any]) -> str:
    files = render(helm, values)
    (notes,) = [text for path, text in files.items() if path.endswith("NOTES.txt")]
    return notes


def component(m: dict[str, Any]) -> str:
    label: str = m["metadata"]["labels"]["app.kubernetes.io/component"]
    return label


def pods(rendered: Rendered) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod metadata, pod spec) of every workload's template and every bare Pod."""
    out = []
    for m in rendered.manifests:
        if m["kind"] in ("Deployment", "StatefulSet"):
            t = m["spec"]["template"]
            out.append((t["metadata"], t["spec"]))
        elif m["kind"] == "Pod":
            out.append((m["metadata"], m["spec"]))
    return out


def tectonic_pods(rendered: Rendered) -> list[tuple[str, dict[str, Any]]]:
    """(component, pod spec) of Tectonic's own pods: not etcd's, not the model servers'."""
    return [
        (meta["labels"]["app.kubernetes.io/component"], spec)
        for meta, spec in pods(rendered)
        if meta["labels"]["app.kubernetes.io/component"] in ROLE_OF
    ]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Does a label selector (matchLabels, matchExpressions) select ``labels``?"""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        value, op = labels.get(e["key"]), e["operator"]
        ok = {
            "In": value in e.get("values", []),
            "NotIn": value not in e.get("values", []),
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }[op]
        if not ok:
            return False
    return True


def rules_for(policy: dict[str, Any], port: str) -> list[dict[str, Any]]:
    return [
        r
        for r in policy["spec"]["ingress"]
        if any(p["port"] == port for p in r.get("ports", [{"port": port}]))
    ]


def admitted(policy: dict[str, Any], port: str, labels: dict[str, str]) -> bool:
    """Does the policy admit a pod of the release's namespace with ``labels`` on ``port``?"""
    for rule in rules_for(policy, port):
        if "from" not in rule:
            return True
        for peer in rule["from"]:
            if "ipBlock" in peer or peer.get("namespaceSelector"):
                continue  # other namespaces or addresses: not this pod
            if "podSelector" in peer and selects(peer["podSelector"], labels):
                return True
    return False


def validate(rendered: Rendered, kubernetes_validate: ModuleType) -> None:
    for m in rendered.manifests:
        if m["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "InferencePool"):
            continue
        kubernetes_validate.validate(m, "1.37.0", strict=True)


def token_volume(spec: dict[str, Any], mount_dir: str) -> dict[str, Any]:
    """The volume mounted at ``mount_dir`` in the pod's one container."""
    (container,) = spec["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == mount_dir]
    assert mount["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return volume


def with_token_secret(name: str = "tectonic-tokens", **topology_security: Any) -> dict[str, Any]:
    """The all-on value set with its tokens from security.tokenSecret instead of an
    extraSecretMounts entry."""
    values = load_values(CHART / "ci" / "all-on-values.yaml")
    values["extraSecretMounts"] = [
        m for m in values["extraSecretMounts"] if m["name"] != "tectonic-token"
    ]
    values["security"] = {"tokenSecret": {"name": name}}
    security = values["topology"]["security"]
    security.pop("token_file")
    security.update(topology_security)
    return values


def reference_layout(region: str) -> dict[str, Any]:
    shared = yaml.safe_load((EXAMPLES / "shared.yaml").read_text())
    own = yaml.safe_load((EXAMPLES / f"{region}.yaml").read_text())
    merged = copy.deepcopy(shared)
    for key, value in own.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


# ---- not exposed by default ---------------------------------------------------------------
def test_no_value_set_exposes_the_http_api_outside_the_cluster(rendered: Rendered) -> None:
    assert rendered.of_kind("Ingress") == []
    for svc in rendered.of_kind("Service"):
        ports = {p["port"] for p in svc["spec"]["ports"]}
        if 8081 in ports:
            assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]


def test_the_notes_say_how_to_port_forward_to_the_dashboard(helm: ModuleType) -> None:
    notes = notes_of(helm, {})
    assert f"kubectl -n {NAMESPACE} port-forward svc/{CP} 8081:8081" in notes
    assert "http://127.0.0.1:8081/ (dashboard)" in notes
    # No tokens in the default topology: the notes say the API checks none.
    assert "checks no token" in notes
    assert "tectonic.io/api-client=true" in notes
    exposed = notes_of(helm, {"controlPlane": {"service": {"type": "LoadBalancer"}}})
    assert "controlPlane.service.type is LoadBalancer" in exposed
    # The reference layout has tokens, mutual TLS and Prometheus admitted: no warning.
    reference = notes_of(helm, reference_layout("us-east"))
    assert "WARNING" not in reference and "NOTE:" not in reference
    assert 'curl -H "Authorization: Bearer $TECTONIC_TOKEN"' in reference


def test_the_notes_warn_of_an_agent_exposed_without_mutual_tls(helm: ModuleType) -> None:
    lb = {"agent": {"service": {"type": "LoadBalancer"}}}
    assert "without mutual TLS" in notes_of(helm, lb)
    tls = {"ca": "/etc/tectonic/tls/ca.crt", "cert": "/etc/tectonic/tls/tls.crt"}
    tls["key"] = "/etc/tectonic/tls/tls.key"
    for require, warned in ((True, False), (False, True)):
        values = {
            **lb,
            "topology": {"security": {"tls": {**tls, "require_client_cert": require}}},
            "extraSecretMounts": [
                {"name": "tls", "secretName": "tls", "mountPath": "/etc/tectonic/tls"}
            ],
        }
        assert ("without mutual TLS" in notes_of(helm, values)) is warned


# ---- NetworkPolicies ------------------------------------------------------------------------
def test_the_http_port_admits_only_the_release_and_labelled_clients(rendered: Rendered) -> None:
    if not rendered.values.get("controlPlane", {}).get("enabled", True):
        # no control plane in this cluster (external-etcd): no policy for one either
        assert CP not in {m["metadata"]["name"] for m in rendered.of_kind("NetworkPolicy")}
        return
    policy = rendered.one("NetworkPolicy", CP)
    deployment = rendered.one("Deployment", CP)
    assert selects(
        policy["spec"]["podSelector"], deployment["spec"]["template"]["metadata"]["labels"]
    )
    (http,) = rules_for(policy, "http")
    assert http["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert {"podSelector": {"matchLabels": CLIENT_LABEL}} in http["from"]
    # Admitted: a labelled client, this release's Tectonic pods (the helm test Pods ask
    # /readyz); not an unlabelled pod, nor the release's model servers or etcd.
    assert admitted(policy, "http", {"app": "curl", **CLIENT_LABEL})
    assert not admitted(policy, "http", {"app": "curl"})
    for meta, _ in pods(rendered):
        labels = meta["labels"]
        assert admitted(policy, "http", labels) is (
            labels["app.kubernetes.io/component"] in ROLE_OF
        )
    # gRPC: any source by default (agents, gateways and operators of other clusters).
    (grpc,) = rules_for(policy, "grpc")
    assert "from" not in grpc
    agent_policy = rendered.one("NetworkPolicy", f"{RELEASE}-tectonic-agent")
    assert all("from" not in r for r in agent_policy["spec"]["ingress"])


def test_api_clients_and_grpc_peers_are_configurable(
    helm: ModuleType, kubernetes_validate: ModuleType
) -> None:
    prometheus = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    cluster_b = {"ipBlock": {"cidr": "10.20.0.0/16"}}
    values = {
        "networkPolicy": {
            "apiClients": {
                "podLabel": "example.com/dashboard",
                "podLabelValue": "yes",
                "namespaceSelector": {"matchLabels": {"team": "sre"}},
                "extraPeers": [prometheus],
            },
            "grpcPeers": {"controlPlane": [cluster_b], "agent": [cluster_b]},
        }
    }
    r = rendered_with(helm, "peers", values)
    validate(r, kubernetes_validate)
    policy = r.one("NetworkPolicy", CP)
    (http,) = rules_for(policy, "http")
    assert {
        "podSelector": {"matchLabels": {"example.com/dashboard": "yes"}},
        "namespaceSelector": {"matchLabels": {"team": "sre"}},
    } in http["from"]
    assert prometheus in http["from"]
    assert {"podSelector": {"matchLabels": CLIENT_LABEL}} not in http["from"]
    for name in (CP, f"{RELEASE}-tectonic-agent"):
        (grpc,) = rules_for(r.one("NetworkPolicy", name), "grpc")
        assert cluster_b in grpc["from"]
        # this release's pods stay admitted (reports, the leader's calls, helm test)
        assert admitted(
            r.one("NetworkPolicy", name),
            "grpc",
            {
                "app.kubernetes.io/name": "tectonic",
                "app.kubernetes.io/instance": RELEASE,
                "app.kubernetes.io/component": "gateway",
            },
        )
        assert not admitted(r.one("NetworkPolicy", name), "grpc", {"app": "other"})
    # No label: only the release and the listed peers.
    r = rendered_with(helm, "no-label", {"networkPolicy": {"apiClients": {"podLabel": ""}}})
    (http,) = rules_for(r.one("NetworkPolicy", CP), "http")
    assert len(http["from"]) == 1 and not admitted(r.one("NetworkPolicy", CP), "http", CLIENT_LABEL)


# ---- tokens from a Secret -------------------------------------------------------------------
def test_the_token_secret_mounts_each_roles_key_where_the_topology_says(
    helm: ModuleType, kubernetes_validate: ModuleType
) -> None:
    r = rendered_with(helm, "token-secret", with_token_secret())
    validate(r, kubernetes_validate)
    # The chart writes its default path into the topology, which every process reads.
    security = topology_of(r).security
    assert security is not None and security.token_file == DEFAULT_TOKEN_FILE
    mount_dir, file = posixpath.split(DEFAULT_TOKEN_FILE)
    seen = set()
    for comp, spec in tectonic_pods(r):
        volume = token_volume(spec, mount_dir)
        assert volume["secret"]["secretName"] == "tectonic-tokens"
        assert volume["secret"]["items"] == [{"key": ROLE_OF[comp].value, "path": file}]
        seen.add(comp)
    assert seen == set(ROLE_OF)  # all-on runs every Tectonic component
    # The helm test Pods read it as failoverctl's token.
    for pod in r.of_kind("Pod"):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["TOKEN_FILE"] == DEFAULT_TOKEN_FILE
    # Nothing else mounts there, and the model servers and etcd get no token.
    for meta, spec in pods(r):
        if meta["labels"]["app.kubernetes.io/component"] not in ROLE_OF:
            assert all(v["name"] != "own-token" for v in spec.get("volumes", []))


def test_the_token_secret_follows_the_topologys_token_file_and_its_keys(helm: ModuleType) -> None:
    values = with_token_secret("tokens", token_file="/var/run/tectonic/me.token")
    values["security"]["tokenSecret"]["keys"] = {"gateway": "edge", "drills": ""}
    r = rendered_with(helm, "token-file", values)
    security = topology_of(r).security
    assert security is not None and security.token_file == "/var/run/tectonic/me.token"
    for comp, spec in tectonic_pods(r):
        if comp == "drills":  # "": none mounted
            assert all(v["name"] != "own-token" for v in spec["volumes"])
            continue
        volume = token_volume(spec, "/var/run/tectonic")
        key = "edge" if comp == "gateway" else ROLE_OF[comp].value
        assert volume["secret"]["items"] == [{"key": key, "path": "me.token"}]


def test_tokens_without_a_secret_still_come_from_extra_secret_mounts_or_the_env(
    helm: ModuleType,
) -> None:
    # The all-on value set mounts token_file's directory with extraSecretMounts.
    all_on = _rendered("all-on")
    for _, spec in tectonic_pods(all_on):
        assert all(v["name"] != "own-token" for v in spec["volumes"])
        token_volume(spec, "/etc/tectonic/token")  # its extraSecretMounts entry
    env = [{"name": "TECTONIC_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "t"}}}]
    values = {
        "topology": {"security": {"tokens": [], "token_file": "/etc/tectonic/token/token"}},
        **{c: {"extraEnv": env} for c in ("controlPlane", "agent", "gateway", "tests")},
    }
    r = rendered_with(helm, "env-tokens", values)
    for _, spec in tectonic_pods(r):
        assert all(v["name"] != "own-token" for v in spec["volumes"])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (  # a Secret nobody reads: no security section
            {"security": {"tokenSecret": {"name": "tectonic-tokens"}}},
            "security.tokenSecret.name (tectonic-tokens): the processes read their token "
            "through topology.security.token_file, and the topology has no security section",
        ),
        (  # tokens checked, no token to present
            {"topology": {"security": {"token_file": "/etc/tectonic/token/token"}}},
            "and the controlPlane pods have no token of their own: set security.tokenSecret.name",
        ),
        (
            {
                "topology": {"security": {"token_file": "/etc/tectonic/token/token"}},
                "security": {"tokenSecret": {"name": "t", "keys": {"gateway": ""}}},
            },
            "security.tokenSecret.keys.gateway is empty",
        ),
        (  # the Secret would shadow (or be shadowed by) another mount
            {
                "topology": {"security": {"token_file": "/etc/tectonic/tls/token"}},
                "security": {"tokenSecret": {"name": "t"}},
                "extraSecretMounts": [
                    {"name": "tls", "secretName": "tls", "mountPath": "/etc/tectonic/tls"}
                ],
            },
            "collides with extraSecretMounts[0] (tls) at /etc/tectonic/tls",
        ),
        (
            {
                "topology": {"security": {"token_file": "/etc/tectonic/topology/token"}},
                "security": {"tokenSecret": {"name": "t"}},
            },
            "collides with the topology at /etc/tectonic/topology",
        ),
        (
            {
                "topology": {"security": {"token_file": "/token"}},
                "security": {"tokenSecret": {"name": "t"}},
            },
            "must be an absolute path in a directory of its own",
        ),
        ({"security": {"tokenSecret": {"name": "Not_A_Name"}}}, "/security/tokenSecret/name"),
        (
            {"security": {"tokenSecret": {"keys": {"gatway": "x"}}}},
            "additional properties 'gatway'",
        ),
        (
            {"networkPolicy": {"apiClients": {"podLabel": "not a label"}}},
            "/networkPolicy/apiClients/podLabel",
        ),
        ({"networkPolicy": {"grpcPeers": {"gateway": []}}}, "additional properties 'gateway'"),
    ],
)
def test_a_token_setup_that_cannot_work_fails_naming_the_value(
    helm: ModuleType, values: dict[str, Any], message: str
) -> None:
    assert message in render_error(helm, values)


def test_tokens_in_the_topology_without_any_token_name_the_secret_to_set(helm: ModuleType) -> None:
    tokens = yaml.safe_load((EXAMPLES / "shared.yaml").read_text())["topology"]["security"][
        "tokens"
    ]
    error = render_error(helm, {"topology": {"security": {"tokens": tokens}}})
    assert "topology.security.tokens: the control planes and agents check bearer tokens" in error
    assert "security.tokenSecret.name" in error


# ---- the reference layout: mutual TLS and tokens ------------------------------------------------
@pytest.mark.parametrize("region", ["us-east", "us-west", "eu-west"])
def test_the_reference_layout_runs_mutual_tls_and_tokens(
    helm: ModuleType, kubernetes_validate: ModuleType, region: str
) -> None:
    values = reference_layout(region)
    r = rendered_with(helm, f"reference-{region}", values)
    validate(r, kubernetes_validate)
    security = topology_of(r).security  # Tectonic's own loader accepts it
    assert security is not None and security.tls is not None
    assert security.tls.require_client_cert is True
    assert security.tokens and security.token_file == DEFAULT_TOKEN_FILE
    tls_dirs = {
        posixpath.dirname(p) for p in (security.tls.ca, security.tls.cert, security.tls.key)
    }
    (tls_dir,) = tls_dirs
    agent = r.one("Deployment", f"{RELEASE}-tectonic-agent-{region}")
    (container,) = agent["spec"]["template"]["spec"]["containers"]
    # The agent serves (and calls) with the topology's TLS: its gRPC port is mTLS-only.
    assert "--security=/etc/tectonic/topology/topology.yaml" in container["args"]
    for comp, spec in tectonic_pods(r):
        assert token_volume(spec, tls_dir)["secret"]["secretName"] == "tectonic-tls"
        items = token_volume(spec, posixpath.dirname(DEFAULT_TOKEN_FILE))["secret"]["items"]
        assert items[0]["key"] == ROLE_OF[comp].value
    service = r.one("Service", f"{RELEASE}-tectonic-agent-{region}")
    assert service["spec"]["type"] == "LoadBalancer"  # reached from the other clusters
    assert r.one("Service", CP)["spec"]["type"] == "ClusterIP"
    # gRPC open (guarded by mTLS and tokens), HTTP to clients and Prometheus only.
    policy = r.one("NetworkPolicy", CP)
    (http,) = rules_for(policy, "http")
    assert values["networkPolicy"]["apiClients"]["extraPeers"][0] in http["from"]
    assert not admitted(policy, "http", {"app": "curl"})
    assert r.of_kind("Ingress") == []


def test_the_reference_layout_in_the_docs_is_the_example_files() -> None:
    """docs/kubernetes.md shows shared.yaml and us-east.yaml as they are; the other two
    regions' files differ from us-east.yaml only in the region's name."""
    text = KUBERNETES_MD.read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]
    for name in ("shared.yaml", "us-east.yaml"):
        assert yaml.safe_load((EXAMPLES / name).read_text()) in blocks, name
        assert f"examples/three-clusters/{name}" in text
    east = (EXAMPLES / "us-east.yaml").read_text()
    for region in ("us-west", "eu-west"):
        assert (EXAMPLES / f"{region}.yaml").read_text() == east.replace("us-east", region)


def test_the_docs_say_how_the_api_is_reached_and_who_may() -> None:
    text = KUBERNETES_MD.read_text()
    for needle in (
        "kubectl -n tectonic port-forward svc/tectonic-controlplane 8081:8081",
        'tectonic.io/api-client: "true"',
        "security.tokenSecret",
        "networkPolicy.apiClients",
        "networkPolicy.grpcPeers",
        "require_client_cert: true",
    ):
        assert needle in text, needle
    assert "security.tokenSecret" in (REPO / "controlplane" / "SECURITY.md").read_text()
