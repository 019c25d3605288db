"""failoverctl's cost commands: what the pools spend against their budgets, and an
operator's lift of one pool's budget (docs/scaling.md, "Cost").

    failoverctl cost show [--json]                  $/h per pool, zone and fleet
    failoverctl cost lift POOL --reason WHY [--for 1h]
    failoverctl cost unlift POOL --reason WHY

A lift is a hold's twin: it exempts the pool from every budget until it ends by itself
(default one hour, at most 7 days), audited, shown in ``failoverctl status``.
"""

from __future__ import annotations

import json
from typing import Any

import typer
from pydantic import ValidationError
from rich.table import Table
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.cli import render
from controlplane.cli.common import (
    ForOpt,
    JsonOpt,
    ModelOpt,
    ReasonOpt,
    _call,
    _ctx,
    _each_unit,
    err,
    out,
    parse_duration,
)
from controlplane.cli.hold_cmds import RegionArg
from controlplane.core.spend import CostReport, PoolCost

cost_app = typer.Typer(
    help="What the pools spend against their budgets ($/h per pool, zone and fleet), and "
    "lifting one pool's budget for a while (docs/scaling.md, Cost).",
    no_args_is_help=True,
)


def _dollars(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _note(p: PoolCost) -> str:
    """What the scaler last said of the pool's budget: a lift, an exemption and when it
    ends (with the ACTIVE replicas the budget cuts then), a cap, or being over it."""
    if p.lift is not None:  # its end is the exemption's
        note = f"lifted until {render._clock(p.lift.until)}: {p.lift.reason}"
    elif p.exempt and p.ends_at is not None:
        note = f"{p.exempt}; binds again {render._clock(p.ends_at)}"
    else:
        note = p.binds or p.exempt
    if p.exempt and p.short_at_end:
        note += f", cutting {p.short_at_end} ACTIVE then"
    if p.over:
        over = "over the budget: WARM beyond the sizes stops at once"
        note = f"{note}; {over}" if note else over
    return note


def cost_tables(report: CostReport) -> tuple[Table, Table]:
    pools = Table(title="pools")
    for col in ("pool", "zone", "ACTIVE/WARM/LENT", "$/h", "budget", "used", "efficiency", "note"):
        pools.add_column(col)
    for p in report.pools:
        note = _note(p)
        pools.add_row(
            p.unit,
            p.zone,
            f"{p.active}/{p.warm}/{p.lent}",
            _dollars(p.dollars_per_hour),
            _dollars(p.budget),
            _share(p.utilisation),
            _share(p.efficiency),
            note,
        )
    scopes = Table(title="zones and fleet")
    for col in ("scope", "name", "$/h", "budget", "used"):
        scopes.add_column(col)
    for s in report.scopes:
        scopes.add_row(
            s.scope, s.name, _dollars(s.dollars_per_hour), _dollars(s.budget), _share(s.utilisation)
        )
    return pools, scopes


@cost_app.command("show")
def cost_show(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Spend now ($ per hour of the replicas each pool runs, by state) against each
    pool's, zone's and the fleet's budget; each pool's efficiency (served load over the
    capacity paid for) and what the scaler last said of its budget.

    Example: failoverctl cost show --json | jq '.scopes[] | select(.scope == "fleet")'
    """
    c = _ctx(ctx, json_out)
    resp = _call(c, lambda s: s.GetCost, pb.CostRequest())
    data: Any = json.loads(resp.report_json) if resp.report_json else None
    if c.json:
        render.print_json(out, data)
        return
    if data is None:
        err.print("[yellow]no cost: section in this topology: nothing is priced[/]")
        return
    try:
        report = CostReport.model_validate(data)
    except ValidationError as exc:
        err.print(f"[red]a report this failoverctl cannot read ({exc.error_count()} problems)[/]")
        raise typer.Exit(1) from None
    for table in cost_tables(report):
        out.print(table)


@cost_app.command("lift")
def cost_lift(
    ctx: typer.Context,
    pool: RegionArg,
    reason: ReasonOpt,
    for_: ForOpt = "1h",
    model: ModelOpt = "",
    json_out: JsonOpt = False,
) -> None:
    """Lift one pool's budget (its own, and its share of its zone's and the fleet's) for
    a while: the scaler sizes it as if it had none. It ends by itself; lifting again
    replaces it.

    Example: failoverctl cost lift us-east --reason "INC-123: launch traffic" --for 2h
    """
    c = _ctx(ctx, json_out)
    seconds = parse_duration(for_)
    said = f"{{}}: budget lifted for {for_}, back by itself then".format
    _each_unit(c, lambda s: s.LiftBudget, pool, model, reason, said, for_s=seconds)


@cost_app.command("unlift")
def cost_unlift(
    ctx: typer.Context,
    pool: RegionArg,
    reason: ReasonOpt,
    model: ModelOpt = "",
    json_out: JsonOpt = False,
) -> None:
    """End a pool's budget lift before its time: the budget binds at the next tick.

    Example: failoverctl cost unlift us-east --reason "launch over"
    """
    c = _ctx(ctx, json_out)
    said = "{}: budget lift ended, the budget binds again".format
    _each_unit(c, lambda s: s.UnliftBudget, pool, model, reason, said)
