"""failoverctl's commands on drills, readiness verdicts and prefixes.

    failoverctl readiness                      who may take traffic, by the last drill
    failoverctl readiness override R -r WHY    let a barred region take traffic again
    failoverctl prefixes top R                 the top prefixes the leader would pre-warm
    failoverctl drill list | show | schedule | run

Drills run in the drill service (``python -m chaos``): ``drill run``
queues a request it carries out, and waits for the verdict unless ``--no-wait``.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.cli import render
from controlplane.cli.client import EXIT_BAD_INPUT, EXIT_REFUSED, CliError
from controlplane.cli.common import (
    Ctx,
    JsonOpt,
    ReasonOpt,
    YesOpt,
    _call,
    _confirm,
    _ctx,
    _fail,
    _show,
    err,
    out,
)

readiness_app = typer.Typer(
    help="Drill verdicts per region: a region whose last drill failed is barred (no "
    "failover target, its traffic moved away) until a passing drill or an override.",
    invoke_without_command=True,
)
prefixes_app = typer.Typer(
    help="The leader's prefix catalogs (what pre-warm replays).", no_args_is_help=True
)
drill_app = typer.Typer(
    help="Chaos drills: history, schedule, and running one now.", no_args_is_help=True
)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) + " UTC" if ts else "-"


# ---- readiness ---------------------------------------------------------------------------
def readiness_table(resp: pb.ReadinessResponse) -> Table:
    t = Table(title="Readiness (last drill verdict)")
    for col in ("region", "verdict", "drill", "when", "override"):
        t.add_column(col)
    for r in resp.regions:
        if not r.has_verdict:
            verdict = "[dim]never drilled[/]"
        elif r.barred:
            verdict = "[bold red]FAILED: barred[/]"
        else:
            verdict = "[green]passed[/]" if r.passed else "[yellow]failed, overridden[/]"
        override = (
            f"{r.override_actor}: {r.override_reason} ({render.ago(r.override_at)})"
            if r.override_reason
            else ""
        )
        t.add_row(r.region, verdict, r.drill or "-", render.ago(r.at) if r.at else "-", override)
    return t


@readiness_app.callback()
def readiness(
    ctx: typer.Context,
    region: Annotated[str, typer.Option(help="Only this region.")] = "",
    json_out: JsonOpt = False,
) -> None:
    """Which regions may take traffic, by their last drill's verdict.

    Example: failoverctl readiness --json | jq '.[] | select(.barred)'
    """
    if ctx.invoked_subcommand is not None:
        return
    c = _ctx(ctx, json_out)
    resp = _call(c, lambda s: s.GetReadiness, pb.ReadinessRequest(region=region))
    _show(c, resp.regions, lambda: out.print(readiness_table(resp)))


@readiness_app.command("override")
def readiness_override(
    ctx: typer.Context,
    region: Annotated[str, typer.Argument(help="A region barred by its last drill.")],
    reason: ReasonOpt,
    yes: YesOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Let a region whose last drill failed take traffic again (audited).

    The leader then recovers it in graduated steps; the next drill's verdict replaces
    the override.

    Example: failoverctl readiness override us-east -r "INC-77: drill harness bug, fixed"
    """
    c = _ctx(ctx, json_out)
    _confirm(f"Override the failed drill of {region}? It may take traffic again.", yes)
    req = pb.ReadinessOverrideRequest(region=region, reason=reason, actor=c.actor)
    r = _call(c, lambda s: s.OverrideReadiness, req)
    said = f"{region}: failed drill {r.drill} overridden by {r.override_actor}; not barred now"
    _show(c, r, lambda: err.print(said))


# ---- prefixes -----------------------------------------------------------------------------
@prefixes_app.command("top")
def prefixes_top(
    ctx: typer.Context,
    region: Annotated[str, typer.Argument(help="The region whose catalog to show.")],
    limit: Annotated[int, typer.Option(min=1, max=256, help="How many.")] = 20,
    json_out: JsonOpt = False,
) -> None:
    """The region's most frequent prompt prefixes: what its failover would pre-warm.

    As the leader merged them from the gateways' counts; only those seen from K
    sessions may leave the region (be replayed on a target).

    Example: failoverctl prefixes top us-east --limit 10
    """
    c = _ctx(ctx, json_out)
    req = pb.TopPrefixesRequest(region=region, limit=limit)
    resp = _call(c, lambda s: s.TopPrefixes, req)

    def text() -> None:
        if not resp.found:
            out.print(f"{region}: no prefix catalog yet (no traffic counted by the gateways)")
            return
        t = Table(
            title=f"{region}: top prefixes (merged from {resp.gateways} gateways, "
            f"{render.ago(resp.generated_at)}; may leave after {resp.min_sessions} "
            "sessions)"
        )
        for col in ("#", "count", "sessions", "tokens", "may leave", "prefix"):
            t.add_column(col)
        for i, e in enumerate(resp.entries, 1):
            t.add_row(
                str(i),
                f"{e.count:g}",
                str(e.sessions),
                str(e.tokens or "-"),
                "yes" if e.may_leave else "no",
                e.preview or e.key[:16],
            )
        out.print(t)

    _show(c, resp, text)


# ---- drills -------------------------------------------------------------------------------
def _drills(
    ctx: typer.Context, json_out: bool, limit: int = 20, region: str = ""
) -> tuple[Ctx, pb.DrillsResponse]:
    c = _ctx(ctx, json_out)
    return c, _call(c, lambda s: s.ListDrills, pb.DrillsRequest(limit=limit, region=region))


def runs_table(runs: list[pb.DrillRun], title: str) -> Table:
    t = Table(title=title)
    for col in ("when", "scenario", "region", "verdict", "trigger", "id"):
        t.add_column(col)
    for r in runs:
        verdict = (
            "[green]PASS[/]"
            if r.passed
            else f"[bold red]FAIL[/] {', '.join(r.failed) or r.aborted}"
        )
        if r.dry_run:
            verdict += " (dry run)"
        t.add_row(_when(r.started_at), r.scenario, r.region, verdict, r.trigger, r.id)
    return t


@drill_app.command("list")
def drill_list(
    ctx: typer.Context,
    region: Annotated[str, typer.Option(help="Only drills of this region.")] = "",
    limit: Annotated[int, typer.Option(min=1, max=500, help="History rows.")] = 20,
    json_out: JsonOpt = False,
) -> None:
    """Scenarios, the last drills (newest first), queued requests, the one running.

    Example: failoverctl drill list --region us-east
    """
    c, resp = _drills(ctx, json_out, limit, region)

    def text() -> None:
        if not resp.service:
            err.print("[yellow]no drill service has published its scenarios yet[/]")
        else:
            t = Table(title=f"Scenarios of drill service {resp.service}")
            for col in ("scenario", "default region", "what"):
                t.add_column(col)
            for s in resp.scenarios:
                t.add_row(s.name, s.region, s.title)
            out.print(t)
        if resp.running:
            out.print(f"running now: {resp.running}")
        for p in resp.pending:
            out.print(
                f"queued: {p.scenario} on {p.region or 'its default region'} "
                f"(request {p.id} by {p.actor}: {p.reason})"
            )
        out.print(runs_table(list(resp.runs), "Last drills"))

    _show(c, resp, text)


@drill_app.command("show")
def drill_show(
    ctx: typer.Context,
    drill_id: Annotated[str, typer.Argument(help="A drill id (from drill list) or request id.")],
    json_out: JsonOpt = False,
) -> None:
    """One drill: its verdict, failed criteria and where its report is.

    Example: failoverctl drill show 20261129T221541Z-flapping-region-us-east
    """
    c, resp = _drills(ctx, json_out, 500)
    run = next((r for r in resp.runs if drill_id in (r.id, r.request_id)), None)
    if run is None:
        err.print(f"[bold red]error:[/] no drill {drill_id!r} in the last 500 (see drill list)")
        raise typer.Exit(EXIT_BAD_INPUT)

    def text() -> None:
        verdict = "PASS" if run.passed else "FAIL"
        out.print(
            f"{run.id}: {run.scenario} on {run.region}: {verdict}"
            + (" (dry run)" if run.dry_run else "")
        )
        asked = f", request {run.request_id}" if run.request_id else ""
        took = run.ended_at - run.started_at
        out.print(f"  ran {_when(run.started_at)} for {took:.0f}s ({run.trigger}{asked})")
        if run.failed:
            out.print(f"  failed criteria: {', '.join(run.failed)}")
        if run.aborted:
            out.print(f"  aborted: {run.aborted}")
        out.print(f"  report: {run.report_path or '-'}")

    _show(c, run, text)


@drill_app.command("schedule")
def drill_schedule(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """The next scheduled drills, as the drill service planned them.

    Its windows and blocked dates are applied; edit chaos/schedule.yaml and check it
    with python -m chaos.drills.schedule next chaos/schedule.yaml.

    Example: failoverctl drill schedule
    """
    c, resp = _drills(ctx, json_out, 1)

    def text() -> None:
        if not resp.service:
            err.print("[yellow]no drill service has published a schedule yet[/]")
            return
        t = Table(
            title=f"Upcoming drills (service {resp.service}, "
            f"published {render.ago(resp.published_at)})"
        )
        for col in ("when", "scenario", "region"):
            t.add_column(col)
        for u in resp.upcoming:
            t.add_row(_when(u.at), u.scenario, u.region or "(default)")
        out.print(t)

    _show(c, resp.upcoming, text)


@drill_app.command("run")
def drill_run(
    ctx: typer.Context,
    scenario: Annotated[str, typer.Argument(help="A scenario name (see drill list).")],
    reason: ReasonOpt,
    region: Annotated[str, typer.Option(help="Target region (default: the scenario's).")] = "",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check steady state only.")] = False,
    wait: Annotated[bool, typer.Option(help="Wait for the verdict (progress shown).")] = True,
    wait_s: Annotated[float, typer.Option(help="How long to wait.")] = 900.0,
    yes: YesOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Ask the drill service to run a drill now (real faults, unless --dry-run).

    Waits for the verdict: exit 0 when it passed, 1 when it failed.

    Example: failoverctl drill run region-blackout --region us-west -r "after the upgrade"
    """
    c = _ctx(ctx, json_out)
    if not dry_run:
        _confirm(f"Run drill {scenario} now? It injects real faults.", yes)
    req = pb.DrillRequest(
        scenario=scenario, region=region, dry_run=dry_run, reason=reason, actor=c.actor
    )
    resp = _call(c, lambda s: s.RequestDrill, req)
    if not wait:
        _show(c, resp, lambda: err.print(f"queued: request {resp.intent_id}"))
        return
    if not c.json:
        err.print(f"queued: request {resp.intent_id}; waiting for the drill service ...")
    run = wait_for_run(c, resp.intent_id, wait_s)
    _show(c, run, lambda: out.print(runs_table([run], "Drill")))
    if not run.passed:
        raise typer.Exit(EXIT_REFUSED)


def wait_for_run(c: Ctx, request_id: str, wait_s: float) -> pb.DrillRun:
    deadline = time.monotonic() + wait_s
    said = ""
    while time.monotonic() < deadline:
        resp = _call(c, lambda s: s.ListDrills, pb.DrillsRequest(limit=50))
        run: pb.DrillRun | None = next((r for r in resp.runs if r.request_id == request_id), None)
        if run is not None:
            return run
        queued = any(p.id == request_id for p in resp.pending)
        now = f"running: {resp.running}" if resp.running else ("queued" if queued else "")
        if now and now != said and not c.json:
            err.print(now)
            said = now
        time.sleep(1.0)
    raise _fail(
        CliError(
            f"no verdict for request {request_id} within {wait_s:g}s; "
            "follow it with failoverctl drill list",
            EXIT_REFUSED,
        )
    )
