"""The README's commands work as written.

Every ```bash block of "Running it yourself" is typed, command by command, into one
bash on a pseudo-terminal (tests/readme_shell.py), in the repository root, exactly as
a reader would: ``export`` and background jobs carry over, confirmation prompts are
answered "y", ``--follow`` is ended with Ctrl-C. grpcurl, where it is not installed,
is a shell function running tests/grpcurl_reflection.py, a reflection-only client that
asks ``grpc.reflection.v1`` as grpcurl does.

Every other ```bash block of the README must be listed in NOT_RUN with the reason and
the test that runs it, so a new block fails here until someone decides.

A command that the control plane refuses (exit 1) or cannot reach (exit 3) is typed
again for up to RETRY_S, as a person would while a fresh deployment elects its leader
and its regions turn HEALTHY; any other failure fails at once. The README's fixed
ports must be free (the test says which is not).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.readme_shell import Result, Terminal, commands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RUN_SECTION = "## Running it yourself"
# First command line of a block -> why this test does not type it.
NOT_RUN = {
    "scripts/demo.sh": "the demo and the test command: tests/test_demo.py runs the demo; "
    "CI runs scripts/test.sh",
}
PORTS = (
    2379,
    2380,
    8000,
    8001,
    8002,
    8003,
    8080,
    8081,
    8082,
    50051,
    50052,
    50061,
    50062,
    50063,
    50064,
    9101,
    9102,
    9103,
    9104,
)
BUSY_WAIT_S = 90.0  # for a port in the ephemeral range held by a passing connection
RETRY_S = 45.0
RETRY_CODES = (1, 3)
FOLLOW_S = 3.0
LOGS = Path("/tmp/tectonic")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def bash_blocks() -> Iterator[tuple[str, str]]:
    """(section heading, block text) of every ```bash block, in order."""
    section, block, inside = "", [], False
    for line in README.read_text().splitlines():
        if not inside and line.startswith("## "):
            section = line.strip()
        if line.startswith("```"):
            if inside:
                yield section, "\n".join(block)
                block, inside = [], False
            elif line.strip() == "```bash":
                inside = True
            continue
        if inside:
            block.append(line)


def first_line(block: str) -> str:
    return block.strip().splitlines()[0].split("#")[0].strip()


def test_every_block_is_run_or_says_why_not() -> None:
    seen = set()
    for section, block in bash_blocks():
        if section == RUN_SECTION:
            continue
        head = first_line(block)
        reasons = [k for k in NOT_RUN if head.startswith(k)]
        assert reasons, (
            f"README block under {section!r} starting {head!r} is neither run by "
            "test_running_it_yourself nor listed in NOT_RUN"
        )
        seen.update(reasons)
    assert seen == set(NOT_RUN), (
        f"NOT_RUN lists blocks the README no longer has: {set(NOT_RUN) - seen}"
    )
    assert any(s == RUN_SECTION for s, _ in bash_blocks())


def _busy(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _holders(ports: list[int]) -> str:
    """What `ss` says holds ``ports`` (empty if it cannot say)."""
    try:
        out = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    marks = tuple(f":{p} " for p in ports)
    return "\n".join(line for line in out.splitlines() if any(m in line for m in marks))


def _wait_until_free(ports: tuple[int, ...]) -> list[int]:
    """The README's ports still taken after BUSY_WAIT_S. Some lie in the kernel's
    ephemeral range (50051-50064), where any outgoing connection may hold one a while as
    its source port (seen in CI: 50064, with a suite of tests' connections about)."""
    deadline = time.monotonic() + BUSY_WAIT_S
    while True:
        busy = [p for p in ports if _busy(p)]
        if not busy or time.monotonic() > deadline:
            return busy
        time.sleep(1.0)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTEST"))}
    # A reader's PATH: no venv active (the README activates it), the system's tools.
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if ".venv" not in p
    )
    env.update(TERM="dumb", COLUMNS="160", PYTHONUNBUFFERED="1")
    return env


def _logs() -> str:
    tails = []
    for log in sorted(LOGS.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-15:]
        tails.append(f"--- {log.name}\n" + "\n".join(lines))
    return "\n".join(tails)


def _type(term: Terminal, command: str) -> Result:
    if "--follow" in command:
        r = term.run(command, timeout=60, interrupt_after=FOLLOW_S)
        # Ended by our Ctrl-C, not by an error of its own.
        assert r.rc in (0, 130) and "error" not in r.output.lower(), (r.rc, r.output)
        return r
    deadline = time.monotonic() + RETRY_S
    while True:
        r = term.run(command, timeout=240)
        if r.rc == 0 or r.rc not in RETRY_CODES or time.monotonic() > deadline:
            return r
        time.sleep(2)


def test_running_it_yourself() -> None:
    busy = _wait_until_free(PORTS)
    if busy:
        pytest.fail(
            f"the README's ports {busy} are taken on this machine; free them first\n"
            + _holders(busy)
        )
    shutil.rmtree(LOGS, ignore_errors=True)
    term = Terminal(ROOT, _env())
    ran: list[Result] = []
    try:
        if shutil.which("grpcurl", path=_env()["PATH"]) is None:
            term.run('grpcurl() { .venv/bin/python -m tests.grpcurl_reflection "$@"; }', timeout=10)
        for section, block in bash_blocks():
            if section != RUN_SECTION:
                continue
            for command in commands(block):
                r = _type(term, command)
                ran.append(r)
                assert r.rc == 0, (
                    f"README command failed (exit {r.rc}):\n{command}\n--- output\n"
                    f"{r.output}\n{_logs()}"
                )
        jobs = term.run("jobs -l", timeout=10)
        assert "Running" in jobs.output and not re.search(r"\b(Exit|Done|Killed)\b", jobs.output), (
            f"a server the README started has stopped:\n{jobs.output}\n{_logs()}"
        )
    finally:
        term.close()
    out = {r.command.split("#")[0].strip(): r.output for r in ran}

    def said(part: str) -> str:
        return next(v for k, v in out.items() if part in k)

    # The commands did what the README says, not merely exit 0.
    assert "x-tectonic-region: us-east" in said("localhost:8080/v1/chat/completions")
    assert "us-west" in said("failoverctl failover us-east --to us-west")
    # conv-1 was pinned in us-east by the curl and sent nothing during the failover:
    # it was never served elsewhere, so it keeps its home pin (issue 27: no bulk re-pin).
    pinned = said("failoverctl sessions get conv-1 --json")
    assert '"home": "us-east"' in pinned and '"region": "us-east"' in pinned, pinned
    assert '"moves": 0' in pinned, pinned
    listed = said("grpcurl -plaintext 127.0.0.1:50051 list").split()
    assert "tectonic.v1.ControlPlane" in listed and "grpc.reflection.v1.ServerReflection" in listed
    assert '"regions"' in said(
        "grpcurl -plaintext 127.0.0.1:50051 tectonic.v1.ControlPlane/GetStatus"
    )
    assert '"plan"' in said("grpcurl -plaintext -d")
