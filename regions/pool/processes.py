"""Local server processes for the warm pool's launchers: start one with its output in a
log file, wait until it is ready, stop it (its whole process group when it has one).

Nothing here is global: a process lives as long as whoever started it holds it, and the
launcher that started a replica stops it. (The test lab keeps its own table of what it
started, to kill leftovers when a test forgets; a region agent has no such table.)
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS may hand it out again later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A child process with its log file and, once it serves, its URL.

    ``group``: the process leads a session of its own (``start_new_session``), and
    stopping it signals the whole group, so servers that fork (vLLM) leave nothing
    behind. ``tmp``: a private directory removed when the process is closed.
    ``keep_log``: leave the log file when closed (else it is removed with the process).
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        log_path: Path,
        name: str,
        *,
        tmp: Path | None = None,
        group: bool = False,
        keep_log: bool = False,
    ) -> None:
        self.popen, self.log_path, self.name = popen, log_path, name
        self.tmp, self.group, self.keep_log = tmp, group, keep_log
        self.url = ""
        self.port = 0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def signal_kill(self) -> None:
        """SIGKILL only, for a process another thread waits on: that thread sees it die
        and reaps it (closing its pipe here could hand the thread another file's)."""
        if self.group:
            self._signal_group(signal.SIGKILL)
        elif self.alive():
            self.popen.send_signal(signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL and reap: the process dies without any chance to clean up."""
        if self.group:
            self._signal_group(signal.SIGKILL)
        elif self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()
        self._close()

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait for a clean exit (SIGKILL after ``timeout``, and for a group
        every straggler); returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        if self.group:
            self._signal_group(signal.SIGKILL)
        elif self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()
        self._close()
        return int(self.popen.returncode)

    def _close(self) -> None:
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if not self.keep_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, pid={self.pid}, url={self.url!r})"


def start_process(
    argv: Sequence[str],
    name: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout_pipe: bool = False,
    group: bool = False,
    tmp: Path | None = None,
) -> ServerProcess:
    """Start ``argv`` with its output in a temp log file (stdout in a pipe instead with
    ``stdout_pipe``, for :func:`read_ready`)."""
    fd, log_name = tempfile.mkstemp(prefix=f"tectonic-{name}-", suffix=".log")
    try:
        with os.fdopen(fd, "wb") as log_file:
            popen = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdout_pipe else log_file,
                stderr=log_file if stdout_pipe else subprocess.STDOUT,
                start_new_session=group,
            )
    except OSError:
        Path(log_name).unlink(missing_ok=True)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ServerProcess(popen, Path(log_name), name, tmp=tmp, group=group)


def read_ready(proc: ServerProcess, deadline: float) -> str:
    """The address from the ``READY <address>`` line the process prints on stdout
    (the simulator, agents and gateways print one); kills it and raises with its log
    if none comes before ``deadline``."""
    out = proc.popen.stdout
    assert out is not None
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([out], [], [], 0.1)
        if ready:
            chunk = os.read(out.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith("READY "):
                    return line.split()[1]
        elif not proc.alive():
            break
    log = proc.log()
    proc.kill()
    raise RuntimeError(f"{proc.name} did not become ready; log:\n{log}")


def wait_ready(proc: ServerProcess, timeout: float) -> ServerProcess:
    """Read the process's ``READY`` address (its URL and port), then wait until its
    ``/health`` answers 200; kills it and raises if either does not come in time."""
    deadline = time.monotonic() + timeout
    proc.url = read_ready(proc, deadline)
    proc.port = int(proc.url.rsplit(":", 1)[1])
    try:
        wait_http_ok(proc.url + "/health", deadline)
    except RuntimeError:
        proc.kill()
        raise
    return proc


def wait_http_ok(url: str, deadline: float) -> None:
    """Poll ``url`` until it answers 200 or the deadline passes."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = e
        time.sleep(0.05)
    raise RuntimeError(f"{url} not OK in time: {last!r}")


def wait_healthy(proc: ServerProcess, timeout: float, what: str = "server") -> ServerProcess:
    """Wait until ``proc.url + "/health"`` answers 200; kill the process and raise with
    its log if it exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            code, log = proc.popen.returncode, proc.log(8000)
            proc.kill()
            raise RuntimeError(f"{what} exited with {code} during start-up; log:\n{log}")
        try:
            with urllib.request.urlopen(proc.url + "/health", timeout=1.0) as resp:
                if resp.status == 200:
                    return proc
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    log = proc.log(8000)
    proc.kill()
    raise RuntimeError(f"{what} not healthy within {timeout} s; log:\n{log}")
