"""Launchers (regions.pool.launchers): the vLLM argv + environment builders for the GPU
and CPU builds, and static endpoints that refuse to be launched or stopped."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from regions.pool.launchers import (
    Launcher,
    LaunchRefused,
    SimulatorLauncher,
    StaticEndpoints,
    VllmLauncher,
    VllmSpec,
    vllm_command,
)

ADMIN = "VLLM_SERVER_DEV_MODE"  # without it vLLM serves no /sleep, /wake_up, ...


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_gpu_command_enables_sleep_mode_and_the_admin_endpoints(tmp_path: Path) -> None:
    spec = VllmSpec(
        model="/models/llama",
        served_model_name="llama",
        host="10.0.0.5",
        gpu_memory_utilization=0.85,
        extra_args=("--tensor-parallel-size", "1"),
    )
    cmd = vllm_command(spec, 8123, tmp_path, device="3")
    argv = cmd.argv
    assert argv[:3] == (sys.executable, "-m", "vllm.entrypoints.openai.api_server")
    assert "--enable-sleep-mode" in argv and "--enable-prefix-caching" in argv
    assert (flag(argv, "--model"), flag(argv, "--served-model-name")) == ("/models/llama", "llama")
    assert (flag(argv, "--host"), flag(argv, "--port")) == ("10.0.0.5", "8123")
    assert flag(argv, "--gpu-memory-utilization") == "0.85"
    assert "--max-model-len" not in argv  # the model's own unless asked
    assert "--enforce-eager" not in argv  # CUDA graphs stay on
    assert argv[-2:] == ("--tensor-parallel-size", "1")  # the operator's flags win
    assert cmd.env[ADMIN] == "1" and cmd.env["CUDA_VISIBLE_DEVICES"] == "3"


def test_gpu_command_without_a_device_leaves_cuda_visible_devices_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    cmd = vllm_command(VllmSpec(model="m", max_model_len=8192), 8000, tmp_path)
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert flag(cmd.argv, "--max-model-len") == "8192"


def test_cpu_command_follows_the_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")  # would shadow the vLLM venv's packages
    spec = VllmSpec(flavour="cpu", model="/m", kv_cache_gib=2, python="/opt/vllm/bin/python")
    cmd = vllm_command(spec, 9000, tmp_path)
    argv = cmd.argv
    assert argv[:3] == ("/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    assert "--enable-sleep-mode" not in argv  # rejected by the CPU build
    assert "--enforce-eager" in argv and "--enable-prefix-caching" in argv
    assert flag(argv, "--dtype") == "float32"
    assert flag(argv, "--distributed-executor-backend") == "uni"
    assert flag(argv, "--max-model-len") == "4096"
    env = cmd.env
    assert env[ADMIN] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["TMPDIR"] == str(tmp_path)  # ZMQ socket files go with the replica
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path))
    assert env["HF_HUB_OFFLINE"] == "1" and "PYTHONPATH" not in env


async def test_a_failed_spawn_gives_its_gpu_device_back() -> None:
    launcher = VllmLauncher(
        VllmSpec(model="m", python="/nonexistent/python", devices=("7",), ready_timeout_s=1)
    )
    for _ in range(2):  # the second try would be refused if the device had leaked
        with pytest.raises(FileNotFoundError):
            await launcher.launch()


async def test_a_launcher_with_every_device_taken_refuses() -> None:
    # `false` as the interpreter: the "server" exits at once, holding the device till then.
    launcher = VllmLauncher(VllmSpec(model="m", python="false", devices=("0",), ready_timeout_s=30))
    first = asyncio.create_task(launcher.launch())
    await asyncio.sleep(0)  # the first launch has taken device 0 and is starting
    with pytest.raises(LaunchRefused, match="all 1 GPU devices are in use"):
        await launcher.launch()
    with pytest.raises(RuntimeError, match="exited"):
        await first


async def test_static_endpoints_are_managed_elsewhere() -> None:
    static = StaticEndpoints(["http://a:8000/", "http://b:8000"])
    assert static.urls == ("http://a:8000", "http://b:8000") and not static.managed
    with pytest.raises(LaunchRefused, match="only wakes, sleeps and routes"):
        await static.launch()
    with pytest.raises(LaunchRefused, match="static endpoint"):
        await static.stop("http://a:8000")
    with pytest.raises(ValueError, match="distinct"):
        StaticEndpoints(["http://a", "http://a/"])
    with pytest.raises(ValueError, match="distinct"):
        StaticEndpoints([])


async def test_every_launcher_fits_the_protocol() -> None:
    launchers: list[Launcher] = [
        SimulatorLauncher(),
        VllmLauncher(VllmSpec(model="m")),
        StaticEndpoints(["http://a"]),
    ]
    assert [la.managed for la in launchers] == [True, True, False]
    await launchers[0].stop("http://never-launched")  # stopping the unknown is a no-op


def test_a_vllm_launcher_knows_no_lab_defaults(tmp_path: Path) -> None:
    # The model and the interpreter are the operator's: no test model, no lab venv.
    with pytest.raises(ValueError, match="model"):
        VllmSpec()
    cmd = vllm_command(VllmSpec(flavour="cpu", model="/m"), 9000, tmp_path)
    assert cmd.argv[0] == sys.executable


def _running_with(marker: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


async def test_a_launch_cancelled_while_the_replica_starts_leaves_no_process() -> None:
    # A pool that stops mid-launch cancels the launch; the thread still starting the
    # simulator must not leave it running with nobody owning it.
    marker = f"cancelled-launch-{os.getpid()}"
    launcher = SimulatorLauncher(model=marker)
    task = asyncio.create_task(launcher.launch())
    for _ in range(200):  # until the process exists (it is starting in the thread)
        if _running_with(marker):
            break
        await asyncio.sleep(0.02)
    assert _running_with(marker), "the simulator never started"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(500):  # the thread finishes the start, then kills what it started
        if not _running_with(marker):
            break
        await asyncio.sleep(0.05)
    assert not _running_with(marker)
