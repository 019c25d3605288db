"""Run shell commands as a person at a terminal would: one bash on a pseudo-terminal,
commands typed in order, confirmation prompts answered "y", long-following commands
ended with Ctrl-C. Used by tests/test_readme.py to run the README's blocks as written.

One shell for the whole session, so that ``export`` and background jobs (``&``) carry
from one command to the next exactly as they do for a reader following the README.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_OPENERS = re.compile(r"^\s*(for|while|until|if|case)\b")
_CLOSERS = re.compile(r"^\s*(done|fi|esac)\b")
_PROMPT = re.compile(r"\[y/N\]:\s*$")
_MARK = "__README_RC__"


@dataclass(frozen=True)
class Result:
    command: str
    rc: int
    output: str


def commands(block: str) -> Iterator[str]:
    """The block's logical commands: continuation lines joined, loops kept whole,
    comment-only and blank lines dropped."""
    pending: list[str] = []
    depth = 0
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending.append(line)
        if _OPENERS.match(line):
            depth += 1
        if _CLOSERS.match(line):
            depth -= 1
        if depth == 0 and not line.rstrip().endswith("\\"):
            yield "\n".join(pending)
            pending = []
    if pending:
        raise ValueError(f"unterminated command in block: {pending!r}")


class Terminal:
    """An interactive bash on a pty, in a session of its own."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: bash with no rc files, no prompts, no echo
            try:
                os.chdir(cwd)
                attrs = termios.tcgetattr(0)
                attrs[3] &= ~termios.ECHO
                termios.tcsetattr(0, termios.TCSANOW, attrs)
                os.execve("/bin/bash", ["bash", "--noprofile", "--norc", "-i"], env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self._n = 0
        self.run("PS1=''; PS2=''", timeout=20)

    def _read(self, wait: float) -> str:
        ready, _, _ = select.select([self.fd], [], [], wait)
        if not ready:
            return ""
        try:
            return os.read(self.fd, 65536).decode(errors="replace")
        except OSError:  # the shell is gone
            return ""

    def run(self, command: str, *, timeout: float, interrupt_after: float | None = None) -> Result:
        """Type ``command``; answer y/N prompts; with ``interrupt_after`` press Ctrl-C
        after that many seconds. Returns its exit status and what it printed."""
        self._n += 1
        mark = f"{_MARK}{self._n}="
        # One input unit: bash parses the braces and the printf before running any of
        # it, so a prompt inside the command cannot eat the printf as its answer.
        text = "{ " + command + "\n}; printf '\\n" + mark + '%s\\n\' "$?"\n'
        os.write(self.fd, text.encode())
        out, start, interrupted = "", time.monotonic(), False
        while True:
            found = re.search(re.escape(mark) + r"(\d+)", out)
            if found:
                return Result(command, int(found.group(1)), out[: found.start()].strip())
            elapsed = time.monotonic() - start
            if interrupt_after is not None and elapsed > interrupt_after and not interrupted:
                os.write(self.fd, b"\x03")
                interrupted = True
            if elapsed > timeout:
                os.write(self.fd, b"\x03")
                raise TimeoutError(f"still running after {timeout:.0f}s: {command}\n{out}")
            chunk = self._read(0.2)
            out += chunk
            if chunk and _PROMPT.search(out):
                os.write(self.fd, b"y\n")
                out += "<answered y>\n"

    def close(self) -> None:
        """End the shell and every process it started (they share its session)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in session_members(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 10
            while session_members(self.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        os.close(self.fd)


def session_members(sid: int) -> list[int]:
    """Processes (not zombies) whose session is ``sid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, fields[3] the session id (stat(5): fields 3 and 6)
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found
