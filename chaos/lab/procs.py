"""Launching real processes for tests: free ports, simulator replicas, cleanup.

``start_simulator()`` starts ``python -m regions.simulator`` on ``--port 0`` (or a
given port), reads the ``READY http://host:port`` line it prints, checks ``/health``
and returns a :class:`Proc`. Every process started here is killed at interpreter
exit if a test forgot to. Logs go to a temp file (``Proc.log()``) so a failing
start shows why; they are removed at exit unless ``TECTONIC_KEEP_LOGS=1``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from regions.pool import processes
from regions.pool.processes import ServerProcess, read_ready

REPO = Path(__file__).resolve().parents[2]
_LIVE: set[Proc] = set()
_LOGS: list[Path] = []  # removed at exit unless TECTONIC_KEEP_LOGS=1


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "proto")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Proc(ServerProcess):
    """A child process started by a test or the lab, with its log file and (for servers)
    its URL; on the lab's table until it is stopped, so that the interpreter's exit kills
    what a test forgot. Its log stays for ``log()`` after it stopped (removed at exit)."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        log_path: Path,
        name: str,
        *,
        tmp: Path | None = None,
        group: bool = False,
    ) -> None:
        super().__init__(popen, log_path, name, tmp=tmp, group=group, keep_log=True)
        self.http_url = ""  # a picker's /metrics and /health (its url is gRPC)
        _LIVE.add(self)
        _LOGS.append(log_path)

    def _close(self) -> None:
        super()._close()
        _LIVE.discard(self)


def spawn(args: Sequence[str], name: str, *, stdout_pipe: bool = False) -> Proc:
    """Start ``python <args>`` from the repo root with logs in a temp file."""
    fd, log_name = tempfile.mkstemp(prefix=f"tectonic-{name}-", suffix=".log")
    with os.fdopen(fd, "wb") as log_file:
        popen = subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else log_file,
            stderr=log_file,
        )
    return Proc(popen, Path(log_name), name)


async def until(
    predicate: Callable[[], Awaitable[bool]],
    *,
    within: float = 20.0,
    every: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll an async predicate until it holds; fail the test after ``within`` seconds.

    For waiting on other processes (no event to await). ``within`` is a generous
    ceiling, never a pass criterion: tests assert behaviour, not speed.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        if await predicate():
            return
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not hold within {within} s")
        await asyncio.sleep(every)


def launch_simulator(
    *,
    port: int = 0,
    model: str = "tiny",
    block_size: int = 16,
    extra_args: Sequence[str] = (),
    name: str = "sim",
) -> Proc:
    """Start a simulator without waiting for it (see :func:`wait_ready`)."""
    args = [
        "-m",
        "regions.simulator",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        model,
        "--block-size",
        str(block_size),
        *extra_args,
    ]
    return spawn(args, name, stdout_pipe=True)


def wait_ready(proc: Proc, timeout: float = 20.0) -> Proc:
    """The product's wait (READY line, then /health), keeping the lab's type."""
    processes.wait_ready(proc, timeout)
    return proc


def start_simulator(
    *,
    port: int = 0,
    model: str = "tiny",
    block_size: int = 16,
    extra_args: Sequence[str] = (),
    name: str = "sim",
    timeout: float = 20.0,
) -> Proc:
    """Start one simulator and wait until ``/health`` answers 200."""
    proc = launch_simulator(
        port=port, model=model, block_size=block_size, extra_args=extra_args, name=name
    )
    return wait_ready(proc, timeout)


def start_simulators(
    n: int,
    *,
    model: str = "tiny",
    block_size: int = 16,
    extra_args: Sequence[str] = (),
    timeout: float = 20.0,
) -> list[Proc]:
    """Start ``n`` simulators in parallel (all spawned first, then awaited)."""
    procs = [
        launch_simulator(model=model, block_size=block_size, extra_args=extra_args, name=f"sim{i}")
        for i in range(n)
    ]
    try:
        return [wait_ready(p, timeout) for p in procs]
    except BaseException:
        for p in procs:
            p.kill()
        raise


def start_agent(
    *,
    region: str,
    control_planes: Sequence[str],
    replicas: Sequence[str],
    interval: float = 0.25,
    timeout: float = 0.25,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 20.0,
    listen: str = "127.0.0.1:0",
) -> Proc:
    """Start ``python -m regions.agent`` (on a free port unless ``listen`` names one);
    ``Proc.url`` is its gRPC target."""
    args = [
        "-m",
        "regions.agent",
        "--region",
        region,
        "--listen",
        listen,
        "--control-plane",
        ",".join(control_planes),
        "--interval",
        str(interval),
        "--timeout",
        str(timeout),
        *extra_args,
    ]
    for url in replicas:
        args += ["--replica", url]
    proc = spawn(args, f"agent-{region}", stdout_pipe=True)
    proc.url = read_ready(proc, time.monotonic() + ready_timeout)
    proc.port = int(proc.url.rsplit(":", 1)[1])
    return proc


def start_controlplane(
    topology: str | Path,
    replica_id: str,
    *,
    listen: str = "127.0.0.1:0",
    extra_args: Sequence[str] = (),
    ready_timeout: float = 30.0,
    prewarm_hold_s: float = 0.0,
) -> Proc:
    """Start ``python -m controlplane``; ``Proc.url`` is its gRPC target once it serves.
    ``prewarm_hold_s`` > 0: the lab's replica whose pre-warm only waits that long
    (chaos/lab/controlplane.py), so a leader can be killed mid-failover."""
    module = ["chaos.lab.controlplane", "--prewarm-hold-s", f"{prewarm_hold_s:g}"]
    args = [
        "-m",
        *(module if prewarm_hold_s > 0 else ["controlplane"]),
        "--topology",
        str(topology),
        "--id",
        replica_id,
        "--listen",
        listen,
        *extra_args,
    ]
    proc = spawn(args, f"cp-{replica_id}", stdout_pipe=True)
    proc.url = read_ready(proc, time.monotonic() + ready_timeout)
    proc.port = int(proc.url.rsplit(":", 1)[1])
    return proc


def start_gateway(
    topology: str | Path,
    region: str,
    *,
    control_planes: Sequence[str] = (),
    listen: str = "127.0.0.1:0",
    extra_args: Sequence[str] = (),
    ready_timeout: float = 30.0,
) -> Proc:
    """Start ``python -m regions.gateway`` with home ``region`` (reporting what its
    requests saw to ``control_planes`` when given); ``Proc.url`` is its base URL once
    it serves."""
    args = [
        "-m",
        "regions.gateway",
        "--topology",
        str(topology),
        "--region",
        region,
        "--listen",
        listen,
        *extra_args,
    ]
    if control_planes:
        args += ["--control-plane", ",".join(control_planes)]
    proc = spawn(args, f"gw-{region}", stdout_pipe=True)
    proc.url = read_ready(proc, time.monotonic() + ready_timeout)
    proc.port = int(proc.url.rsplit(":", 1)[1])
    return proc


def start_picker(
    topology: str | Path,
    region: str,
    *,
    control_planes: Sequence[str] = (),
    listen: str = "127.0.0.1:0",
    http_port: int = 0,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 30.0,
    name: str = "",
) -> Proc:
    """Start ``python -m regions.picker`` (tectonic-epp) for ``region``'s Envoy;
    ``Proc.url`` is its ext_proc address (``grpc://host:port``) once it serves, and
    ``Proc.port`` its port. Its ``/metrics`` and ``/health`` are on 127.0.0.1:
    ``http_port`` (0: a free port), ``Proc.http_url``."""
    http_port = http_port or processes.free_port()
    http_listen = f"127.0.0.1:{http_port}"
    args = [
        "-m",
        "regions.picker",
        "--topology",
        str(topology),
        "--region",
        region,
        "--listen",
        listen,
        "--http-listen",
        http_listen,
        *extra_args,
    ]
    if control_planes:
        args += ["--control-plane", ",".join(control_planes)]
    proc = spawn(args, name or f"epp-{region}", stdout_pipe=True)
    proc.url = read_ready(proc, time.monotonic() + ready_timeout)
    proc.port = int(proc.url.rsplit(":", 1)[1])
    proc.http_url = f"http://{http_listen}"
    return proc


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            proc.kill()
    if os.environ.get("TECTONIC_KEEP_LOGS") != "1":
        for path in _LOGS:
            path.unlink(missing_ok=True)
