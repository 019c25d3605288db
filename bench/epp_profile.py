"""Where the endpoint picker's CPU goes, for ``python -m bench epp --profile-picker FILE``.

py-spy samples the running picker with native frames (``py-spy record --native
--format raw``) while the bench measures, then :func:`summary` sorts the samples in
which a thread was busy (not waiting in ``epoll``) by where the innermost frame is:
gRPC's Cython core, the system calls it makes, protobuf (upb), asyncio, and the
picker's own Python (building and reading messages, the decision itself).

Why py-spy and not cProfile: gRPC's aio server runs in Cython, which cProfile cannot
see; it bills that time to whichever Python coroutine happens to be awaiting (measured
here: a sixth of the picker's time landed on its idle etcd watch loop). py-spy is not a
dependency of the project: ``pip install py-spy`` to profile. It pauses the picker
to read its stacks, so a profiled run's figures are not comparable with others.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

RATE = 100  # samples per second: enough for shares, light enough on 2 cores
IDLE = ("epoll_wait", "epoll_pwait")  # a thread waiting for work
SYSCALLS = ("sendmsg", "write", "writev", "recv", "recvmsg", "recvfrom", "read", "getpid")


def py_spy() -> str | None:
    """py-spy beside this interpreter (a venv), else on ``PATH``; None if neither."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def start(pid: int, out: str) -> subprocess.Popen[bytes]:
    """Sample ``pid`` into ``out`` until :func:`stop`."""
    binary = py_spy()
    if binary is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    argv = [binary, "record", "--native", "--threads", "--format", "raw", "--rate", str(RATE)]
    argv += ["--output", out, "--pid", str(pid)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop(sampler: subprocess.Popen[bytes]) -> None:
    """SIGINT: py-spy writes its samples and exits."""
    sampler.send_signal(signal.SIGINT)
    _, err = sampler.communicate(timeout=60)
    if sampler.returncode not in (0, -signal.SIGINT):
        raise RuntimeError(f"py-spy failed ({sampler.returncode}): {err.decode()[-500:]}")


def _python_category(frame: str) -> str:
    if "regions/picker/extproc.py" in frame or "regions/picker/service.py" in frame:
        return "picker_messages"
    if "regions/" in frame or "controlplane/" in frame:
        return "decision"
    for name, marker in (
        ("metrics", "prometheus_client"),
        ("grpc", "grpc/"),
        ("asyncio", "asyncio/"),
        ("protobuf", "protobuf"),
    ):
        if marker in frame:
            return name
    return "other_python"


def category(frames: list[str]) -> str | None:
    """Where one sample's thread was (None: idle). C code is known by its library,
    the interpreter's own C by the innermost Python frame above it."""
    leaf = frames[-1]
    name = leaf.split(" ", 1)[0]
    if name.startswith(IDLE):
        return None
    if name in SYSCALLS:
        return f"syscall_{name}"
    if name == "syscall":  # futex: a thread handing work to another
        return "syscall_futex"
    if "_message.abi3" in leaf or "upb" in leaf:
        return "protobuf"
    if "cygrpc" in leaf:
        return "grpc"
    if "loop.c" in leaf or "uv_" in leaf or "uv__" in leaf:
        return "uvloop"
    for frame in reversed(frames):
        if ".py:" in frame:
            return _python_category(frame)
    return "other_native"


def summary(path: str, top: int = 12) -> dict[str, object]:
    """Busy samples' shares by category and by thread, and the busiest leaf frames."""
    by_category: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        where = category(frames)
        if where is None or not count.isdigit():
            continue
        n = int(count)
        by_category[where] += n
        by_thread[frames[0].split(":", 1)[-1].strip()] += n
        leaves[frames[-1]] += n
    busy = sum(by_category.values()) or 1

    def shares(counter: Counter[str], most: int | None = None) -> dict[str, float]:
        return {k: round(v / busy, 3) for k, v in counter.most_common(most)}

    return {
        "tool": "py-spy --native",
        "busy_samples": sum(by_category.values()),
        "share": shares(by_category),
        "threads": shares(by_thread),
        "top_leaves": shares(leaves, top),
    }
