"""The lab's warm pools, without starting a process: the ``--pool-config`` a lab writes
for a unit is one the agent accepts, real vLLM (the CPU build, ``vllm_units``) only for
the units named and simulators elsewhere; the scaler-sized IDLE dwell reaches the file."""

from __future__ import annotations

from pathlib import Path

from chaos.lab.spec import SIM_ARGS, VLLM_START_TIMEOUT_S, WarmPoolSpec
from chaos.lab.vllm_cpu import TINY_MODEL_DIR, VLLM_PYTHON
from regions.agent.pool_config import (
    SimulatorLauncherConfig,
    VllmLauncherConfig,
    parse_pool_config,
)
from regions.pool.launchers import vllm_command

POOL = WarmPoolSpec(active=1, warm=1, size=2, scaled_idle_min_s=1.0, vllm_units=("us-east",))


def test_a_vllm_unit_gets_real_cpu_vllm_servers_the_agent_accepts() -> None:
    cfg = parse_pool_config(POOL.pool_config("tiny", 16, SIM_ARGS, vllm=True))
    launcher = cfg.launcher
    assert isinstance(launcher, VllmLauncherConfig)
    assert launcher.flavour == "cpu" and launcher.served_model_name == "tiny"
    assert launcher.model == str(TINY_MODEL_DIR) and launcher.python == str(VLLM_PYTHON)
    assert launcher.ready_timeout_s == VLLM_START_TIMEOUT_S
    assert (cfg.active, cfg.warm, cfg.size) == (1, 1, 2)
    argv = vllm_command(launcher, 8000, Path("/tmp/x")).argv
    # the CPU build refuses sleep mode: dev-mode /sleep and /wake_up, no weights offloaded
    assert "--enable-sleep-mode" not in argv and "--enable-prompt-tokens-details" in argv


def test_other_units_keep_simulators_and_the_scaled_idle_dwell_reaches_the_file() -> None:
    cfg = parse_pool_config(POOL.pool_config("tiny", 16, SIM_ARGS))
    assert isinstance(cfg.launcher, SimulatorLauncherConfig)
    assert cfg.dwell.scaled_idle_min_s == 1.0
    assert WarmPoolSpec().pool_config("tiny", 16, SIM_ARGS)["dwell"] == {
        "active_min_s": 5.0,
        "idle_min_s": 30.0,
        "scaled_idle_min_s": 10.0,  # the pool's own default: other labs unchanged
        "warm_min_s": 600.0,
        "drain_s": 1.0,
    }
