"""``failoverctl doctor``: the on-call engineer's self-check, from the live system.

Reads what the control plane already answers (``GetStatus``, ``GetCapacity``,
``GetScale``, ``GetReadiness``, ``ListDrills``, ``GetCost``), the shipped alert rules,
with ``--prometheus URL`` the history Prometheus holds (``doctor_prom.py``) and, where
the command runs in a checkout of the repository, its CI and ladder file; the
questions are decided in ``controlplane/cli/doctor.py`` (pure). One line per question:
PASS, FAIL or UNKNOWN, the evidence, what to do.

Exit codes: 0 every line passes; 1 a line fails, or (without ``--allow-unknown``) one
could not be answered; 3 the control plane is unreachable (and 2, 5 as for every
command). An RPC other than GetStatus that fails leaves its questions UNKNOWN, saying
why.
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.cli import render
from controlplane.cli.client import EXIT_BAD_INPUT, CliError
from controlplane.cli.common import Ctx, JsonOpt, _ctx, _error, _status, out
from controlplane.cli.doctor import Facts, Line, RepoFacts, Verdict, diagnose, exit_code
from controlplane.cli.doctor_prom import read_prometheus
from controlplane.kernel.config import ConfigError
from controlplane.kernel.ladder.file import load_ladder

RULES = Path("runbooks/alerts/tectonic-alerts.yaml")
LADDER = Path("runbooks/degradation.yaml")
ORDER_TEST = Path("tests/test_degradation_order.py")
CI_ENTRY = Path(".ci/run")
CI_SCRIPT = Path("scripts/test.sh")
_STYLE = {Verdict.PASS: "green", Verdict.FAIL: "bold red", Verdict.UNKNOWN: "yellow"}


def find_repo(start: Path) -> Path | None:
    """The Tectonic checkout ``start`` is in: the nearest directory up with a
    pyproject.toml and runbooks/degradation.yaml (None: not in one)."""
    for d in (start, *start.parents):
        if (d / "pyproject.toml").is_file() and (d / LADDER).is_file():
            return d
    return None


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def read_repo(root: Path) -> RepoFacts:
    try:
        with (root / "pyproject.toml").open("rb") as fh:
            pytest_opts = tomllib.load(fh).get("tool", {}).get("pytest", {}).get("ini_options", {})
        testpaths = tuple(str(p) for p in pytest_opts.get("testpaths", ()))
    except (OSError, tomllib.TOMLDecodeError):
        testpaths = ()
    steps: tuple[str, ...] | None = None
    why = digest = ""
    try:
        ladder = load_ladder(root / LADDER)
        steps, digest = ladder.names, ladder.digest  # compared with the deployed one's
    except (ConfigError, OSError) as exc:
        why = str(exc).splitlines()[0]
    return RepoFacts(
        root=str(root),
        order_test=_text(root / ORDER_TEST),
        ci_script=_text(root / CI_SCRIPT),
        ci_entry=_text(root / CI_ENTRY),
        testpaths=testpaths,
        ladder_steps=steps,
        ladder_error=why,
        ladder_sha256=digest,
    )


def _try(c: Ctx, rpc: Any) -> Any:
    """One read; a failure is the reason (its question answers UNKNOWN), not the end."""
    try:
        return c.client.call(lambda s: rpc(s))
    except CliError as e:
        return str(e)


def gather(
    c: Ctx,
    region: str,
    rules: Path | None,
    repo: Path | None,
    status: pb.StatusResponse,
    prometheus: str = "",
) -> Facts:
    t = c.client.timeout_s
    capacity = _try(c, lambda s: s.GetCapacity(pb.CapacityRequest(), timeout=t))
    scale = _try(c, lambda s: s.GetScale(pb.ScaleRequest(), timeout=t))
    readiness = _try(c, lambda s: s.GetReadiness(pb.ReadinessRequest(), timeout=t))
    drills = _try(c, lambda s: s.ListDrills(pb.DrillsRequest(limit=500), timeout=t))
    cost = _try(c, lambda s: s.GetCost(pb.CostRequest(), timeout=t))
    rules_path = rules if rules is not None else (repo / RULES if repo is not None else None)
    rules_text = _text(rules_path) if rules_path is not None else None
    return Facts(
        now=time.time(),
        status=status,
        capacity=capacity,
        scale=scale,
        readiness=readiness,
        drills=drills,
        cost=cost,
        rules=rules_text,
        rules_source=str(rules_path) if rules_path else "not in a checkout; no --rules",
        repo=read_repo(repo) if repo is not None else None,
        region=region,
        prom=read_prometheus(prometheus, t) if prometheus else None,
    )


def line_text(x: Line) -> str:
    style = _STYLE[x.verdict]
    todo = f" [dim]→ {escape(x.todo)}[/]" if x.todo else ""
    return (
        f"[{style}]{x.verdict.value:<7}[/] {x.id:>2}. {escape(x.question)}: "
        f"{escape(x.evidence)}{todo}"
    )


def doctor(
    ctx: typer.Context,
    region: Annotated[
        str, typer.Option(help="Only this region (and its pools), or one pool REGION.POOL.")
    ] = "",
    allow_unknown: Annotated[
        bool,
        typer.Option(
            "--allow-unknown",
            help="Exit 0 when no line fails, even if some could not be answered (UNKNOWN).",
        ),
    ] = False,
    rules: Annotated[
        Path | None,
        typer.Option(
            help="The alert rules Prometheus loads (default: the checkout's "
            "runbooks/alerts/tectonic-alerts.yaml)."
        ),
    ] = None,
    repo: Annotated[
        Path | None,
        typer.Option(
            help="The Tectonic checkout for the CI and ladder question (default: the one "
            "the current directory is in, if any)."
        ),
    ] = None,
    prometheus: Annotated[
        str,
        typer.Option(
            "--prometheus",
            envvar="TECTONIC_PROMETHEUS_URL",
            help="A Prometheus that scrapes the agents and the leader (its base URL, e.g. "
            "http://127.0.0.1:9090): question 2 then judges each pool's wake p95 over up to "
            "90 days and question 8 the last week's peak budget utilisation, each saying "
            "how far back its data goes. Unreachable or erroring: those lines are UNKNOWN.",
        ),
    ] = "",
    json_out: JsonOpt = False,
) -> None:
    """Self-check: one PASS / FAIL / UNKNOWN line per on-call question, with the
    evidence and what to do (issue 32): WARM standby vs the sizing formula, wake p95 vs
    the first-token SLO, the hit-rate alert, the forecast horizon, drills in 7 days,
    the degradation-order test in CI, fresh capacity, budget, readiness, one engine
    version per pool. UNKNOWN says what is missing; it is not a pass. Without
    --prometheus, question 2 judges the agents' last wakes and question 8 the
    utilisation now (each names the Prometheus query for the history).

    Exit codes: 0 every line passes; 1 a line fails or is UNKNOWN (with
    --allow-unknown: only when one fails); 3 the control plane is unreachable.

    Example: failoverctl doctor --region us-east --json | jq '.checks[] | select(.verdict=="FAIL")'
    """
    c = _ctx(ctx, json_out)
    status = _status(c)
    if region and not any(region in (r.name, r.pool_of) for r in status.regions):
        known = ", ".join(sorted({r.pool_of or r.name for r in status.regions}))
        raise _error(f"unknown region {region} (regions: {known})", EXIT_BAD_INPUT, c.json)
    root = repo if repo is not None else find_repo(Path.cwd())
    lines = diagnose(gather(c, region, rules, root, status, prometheus))
    code = exit_code(lines, allow_unknown)
    if c.json:
        render.print_json(out, {"checks": [x.as_dict() for x in lines], "exit_code": code})
    else:
        for x in lines:
            out.print(line_text(x), highlight=False, soft_wrap=True)
    if code:
        raise typer.Exit(code)
