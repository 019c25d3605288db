"""What Tectonic itself reads of the Helm chart (deploy/helm/tectonic), checked on a
machine without a cluster.

The topology, drill schedule and degradation ladder the chart renders are read by
Tectonic's own loaders; values.schema.json knows every topology field; the bundled etcd
compacts under a quota below its volume; every flag a container is given exists in that
command's --help, and the agent, gateway and picker parse the arguments their pods get
(with their ConfigMaps and Secrets laid out as files).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from chaos.drills.schedule_model import known_scenarios, load_schedule
from controlplane.kernel.config import PoolConfig, RegionConfig, Topology
from controlplane.kernel.ladder.file import topology_ladder
from tests.integration.helm_chart_helpers import (
    CHART,
    NAMESPACE,
    RELEASE,
    REPO,
    Rendered,
    _rendered,
    helm,
    manifests_of,
    render,
    rendered,
    topology_of,
)

# The harness's fixtures (helm_chart_helpers.py), imported for pytest to find them.
FIXTURES = (helm, rendered)

# The Tectonic image's commands, as the chart runs them, and where their --help comes from.
COMMANDS = {
    ("python", "-m", "controlplane"): "controlplane",
    ("python", "-m", "regions.agent"): "regions.agent",
    ("python", "-m", "regions.gateway"): "regions.gateway",
    ("tectonic-epp",): "regions.picker",
    ("python", "-m", "chaos"): "chaos",
}


def test_the_topology_configmap_is_a_valid_topology(rendered: Rendered) -> None:
    topology = topology_of(rendered)
    local = [r["name"] for r in rendered.values.get("regions", [{"name": "us-east"}])]
    services = {s["metadata"]["name"] for s in rendered.of_kind("Service")}
    for name in local:  # a region (or each pool of it) of this cluster: its agent's Service
        for unit in topology.units_of(name):
            agent = topology.region(unit).agent
            assert agent == f"tt-tectonic-agent-{unit.replace('.', '-')}.{NAMESPACE}.svc:50061"
            assert agent.split(".")[0] in services
    if rendered.name == "pools":  # docs/models.md: each pool its agent, servers, pool
        assert topology.units_of("us-east") == ("us-east.chat", "us-east.code")
        assert topology.region("us-east.chat").replicas == (
            f"http://tt-tectonic-vllm-us-east-chat.{NAMESPACE}.svc:8000",
        )
        assert topology.region("us-west.code").agent == "agent-code.us-west.example.com:50061"
        agents = {
            c["args"][0]: m["metadata"]["name"]
            for m, c in rendered.containers()
            if c["name"] == "agent"
        }
        assert agents == {
            "--region=us-east.chat": "tt-tectonic-agent-us-east-chat",
            "--region=us-east.code": "tt-tectonic-agent-us-east-code",
        }
        served = {
            m["metadata"]["name"]: c["args"][: c["args"].index("--host=0.0.0.0")]
            for m, c in rendered.containers()
            if c["name"] == "vllm"
        }
        assert served["tt-tectonic-vllm-us-east-chat"] == [
            "--model=/models/llama-3-8b",
            "--served-model-name",
            "llama-3-8b",
            "llama-3-8b-sql",
        ]
        pools = {
            p["metadata"]["name"]: p["spec"]["endpointPickerRef"]["name"]
            for p in rendered.of_kind("InferencePool")
        }
        assert pools == {
            "tt-tectonic-pool-us-east-chat": "tt-tectonic-epp-us-east",
            "tt-tectonic-pool-us-east-code": "tt-tectonic-epp-us-east",
        }
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
    pool = region["properties"]["pools"]["items"]
    assert set(pool["properties"]) == set(PoolConfig.model_fields)
    assert pool["additionalProperties"] is False


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
