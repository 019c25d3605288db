"""failoverctl's per-unit hold: stop one region's (or one model pool's) automation for a
while, when ``pause`` would stop every region's.

    failoverctl hold REGION --reason WHY [--for 2h] [--model M]
    failoverctl release REGION --reason WHY [--model M]

A hold stops the unit's automatic transitions and recovery steps, its degradation
ladder and its scaler; every other unit carries on and manual commands still work. It
ends by itself (default one hour, at most 7 days): the leader then releases it and says
so in the audit log. ``failoverctl status`` shows each hold and its end.
"""

from __future__ import annotations

from typing import Annotated

import typer

from controlplane.cli.common import (
    ForOpt,
    JsonOpt,
    ModelOpt,
    ReasonOpt,
    _ctx,
    _each_unit,
    parse_duration,
)

RegionArg = Annotated[
    str,
    typer.Argument(
        help="The region (with model pools: all of its pools, one with --model, or a pool "
        "by its name <region>.<pool>)."
    ),
]


def hold(
    ctx: typer.Context,
    region: RegionArg,
    reason: ReasonOpt,
    for_: ForOpt = "1h",
    model: ModelOpt = "",
    json_out: JsonOpt = False,
) -> None:
    """Hold one region's automation (failovers, recovery steps, the ladder, the scaler)
    while every other region carries on; it ends by itself. Holding again replaces it.

    Example: failoverctl hold us-east --reason "INC-123: keep it failed over" --for 2h
    """
    c = _ctx(ctx, json_out)
    seconds = parse_duration(for_)
    said = f"{{}} held for {for_}: released by itself then".format
    _each_unit(c, lambda s: s.Hold, region, model, reason, said, for_s=seconds)


def release(
    ctx: typer.Context,
    region: RegionArg,
    reason: ReasonOpt,
    model: ModelOpt = "",
    json_out: JsonOpt = False,
) -> None:
    """End a region's hold before its time: its automation carries on at the next tick.

    Example: failoverctl release us-east --reason "INC-123 closed"
    """
    c = _ctx(ctx, json_out)
    said = "{} released: automation carries on".format
    _each_unit(c, lambda s: s.Release, region, model, reason, said)
