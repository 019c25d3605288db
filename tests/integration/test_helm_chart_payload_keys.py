"""The Helm chart's (deploy/helm/tectonic) payload keys for sealed replay payloads
(docs/residency.md), checked on a machine without a cluster.

``payloadKeys.secretName`` mounts a zone's data keys read-only at
``payloadKeys.mountPath`` into the gateway, picker and agent pods, which get
``--payload-keys`` naming it, and into no other pod: not the control plane (the leader
ranks sealed payloads without a key), the drills, etcd, the model servers or the helm
test Pods. ``topology.prefixes.sealed_payloads`` without the Secret fails the render
while the release runs gateways or pickers (they would refuse to start), naming the
value to set; a mountPath on another mount fails too. The reference layout
(``examples/three-clusters/``) seals, with a Secret per zone.

What cannot be checked here: that the Secret exists in the cluster, holds valid keys
and stays in its zone's clusters.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.integration.helm_chart_helpers import (
    CHART,
    REPO,
    VALUE_SETS,
    Rendered,
    _rendered,
    helm,
    load_values,
    manifests_of,
    render,
    render_error,
    topology_of,
)

# The harness's fixtures (helm_chart_helpers.py), imported for pytest to find them.
FIXTURES = (helm,)

SECRET = "tectonic-payload-keys"
DIR = "/etc/tectonic/payload-keys"
FLAG = "--payload-keys"
KEYED = {"gateway", "picker", "agent"}  # the components (their component label) with keys
EXAMPLES = CHART / "examples" / "three-clusters"
SEALED = {"topology": {"prefixes": {"sealed_payloads": True}}}


def over(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` over ``base``, maps merged as Helm merges values (the rest replaced)."""
    out = copy.deepcopy(base)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = over(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def rendered_with(helm: ModuleType, name: str, values: dict[str, Any]) -> Rendered:
    return Rendered(name, values, manifests_of(render(helm, values)))


def pods(r: Rendered) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(component label, kind/name, pod spec) of every pod template and Pod."""
    for m in r.manifests:
        if m["kind"] == "Pod":
            spec = m["spec"]
        elif m["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            spec = m["spec"]["template"]["spec"]
        elif m["kind"] == "CronJob":
            spec = m["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        else:
            continue
        component = m["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")
        yield component, f"{m['kind']}/{m['metadata']['name']}", spec


def key_flags(spec: dict[str, Any]) -> list[str]:
    containers = spec["containers"] + spec.get("initContainers", [])
    return [
        str(a)
        for c in containers
        for a in [*c.get("command", []), *c.get("args", [])]
        if FLAG in str(a)
    ]


def key_volumes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        v
        for v in spec.get("volumes", [])
        if v["name"] == "payload-keys" or v.get("secret", {}).get("secretName") == SECRET
    ]


def key_mounts(spec: dict[str, Any], where: str = DIR) -> list[dict[str, Any]]:
    containers = spec["containers"] + spec.get("initContainers", [])
    return [
        m
        for c in containers
        for m in c.get("volumeMounts", [])
        if m["name"] == "payload-keys" or m["mountPath"] == where
    ]


def assert_keyed_only(r: Rendered, where: str = DIR) -> set[str]:
    """Every gateway, picker and agent pod mounts the Secret at ``where`` and passes
    ``--payload-keys=<where>``; no other pod sees it. Returns the components seen."""
    seen = set()
    for component, name, spec in pods(r):
        seen.add(component)
        if component in KEYED:
            (container,) = spec["containers"]
            assert f"{FLAG}={where}" in container["args"], name
            assert key_flags(spec) == [f"{FLAG}={where}"], name
            assert {"name": "payload-keys", "mountPath": where, "readOnly": True} in container[
                "volumeMounts"
            ], name
            assert key_mounts(spec, where) == [
                {"name": "payload-keys", "mountPath": where, "readOnly": True}
            ], name
            # the whole Secret: a file per key id and `active`, read-only to the group
            assert key_volumes(spec) == [
                {"name": "payload-keys", "secret": {"secretName": SECRET, "defaultMode": 0o440}}
            ], name
        else:
            assert key_flags(spec) == [], name
            assert key_volumes(spec) == [], name
            assert key_mounts(spec, where) == [], name
    return seen


# ---- where the keys go ------------------------------------------------------------------
def test_the_keys_reach_the_gateway_picker_and_agent_and_no_other_pod(helm: ModuleType) -> None:
    """Every component on (all-on: the control plane, drills, etcd, model servers and
    the helm test Pods too): only gateways, pickers and agents get the Secret."""
    values = over(
        load_values(VALUE_SETS["all-on"]), {**SEALED, "payloadKeys": {"secretName": SECRET}}
    )
    r = rendered_with(helm, "all-on-sealed", values)
    seen = assert_keyed_only(r)
    assert KEYED | {"controlplane", "drills", "etcd", "model-server", "test"} <= seen
    assert topology_of(r).prefixes.sealed_payloads
    # nothing about the keys is written into the topology every pod reads
    cm = r.one("ConfigMap", "tt-tectonic-topology")["data"]["topology.yaml"]
    assert SECRET not in cm and DIR not in cm


def test_the_mount_path_is_configurable(helm: ModuleType) -> None:
    where = "/var/run/tectonic/zone-keys"
    values = {**SEALED, "payloadKeys": {"secretName": SECRET, "mountPath": where}}
    values["picker"] = {"enabled": True}
    seen = assert_keyed_only(rendered_with(helm, "mount-path", values), where)
    assert seen >= KEYED


def test_without_the_secret_no_pod_gets_keys_or_the_flag() -> None:
    """The chart's default (payloadKeys.secretName: "") mounts nothing, sealing or not."""
    for name in ("default", "all-on"):
        for component, pod, spec in pods(_rendered(name)):
            assert key_flags(spec) == [], (component, pod)
            assert key_volumes(spec) == [], (component, pod)
            assert key_mounts(spec) == [], (component, pod)


# ---- setups that cannot work --------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "messages"),
    [
        (  # the default data plane, the gateway
            SEALED,
            [
                "topology.prefixes.sealed_payloads is on, and the gateway pods have no "
                "payload keys",
                "Set payloadKeys.secretName",
                "docs/residency.md",
            ],
        ),
        (
            {**SEALED, "gateway": {"enabled": False}, "picker": {"enabled": True}},
            ["the picker pods have no payload keys", "Set payloadKeys.secretName"],
        ),
        (
            {**SEALED, "picker": {"enabled": True}},
            ["the gateway and picker pods have no payload keys"],
        ),
        (  # --no-prefix-tracking spares the gateway, not the picker
            {
                **SEALED,
                "gateway": {"extraArgs": ["--no-prefix-tracking"]},
                "picker": {"enabled": True},
            },
            ["the picker pods have no payload keys"],
        ),
        (
            {"payloadKeys": {"secretName": SECRET, "mountPath": "/etc/tectonic/topology"}},
            [
                "payloadKeys.mountPath (/etc/tectonic/topology)",
                "collides with the topology at /etc/tectonic/topology",
            ],
        ),
        (
            {
                "payloadKeys": {"secretName": SECRET, "mountPath": "/etc/tectonic/tls/keys"},
                "extraSecretMounts": [
                    {"name": "tectonic-tls", "secretName": "tls", "mountPath": "/etc/tectonic/tls"}
                ],
            },
            ["collides with extraSecretMounts[0] (tectonic-tls) at /etc/tectonic/tls"],
        ),
        (
            {
                "payloadKeys": {"secretName": SECRET, "mountPath": "/etc/tectonic/token"},
                "security": {"tokenSecret": {"name": "tectonic-tokens"}},
                "topology": {"security": {"tokens": []}},
            },
            ["collides with security.tokenSecret at /etc/tectonic/token"],
        ),
        (
            {"payloadKeys": {"secretName": SECRET, "mountPath": "/etc/tectonic"}},
            ["payloadKeys.mountPath (/etc/tectonic)", "collides with the topology"],
        ),
        (
            {
                "payloadKeys": {"secretName": SECRET},
                "extraSecretMounts": [
                    {"name": "payload-keys", "secretName": "x", "mountPath": "/etc/x"}
                ],
            },
            ["extraSecretMounts[0].name: payload-keys is the volume of payloadKeys.secretName"],
        ),
        (  # the schema: an absolute directory, without a trailing slash
            {"payloadKeys": {"secretName": SECRET, "mountPath": "keys"}},
            ["payloadKeys", "mountPath"],
        ),
        ({"payloadKeys": {"secretName": SECRET, "key": "k"}}, ["additional properties 'key'"]),
    ],
)
def test_a_payload_key_setup_that_cannot_work_fails_naming_the_value(
    helm: ModuleType, values: dict[str, Any], messages: list[str]
) -> None:
    error = render_error(helm, values)
    for message in messages:
        assert message in error


@pytest.mark.parametrize(
    "values",
    [
        # an agent-only release: the agent skips sealed payloads it cannot open
        {**SEALED, "gateway": {"enabled": False}},
        # the data plane tracks no prefixes, or brings its own keys
        {**SEALED, "gateway": {"extraArgs": ["--no-prefix-tracking"]}},
        {**SEALED, "gateway": {"extraArgs": ["--payload-keys=/etc/keys"]}},
    ],
)
def test_sealing_without_the_secret_renders_where_nothing_would_refuse_to_start(
    helm: ModuleType, values: dict[str, Any]
) -> None:
    r = rendered_with(helm, "sealed-without-keys", values)
    assert topology_of(r).prefixes.sealed_payloads
    for _, name, spec in pods(r):
        assert key_volumes(spec) == [], name


# ---- the reference layout ---------------------------------------------------------------
def reference_layout(region: str) -> dict[str, Any]:
    shared = yaml.safe_load((EXAMPLES / "shared.yaml").read_text())
    own = yaml.safe_load((EXAMPLES / f"{region}.yaml").read_text())
    return over(shared, own)


@pytest.mark.parametrize("region", ["us-east", "us-west", "eu-west"])
def test_the_reference_layout_seals_with_its_zones_keys(helm: ModuleType, region: str) -> None:
    values = reference_layout(region)
    r = rendered_with(helm, f"reference-{region}", values)
    assert topology_of(r).prefixes.sealed_payloads
    seen = assert_keyed_only(r)
    assert {"picker", "agent", "controlplane"} <= seen
    assert "gateway" not in seen  # Envoy with the picker is the data plane there


def test_the_reference_layout_without_its_secret_fails_naming_it(helm: ModuleType) -> None:
    values = reference_layout("eu-west")
    del values["payloadKeys"]
    error = render_error(helm, values)
    assert "the picker pods have no payload keys" in error
    assert "payloadKeys.secretName" in error


def test_the_reference_layout_says_how_to_create_each_zones_secret() -> None:
    shared = (EXAMPLES / "shared.yaml").read_text()
    for needle in (
        "openssl rand -base64 32 > us-1",
        f"kubectl --context us-east -n tectonic create secret generic {SECRET}",
        "--from-file=us-1 --from-literal=active=us-1",
        "--context us-west",
        f"kubectl --context eu-west -n tectonic create secret generic {SECRET}",
        "--from-file=eu-1 --from-literal=active=eu-1",
        "docs/residency.md",
    ):
        assert needle in shared, needle
    text = (REPO / "docs" / "kubernetes.md").read_text()
    assert "`topology.prefixes.sealed_payloads` and `payloadKeys.secretName`" in text
    assert "prefixes.sealedPayloads" not in text
