"""Every ``failoverctl`` command the runbooks show (runbooks/*.md, in code spans), run as
written against a lab (issue 34, item 3).

``tests/unit/test_alert_runbooks.py`` checks that each command parses; this test runs
them: the installed CLI as a subprocess against a lab of real processes (etcd, a
simulator, an agent and a gateway per region, two control-plane replicas). Each
distinct command is run once, its placeholders filled with the lab's values (``R`` /
``REGION`` a region, ``S`` and ``T`` the other two, ``SESSION`` a session the lab's
gateway pinned, ``WHY`` a reason, ``CP:50051`` a control-plane replica), through a
config file whose contexts (``lab``, ``prod-eu``, ``staging``) all name the lab, so
that ``--context prod-eu`` and ``config use-context staging`` run too. stdin is a
terminal on which the operator answers "y", so a change asks and goes ahead as it would
for a person.

The order is one that makes sense on a lab: what only reads first (dry runs included),
then the changes: contexts, a session pin, pause then resume, hold then release, the
readiness override and the capacity probe, then each real failover followed by a
recovery of its region (a recovery with no failover of its region left gets one made
for it first, by a set-up command that is not counted).

Every command exits 0, but those ``EXPECTED`` lists with the exit code and message the
lab must give and why. ``FRAGMENTS`` lists the spans that are not whole commands
(prose naming the tool, a command or an option): each must end in click's usage error
(exit 2; run in this process, as it fails before anything is called) and nothing else
may. Commands naming what the lab lacks (a model pool, a drill run)
are skipped, each with its reason. No output may hold a traceback.

Only exit codes, messages and states are judged, each state waited for up to a minute,
so scripts/test.sh runs this module beside the benches' smoke tests (OUTCOMES_ONLY
there): add nothing that times or judges a latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import re
import shlex
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc
from typer.testing import CliRunner

from chaos.drills.traffic import MODEL, SESSION_HEADER
from chaos.lab.deployment import LocalDeployment
from chaos.lab.procs import until
from chaos.lab.run import running_lab
from chaos.lab.spec import DeploymentSpec
from controlplane.cli.client import EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE
from controlplane.cli.failoverctl import app as failoverctl_app
from tests.unit.alert_rules_helpers import runbook_pages
from tests.unit.test_alert_runbooks import failoverctl_commands, failoverctl_root

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(240)]

CLI = str(Path(sys.executable).with_name("failoverctl"))
SPEC = DeploymentSpec(replicas_per_region=1)  # three regions, two control-plane replicas
R, S, T = SPEC.regions  # us-east, us-west, us-central
SESSION = "runbook-conv-1"
WHY = "INC-123: runbook command test"
ACTOR = "runbook-test"

# Code spans that are not whole commands: prose naming the tool, a command or an option
# (a required argument or option left out). Each must end in click's usage error, exit 2.
FRAGMENTS = {
    "failoverctl": "names the tool (README, capacity-*: 'failoverctl is in .venv/bin')",
    "failoverctl --server 127.0.0.1:50051": "the global option to put before a command",
    "failoverctl --server CP:50051": "the global option to put before a command",
    "failoverctl failover": "names the command in prose ('manual commands still work')",
    "failoverctl failover us-east": "README: which pools a failover acts on; no reason",
    "failoverctl failover us-east --model M": "README: the same, for --model; no reason",
    "failoverctl recover": "names the command in prose ('stays until someone runs ...')",
    "failoverctl recover R": "prose: 'an operator ran ...', 'stays until ...'; no reason",
    "failoverctl pause --for": "names the option in prose ('what pause --for said')",
    "failoverctl drill show": "names the command in prose ('the path drill show names')",
}
_USAGE_ERROR = re.compile(
    r"Missing command|Missing argument|Missing option|requires an argument|Usage: failoverctl"
)

# Commands the lab answers with something else than exit 0: (exit code, what the message
# says, why that is the right answer here).
_NO_VERDICT = (
    EXIT_REFUSED,
    "has no drill verdict: nothing to override",
    "no drill has run in the lab, so no region has a failed verdict to override: the "
    "control plane refuses (FAILED_PRECONDITION), as the README says it does",
)
_NO_DRILL_SERVICE = (
    EXIT_UNREACHABLE,
    "no drill service is running",
    "the lab runs no drill service (a probe takes minutes): failoverctl says so at once, "
    "queues nothing and exits 3, as the README says it does",
)
_NO_BUDGETS = (
    EXIT_REFUSED,
    "has no cost: section",
    "the lab's topology prices nothing (no cost: section), so no budget binds and none "
    "can be lifted: the control plane refuses (FAILED_PRECONDITION) and changes nothing",
)
_DOCTOR_ANSWERS = (
    EXIT_REFUSED,
    "cold-start (activation) p95",
    "doctor exits 1 while a line is not PASS, and the lab cannot pass them all (no drill "
    "in 7 days, no wake measured, no capacity probe): it answers every question and says so",
)
EXPECTED: dict[str, tuple[int, str, str]] = {
    "failoverctl doctor --region R": _DOCTOR_ANSWERS,
    'failoverctl readiness override REGION -r "INC-77: harness bug"': _NO_VERDICT,
    'failoverctl readiness override R --reason "INC-123: drill aborted by a runner crash"': (
        _NO_VERDICT
    ),
    "failoverctl capacity probe REGION -r WHY": _NO_DRILL_SERVICE,
    "failoverctl capacity probe R -r WHY": _NO_DRILL_SERVICE,
    "failoverctl cost lift R --reason WHY --for 1h": _NO_BUDGETS,
    "failoverctl cost unlift R --reason WHY": _NO_BUDGETS,
}

# What each command does, by its path: those that only read, then the changes by phase,
# in the order they run. A command of no phase fails the test: place it here.
READ_ONLY = {
    (),  # failoverctl --help
    ("status",),
    ("regions",),
    ("history",),
    ("events",),
    ("readiness",),
    ("drill", "list"),
    ("drill", "schedule"),
    ("drill", "show"),
    ("capacity", "show"),
    ("scale", "show"),
    ("cost", "show"),
    ("sessions", "get"),
    ("config", "view"),
    ("doctor",),
}
CHANGES = {
    ("config", "use-context"): "contexts",
    ("sessions", "pin"): "pin",
    ("pause",): "pause",
    ("resume",): "pause",
    ("hold",): "hold",
    ("release",): "hold",
    ("cost", "lift"): "lift",
    ("cost", "unlift"): "lift",
    ("readiness", "override"): "override",
    ("capacity", "probe"): "probe",
    ("failover",): "move",
    ("recover",): "move",
}


@dataclass
class Run:
    command: str  # as the runbook shows it
    argv: list[str]  # its words, placeholders filled
    path: tuple[str, ...]  # its command, e.g. ("sessions", "pin")
    kind: str  # "read", a phase of CHANGES, "fragment" or "skipped"
    why: str = ""  # a fragment's or a skipped command's reason
    code: int | None = None
    output: str = ""
    took_s: float = 0.0

    @property
    def expected(self) -> int:
        return EXPECTED[self.command][0] if self.command in EXPECTED else EXIT_OK

    def outcome(self) -> str:
        if self.kind in ("skipped", "fragment"):
            return self.kind
        if self.code is None:
            return "not run"
        if self.code != self.expected:
            return "FAILED"
        return "ok" if self.code == EXIT_OK else "refused"


def runbook_commands() -> list[str]:
    """Every distinct ``failoverctl`` command of the runbooks, in page order."""
    seen: dict[str, None] = {}
    for page in runbook_pages():
        for _, command, _ in failoverctl_commands(page.read_text()):
            seen.setdefault(command, None)
    return list(seen)


def command_path(root: Any, words: list[str]) -> tuple[str, ...]:
    """The (sub)command ``words`` (after ``failoverctl``) run, e.g. ("drill", "show")."""
    valued = {
        o
        for p in root.params
        if p.param_type_name == "option" and not p.is_flag
        for o in (*p.opts, *p.secondary_opts)
    }
    cmd: Any = root
    path: list[str] = []
    while words and hasattr(cmd, "commands"):
        word, words = words[0], words[1:]
        if word.startswith("-"):
            if word in valued and "=" not in word:
                words = words[1:]
            continue
        if word not in cmd.commands:
            break
        cmd, path = cmd.commands[word], [*path, word]
    return tuple(path)


def plan(commands: list[str], values: dict[str, str], lacks: dict[str, str]) -> list[Run]:
    """A Run for each command: placeholders (whole words) filled from ``values``; a
    command with a placeholder of ``lacks`` skipped with its reason."""
    root = failoverctl_root()
    runs = []
    for command in commands:
        words = shlex.split(command)
        argv = [CLI, *(values.get(w, w) for w in words[1:])]
        path = command_path(root, argv[1:])
        lacking = [lacks[w] for w in words if w in lacks]
        if command in FRAGMENTS:
            runs.append(Run(command, argv, path, "fragment", FRAGMENTS[command]))
        elif lacking:
            runs.append(Run(command, argv, path, "skipped", "; ".join(lacking)))
        elif path in READ_ONLY or (path == ("failover",) and "--dry-run" in words):
            runs.append(Run(command, argv, path, "read"))
        else:
            runs.append(Run(command, argv, path, CHANGES.get(path, "")))
    return runs


def cli_env(config: Path) -> dict[str, str]:
    """The environment of every command: the lab's config file, no TECTONIC_* else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TECTONIC_")}
    return {
        **env,
        "TECTONIC_CONFIG": str(config),
        "TECTONIC_ACTOR": ACTOR,
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }


async def failoverctl(
    argv: list[str], env: dict[str, str], timeout_s: float = 90.0
) -> tuple[int, str]:
    """Run one command with a terminal for stdin on which the operator has typed "y"
    (a change asks, as it asks a person, and goes ahead); its exit code and output."""
    master, slave = pty.openpty()
    try:
        os.write(master, b"y\n")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=slave,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        os.close(slave)
        slave = -1
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    finally:
        for fd in (master, slave):
            if fd >= 0:
                os.close(fd)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


def parse_only(run: Run, env: dict[str, str]) -> None:
    """Run a fragment in this process: it ends in click's usage error before failoverctl
    calls anything (and a Python starting up for each costs seconds of CPU here)."""
    t0 = time.monotonic()
    got = CliRunner().invoke(failoverctl_app, run.argv[1:], env=env, prog_name="failoverctl")
    run.code, run.output = got.exit_code, got.output
    if got.exception is not None and not isinstance(got.exception, SystemExit):
        run.output += "".join(traceback.format_exception(got.exception))
    run.took_s = time.monotonic() - t0


def write_config(path: Path, targets: list[str]) -> None:
    """The contexts the runbooks name, each pointing at the lab's control plane."""
    both = ",".join(targets)
    path.write_text(
        yaml.safe_dump(
            {
                "current-context": "lab",
                "contexts": {
                    "lab": {"server": both},
                    "prod-eu": {"server": both, "actor": ACTOR, "timeout": 10},
                    "staging": {"server": ",".join(reversed(targets))},
                },
            },
            sort_keys=False,
        )
    )


async def pinned_session(dep: LocalDeployment, stub: pb_grpc.ControlPlaneStub) -> None:
    """One chat request of SESSION through R's gateway: the gateway pins it."""
    url = dep.gateway_urls[R] + "/v1/chat/completions"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json=body, headers={SESSION_HEADER: SESSION}) as resp,
    ):
        assert resp.status == 200, await resp.text()

    async def found() -> bool:
        return bool((await stub.GetSession(pb.GetSessionRequest(session_id=SESSION))).found)

    await until(found, within=20, every=0.2, what=f"{SESSION} pinned")


async def lab_ready(stub: pb_grpc.ControlPlaneStub) -> None:
    async def ready() -> bool:
        with contextlib.suppress(grpc.aio.AioRpcError):
            st = await stub.GetStatus(pb.GetStatusRequest(), timeout=2)
            return bool(st.leader) and all(
                r.health == pb.HEALTHY and r.state == pb.NORMAL for r in st.regions
            )
        return False

    await until(ready, within=60, every=0.3, what="a leader and every region HEALTHY, NORMAL")


async def state_of(stub: pb_grpc.ControlPlaneStub, region: str) -> int:
    st = await stub.GetStatus(pb.GetStatusRequest(), timeout=2)
    return int(next(r.state for r in st.regions if r.name == region))


def region_of(run: Run) -> str:
    """The REGION argument of a failover or recover (the runbooks put it first)."""
    after = run.argv[run.argv.index(run.path[-1], 1) + 1 :]
    return next(w for w in after if not w.startswith("-"))


async def run_moves(
    moves: list[Run],
    stub: pb_grpc.ControlPlaneStub,
    execute: Callable[[Run], Awaitable[None]],
    env: dict[str, str],
) -> None:
    """Each real failover, then (while one is left) a recovery of its region; a recovery
    of a region with no failover left after a failover made for it (not counted)."""

    async def in_state(region: str, *want: int) -> None:
        async def there() -> bool:
            return await state_of(stub, region) in want

        names = " or ".join(pb.RegionState.Name(w) for w in want)
        await until(there, within=60, every=0.2, what=f"{region} {names}")

    recovers: dict[str, list[Run]] = {}
    for r in (r for r in moves if r.path == ("recover",)):
        recovers.setdefault(region_of(r), []).append(r)

    async def recover(region: str) -> None:
        r = recovers[region].pop(0)
        await execute(r)
        assert r.code == EXIT_OK, f"{r.command!r}: exit {r.code}:\n{r.output[-1500:]}"
        # The leader took it on: RECOVERED, its traffic coming back in steps (a failover
        # of a RECOVERED region, or to one, is allowed).
        await in_state(region, pb.RECOVERED, pb.NORMAL)

    for f in (r for r in moves if r.path == ("failover",)):
        region = region_of(f)
        await execute(f)
        assert f.code == EXIT_OK, f"{f.command!r}: exit {f.code}:\n{f.output[-1500:]}"
        await in_state(region, pb.FAILING_OVER)
        if recovers.get(region):
            await recover(region)
    for region, left in recovers.items():
        while left:
            setup = [CLI, "failover", region, "-r", f"{WHY}: set-up", "--yes", "--no-wait"]
            code, out = await failoverctl(setup, env)
            assert code == 0, out
            await in_state(region, pb.FAILING_OVER)
            await recover(region)


async def test_every_runbook_command_runs_against_a_lab() -> None:
    started = time.monotonic()
    commands = runbook_commands()
    stale = [c for c in (*FRAGMENTS, *EXPECTED) if c not in commands]
    assert not stale, f"listed here but in no runbook any more: {stale}"
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-test-runbook-lab-"))
    runs: list[Run] = []
    took: dict[str, float] = {}
    try:
        await run_all(commands, workdir, runs, took)
    finally:  # what ran, also when something failed
        report(runs, time.monotonic() - started, took)
    check(runs)


async def run_all(
    commands: list[str], workdir: Path, runs: list[Run], took: dict[str, float]
) -> None:
    """Start the lab, fill ``runs`` with a Run for each command and run them, phase by
    phase (the seconds each took in ``took``)."""
    t0 = time.monotonic()
    async with running_lab(SPEC, workdir, say=lambda m: None) as dep:
        took["lab up"] = time.monotonic() - t0
        config = workdir / "failoverctl.yaml"
        write_config(config, dep.cp_targets)
        env = cli_env(config)
        async with grpc.aio.insecure_channel(dep.cp_targets[0]) as channel:
            stub = pb_grpc.ControlPlaneStub(channel)  # type: ignore[no-untyped-call]
            await lab_ready(stub)
            await pinned_session(dep, stub)
            values = {
                "R": R,
                "REGION": R,
                "S": S,
                "T": T,
                "SESSION": SESSION,
                "WHY": WHY,
                "CP:50051": dep.cp_targets[0],
                "127.0.0.1:50051": dep.cp_targets[0],
                "M": MODEL,  # what the simulators serve: in fragments only, see lacks
            }
            lacks = {
                "M": "the lab has no model pools (--model names a pool's model)",
                "<drill>": "no drill has run in the lab (a drill takes a minute or more)",
            }
            runs += plan(commands, values, lacks)
            unplaced = [r.command for r in runs if not r.kind]
            assert not unplaced, f"runbook commands of no phase (add to CHANGES): {unplaced}"

            async def execute(run: Run) -> None:
                t0 = time.monotonic()
                run.code, run.output = await failoverctl(run.argv, env)
                run.took_s = time.monotonic() - t0

            # What only reads, first, two at a time (each is mostly a Python starting up,
            # on two cores).
            gate = asyncio.Semaphore(2)

            async def gated(run: Run) -> None:
                async with gate:
                    await execute(run)

            t0 = time.monotonic()
            for r in runs:
                if r.kind == "fragment":
                    parse_only(r, env)
            await asyncio.gather(*(gated(r) for r in runs if r.kind == "read"))
            took["read"] = time.monotonic() - t0
            for phase in ("contexts", "pin", "pause", "hold", "lift", "override", "probe"):
                t0 = time.monotonic()
                for r in ordered([r for r in runs if r.kind == phase]):
                    await execute(r)
                took[phase] = time.monotonic() - t0
            t0 = time.monotonic()
            await run_moves([r for r in runs if r.kind == "move"], stub, execute, env)
            took["move"] = time.monotonic() - t0
            st = await stub.GetStatus(pb.GetStatusRequest(), timeout=2)
            assert not st.paused, "the pause phase ends with a resume"
            assert all(not r.HasField("hold") for r in st.regions), "and the holds released"


def ordered(runs: list[Run]) -> list[Run]:
    """A phase's commands in an order that leaves the lab as it was: each pause (hold)
    followed by a resume (release); where there are more pauses than resumes, the extra
    ones run in a row (pausing again extends the pause, holding again replaces the
    hold) before the last resume."""
    undo_paths = {("resume",), ("release",), ("cost", "unlift")}
    doing = [r for r in runs if r.path not in undo_paths]
    undoing = [r for r in runs if r.path in undo_paths]
    if not undoing:
        return runs
    last = undoing.pop()
    out: list[Run] = []
    for i, r in enumerate(doing):
        out.append(r)
        if i < len(undoing):
            out.append(undoing[i])
    return [*out, *undoing[len(doing) :], last]


def report(runs: list[Run], took_s: float, phases: dict[str, float]) -> None:
    for r in runs:
        rc = "-" if r.code is None else str(r.code)
        note = f"  ({r.why})" if r.why else ""
        print(f"RUNBOOK {r.outcome():<8} rc={rc:<2} {r.took_s:4.1f}s  {r.command}{note}")
    counts = Counter(r.outcome() for r in runs)
    print(
        f"RUNBOOK {len(runs)} distinct commands: "
        + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        + f"; {took_s:.0f}s in all: "
        + ", ".join(f"{k} {v:.0f}s" for k, v in phases.items())
    )


def check(runs: list[Run]) -> None:
    problems = []
    for r in runs:
        if r.kind == "skipped":
            continue
        tail = r.output[-1500:]
        if "Traceback" in r.output:
            problems.append(f"{r.command!r}: a traceback:\n{tail}")
        elif r.kind == "fragment":
            if r.code != EXIT_BAD_INPUT or not _USAGE_ERROR.search(r.output):
                problems.append(
                    f"{r.command!r} is listed as a fragment but did not end in a usage "
                    f"error (exit {r.code}):\n{tail}"
                )
        elif r.code != r.expected:
            problems.append(f"{r.command!r}: exit {r.code}, expected {r.expected}:\n{tail}")
        elif r.command in EXPECTED and EXPECTED[r.command][1] not in r.output:
            problems.append(f"{r.command!r}: no {EXPECTED[r.command][1]!r} in:\n{tail}")
    assert problems == [], "\n\n".join(problems)
    ran = [r for r in runs if r.kind not in ("fragment", "skipped")]
    assert len(ran) > 30, len(ran)
