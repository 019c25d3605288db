"""The agent's ``--pool-config`` file: a bad file fails at load with one line per
problem, naming the field as the file spells it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from controlplane.kernel.config import ConfigError
from regions.agent.cli import parse_args
from regions.agent.pool_config import (
    AgentPoolConfig,
    SimulatorLauncherConfig,
    StaticLauncherConfig,
    VllmLauncherConfig,
    load_pool_config,
    parse_pool_config,
)
from regions.agent.server import AgentConfig
from regions.agent.warm_pool import AgentPool, PoolPublishing
from regions.pool.launchers import SimulatorLauncher, StaticEndpoints, VllmLauncher

GOOD = """
launcher: {kind: simulator, model: tiny, block_size: 16}
active: 1
warm: 2
size: 4
dwell: {warm_min_s: 60, idle_min_s: 30, active_min_s: 10}
burst: {burst_rps: 100, replica_rps: 30, cold_start_s: 120, activation_s: 8, budget_s: 30}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    return path


def problems(data: object) -> str:
    with pytest.raises(ConfigError) as e:
        parse_pool_config(data, "pool.yaml")
    return str(e.value)


def test_a_full_file_loads_with_every_field(tmp_path: Path) -> None:
    cfg = load_pool_config(write(tmp_path, GOOD))
    assert isinstance(cfg.launcher, SimulatorLauncherConfig)
    assert (cfg.active, cfg.warm, cfg.size, cfg.dwell.idle_min_s) == (1, 2, 4, 30)
    assert cfg.burst is not None and cfg.burst.burst_rps == 100
    pool = cfg.pool_config()
    assert pool.slots == 4 and pool.target.warm == 2
    assert isinstance(cfg.launcher.build(), SimulatorLauncher)


def test_each_launcher_kind_builds_its_launcher() -> None:
    vllm = parse_pool_config(
        {"launcher": {"kind": "vllm", "flavour": "cpu", "model": "/m", "kv_cache_gib": 2}}
    )
    assert isinstance(vllm.launcher, VllmLauncherConfig)
    launcher = vllm.launcher.build()
    assert isinstance(launcher, VllmLauncher) and launcher.spec.kv_cache_gib == 2
    static = parse_pool_config(
        {"launcher": {"kind": "static", "urls": ["http://a:8000", "http://b:8000"]}}
    )
    assert isinstance(static.launcher, StaticLauncherConfig)
    assert isinstance(static.launcher.build(), StaticEndpoints)


def test_unknown_launcher_kind_names_the_kinds() -> None:
    msg = problems({"launcher": {"kind": "docker"}})
    assert "pool.yaml is invalid" in msg and "launcher:" in msg
    assert "'docker'" in msg and "'simulator', 'vllm', 'static'" in msg


def test_size_below_active_plus_warm_is_refused_on_the_size_field() -> None:
    msg = problems({"launcher": {"kind": "simulator"}, "active": 2, "warm": 2, "size": 3})
    assert "  size: size 3 < active 2 + warm 2" in msg


def test_static_without_urls_says_what_urls_are() -> None:
    msg = problems({"launcher": {"kind": "static"}})
    assert "launcher.urls: a static pool needs urls" in msg


def test_static_urls_must_hold_the_targets_and_be_base_urls() -> None:
    msg = problems({"launcher": {"kind": "static", "urls": ["http://a:1"]}, "warm": 1})
    assert "launcher: 1 static url(s) cannot hold active 1 + warm 1" in msg
    msg = problems({"launcher": {"kind": "static", "urls": ["a:1", "http://b:1/v1"]}})
    assert "launcher.urls: urls must be base URLs" in msg


def test_unknown_fields_and_bad_values_are_each_named() -> None:
    msg = problems({"launcher": {"kind": "simulator", "modle": "x"}, "activ": 1, "warm": -1})
    assert "launcher.modle: Extra inputs are not permitted" in msg
    assert "activ: Extra inputs are not permitted" in msg
    assert "warm: Input should be greater than or equal to 0" in msg


def test_unreadable_and_non_yaml_files_fail_with_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read pool config"):
        load_pool_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_pool_config(write(tmp_path, "launcher: [unclosed"))
    with pytest.raises(ConfigError, match=r"\(top level\): Input should be a valid dict"):
        load_pool_config(write(tmp_path, ""))


POOL = AgentPoolConfig.model_validate({"launcher": {"kind": "simulator"}})
ETCD = ("127.0.0.1:2379",)


def test_agent_takes_either_replicas_or_a_pool() -> None:
    with pytest.raises(ValidationError, match=r"either static replicas .* or a pool"):
        AgentConfig(region="eu", replicas=("http://a:1",), pool=POOL, etcd=ETCD, cluster="prod")
    with pytest.raises(ValidationError, match="no replicas: give --replica"):
        AgentConfig(region="eu")
    AgentConfig(region="eu", pool=POOL, etcd=ETCD, cluster="prod")
    AgentConfig(region="eu", replicas=("http://a:1",))


def test_a_pool_needs_somewhere_to_publish() -> None:
    with pytest.raises(ValidationError, match="a pool needs --etcd and --cluster"):
        AgentConfig(region="eu", pool=POOL, etcd=("127.0.0.1:2379",))
    with pytest.raises(ValidationError, match="etcd endpoints must be host:port"):
        AgentConfig(region="eu", pool=POOL, etcd=("localhost",), cluster="prod")
    with pytest.raises(ValidationError, match="only serve to publish a pool"):
        AgentConfig(region="eu", replicas=("http://a:1",), etcd=ETCD, cluster="prod")


def test_cli_reads_the_pool_file_and_refuses_both_sources(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    base = ["--region", "eu", "--control-plane", "127.0.0.1:7000"]
    cfg = parse_args(
        [*base, "--pool-config", str(path), "--etcd", "127.0.0.1:2379,h:2", "--cluster", "prod"]
    )
    assert cfg.pool is not None and cfg.pool.warm == 2 and cfg.replicas == ()
    assert cfg.etcd == ("127.0.0.1:2379", "h:2") and cfg.cluster == "prod"

    with pytest.raises(SystemExit):
        parse_args([*base, "--replica", "http://a:1", "--pool-config", str(path), *_etcd()])
    assert "either static replicas (--replica) or a pool" in capsys.readouterr().err
    bad = write(tmp_path, "launcher: {kind: static}\n")
    with pytest.raises(SystemExit):
        parse_args([*base, "--pool-config", str(bad), *_etcd()])
    assert "launcher.urls: a static pool needs urls" in capsys.readouterr().err


def _etcd() -> list[str]:
    return ["--etcd", "127.0.0.1:2379", "--cluster", "prod"]


def test_the_security_files_etcd_settings_reach_the_pools_etcd_client(tmp_path: Path) -> None:
    """etcd TLS and users pass through to the pool's publication; --etcd sets where."""
    sec = tmp_path / "topology.yaml"
    sec.write_text(
        "etcd: {endpoints: ['etcd-a:2379'], ca: /etc/ca.pem, cert: /etc/c.pem, key: /etc/c.key,"
        " user: agent, password_file: /etc/etcd-password}\nsecurity: {}\n"
    )
    config = parse_args(
        [
            "--region",
            "east",
            "--control-plane",
            "127.0.0.1:1",
            "--pool-config",
            str(write(tmp_path, GOOD)),
            "--etcd",
            "10.0.0.5:2379",
            "--cluster",
            "prod",
            "--security",
            str(sec),
        ]
    )
    assert config.etcd_settings is not None and config.etcd_settings.ca == "/etc/ca.pem"
    assert config.pool is not None
    pool = AgentPool(
        "east", config.pool, PoolPublishing("prod", config.pool_etcd()), interval_s=1.0
    )
    used = pool.store._config  # type: ignore[attr-defined]
    assert used.endpoints == ("10.0.0.5:2379",) and used.cert == "/etc/c.pem"
    assert used.user == "agent" and used.password_file == "/etc/etcd-password"


def test_a_file_without_an_etcd_section_keeps_plain_etcd(tmp_path: Path) -> None:
    from controlplane.kernel.config import load_etcd

    path = tmp_path / "sec.yaml"
    path.write_text("security: {}\n")
    assert load_etcd(path) is None
    path.write_text("etcd: {endpoints: [nonsense]}\n")
    with pytest.raises(ConfigError, match="endpoints"):
        load_etcd(path)
