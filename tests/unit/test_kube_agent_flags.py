"""The agent's Kubernetes flags (regions/agent/cli.py): ``--discovery kubernetes`` and
``--pool-launcher kubernetes`` build the config, and every wrong combination is refused
with the flag named. No API server is involved: parsing builds nothing that connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.kernel.config import ConfigError
from regions.agent.cli import parse_args
from regions.agent.pool_config import KubernetesLauncherConfig, load_pool_config
from regions.agent.server import AgentConfig

BASE = ["--region", "eu", "--control-plane", "127.0.0.1:7000"]
KUBE = ["--discovery", "kubernetes", "--kube-namespace", "models", "--kube-service", "vllm-eu"]
POOL = ["--pool-launcher", "kubernetes", "--kube-workload", "deployment/vllm-eu"]
PUBLISH = ["--etcd", "127.0.0.1:2379", "--cluster", "prod"]


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        parse_args(BASE + argv)
    return capsys.readouterr().err


def test_discovery_builds_the_kube_config_and_static_stays_the_default() -> None:
    c = parse_args(BASE + KUBE + ["--kube-port-name", "http", "--kubeconfig", "/k/config"])
    assert c.kube is not None and c.pool is None and c.replicas == ()
    assert (c.kube.namespace, c.kube.service, c.kube.port_name) == ("models", "vllm-eu", "http")
    assert c.kube.kubeconfig == "/k/config"
    static = parse_args([*BASE, "--replica", "http://127.0.0.1:8000"])
    assert static.kube is None and static.replicas == ("http://127.0.0.1:8000",)


def test_a_kubernetes_pool_from_the_flags_alone() -> None:
    c = parse_args(BASE + KUBE + POOL + PUBLISH)
    assert c.pool is not None and isinstance(c.pool.launcher, KubernetesLauncherConfig)
    assert c.pool.launcher.workload == "deployment/vllm-eu"
    assert (c.pool.active, c.pool.warm) == (1, 1)  # the pool file's defaults


def test_pool_advisory_marks_the_kubernetes_launcher(capsys: pytest.CaptureFixture[str]) -> None:
    c = parse_args(BASE + KUBE + POOL + PUBLISH + ["--pool-advisory"])
    assert c.pool is not None and isinstance(c.pool.launcher, KubernetesLauncherConfig)
    assert c.pool.launcher.advisory is True
    plain = parse_args(BASE + KUBE + POOL + PUBLISH)
    assert plain.pool is not None and isinstance(plain.pool.launcher, KubernetesLauncherConfig)
    assert plain.pool.launcher.advisory is False  # the pool scales its workload by default
    assert "--pool-advisory goes with --pool-launcher kubernetes" in refused(
        [*KUBE, "--pool-advisory"], capsys
    )


def test_wrong_combinations_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert "needs --kube-namespace and --kube-service" in refused(
        ["--discovery", "kubernetes"], capsys
    )
    assert "--kube-service only go with --discovery kubernetes" in refused(
        ["--replica", "http://a:1", "--kube-service", "x"], capsys
    )
    assert "needs --kube-workload" in refused([*KUBE, "--pool-launcher", "kubernetes"], capsys)
    assert "--kube-workload goes with --pool-launcher" in refused(
        [*KUBE, "--kube-workload", "deployment/x"], capsys
    )
    assert "--replica) or --discovery kubernetes, not both" in refused(
        [*KUBE, "--replica", "http://a:1"], capsys
    )
    assert "finds its pods through --discovery kubernetes" in refused(POOL + PUBLISH, capsys)
    assert "deployment/NAME or statefulset/NAME" in refused(
        KUBE + PUBLISH + ["--pool-launcher", "kubernetes", "--kube-workload", "vllm"], capsys
    )
    assert "kube.namespace" in refused(
        ["--discovery", "kubernetes", "--kube-namespace", "Bad_NS", "--kube-service", "s"],
        capsys,
    )


def test_discovery_with_a_pool_of_another_kind_is_refused(tmp_path: Path) -> None:
    pool = load_pool_config(_file(tmp_path, "launcher: {kind: simulator}\n"))
    with pytest.raises(ValueError, match="a simulator pool would not use what it discovers"):
        AgentConfig(
            region="eu",
            pool=pool,
            etcd=("127.0.0.1:2379",),
            cluster="prod",
            kube={"namespace": "models", "service": "vllm"},  # type: ignore[arg-type]
        )


def test_the_launcher_is_given_once(tmp_path: Path) -> None:
    path = _file(tmp_path, "active: 2\nwarm: 1\nlauncher: {kind: simulator}\n")
    launcher = {"kind": "kubernetes", "workload": "deployment/v"}
    with pytest.raises(ConfigError, match="keep one of them"):
        load_pool_config(path, launcher)
    sizes_only = _file(tmp_path, "active: 2\nwarm: 1\n")
    pool = load_pool_config(sizes_only, launcher)
    assert (pool.active, pool.warm, pool.launcher.kind) == (2, 1, "kubernetes")
    with pytest.raises(ConfigError, match="discovery"):
        pool.launcher.build()  # built by the agent, with its discovery


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / f"pool-{abs(hash(text))}.yaml"
    path.write_text(text)
    return path
