"""failoverctl's scale command: what the leader's scaler wants of each pool and why
(docs/scaling.md).

    failoverctl scale show [POOL]     desired ACTIVE/WARM, the forecast, the reasons

A pool is a failover unit: a region without pools, or ``<region>.<pool>``. The record
is ``scale/<unit>`` as the leader wrote it (``GetScale``), beside the ACTIVE replicas
serving now.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.cli import render
from controlplane.cli.common import JsonOpt, _call, _ctx, err, out
from controlplane.kernel.pool.scale import ScaleRecord

scale_app = typer.Typer(
    help="What the leader's scaler wants of each pool: desired ACTIVE and WARM replicas, "
    "the load forecast it sized on, and why (docs/scaling.md).",
    no_args_is_help=True,
)


def _active_now(p: pb.PoolScale) -> int | None:
    return p.active_now if p.HasField("active_now") else None


def _record(p: pb.PoolScale) -> ScaleRecord | str | None:
    """The record, None without one, or why it cannot be read (a newer scaler's)."""
    if not p.record_json:
        return None
    try:
        return ScaleRecord.model_validate_json(p.record_json)
    except ValidationError as exc:
        return f"unreadable here ({exc.error_count()} problems); --json shows it as stored"


def entry_json(p: pb.PoolScale) -> dict[str, Any]:
    record = json.loads(p.record_json) if p.record_json else None
    return {"unit": p.unit, "active_now": _active_now(p), "record": record}


def _rps(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def forecast_error_text(r: ScaleRecord) -> str:
    """How far the forecasts missed a horizon later (core/forecast_error.py): the EWMA of
    the relative miss and how many forecasts it scored; "-" before the first is due."""
    if r.forecast_error is None:
        return "-"
    return f"{r.forecast_error:.0%} (n={r.forecast_error_samples})"


def scale_table(pools: list[pb.PoolScale]) -> Table:
    t = Table()
    for col in (
        "pool",
        "ACTIVE now",
        "wants ACTIVE",
        "WARM",
        "load rps",
        "forecast (P90)",
        "forecast error",
        "hit rate",
        "per replica",
        "decided",
        "why",
    ):
        t.add_column(col)
    for p in pools:
        now = _active_now(p)
        r = _record(p)
        if not isinstance(r, ScaleRecord):
            t.add_row(p.unit, "-" if now is None else str(now), *["-"] * 8, r or "no record yet")
            continue
        forecast = f"{_rps(r.forecast_rps)} ({_rps(r.upper_rps)})"
        hit = "-" if r.hit_rate is None else f"{r.hit_rate:.2f}"
        t.add_row(
            p.unit,
            "-" if now is None else str(now),
            f"{r.active} ({r.direction.value})" if r.changed_at == r.decided_at else str(r.active),
            str(r.warm),
            _rps(r.load_rps),
            forecast,
            forecast_error_text(r),
            hit,
            _rps(r.per_replica_rps),
            render.ago(r.decided_at),
            "; ".join(r.reasons[1:] or r.reasons[:1]),
        )
    return t


@scale_app.command("show")
def scale_show(
    ctx: typer.Context,
    pool: Annotated[
        str, typer.Argument(help="One pool (a region, or REGION.POOL); every one if omitted.")
    ] = "",
    json_out: JsonOpt = False,
) -> None:
    """The scaler's record of each pool: ACTIVE now and wanted, WARM standby, the load,
    the forecast a horizon ahead with its upper band, how far its forecasts missed a
    horizon later (forecast error: the recent mean relative miss), the hit rate and per-replica
    capacity it used, and its reasons (the same are in the audit log on each change).

    Example: failoverctl scale show us-east --json | jq '.[0].record.active'
    """
    c = _ctx(ctx, json_out)
    resp = _call(c, lambda s: s.GetScale, pb.ScaleRequest(unit=pool))
    pools = list(resp.pools)
    if c.json:
        render.print_json(out, [entry_json(p) for p in pools])
        return
    if not resp.scaling:
        err.print(
            "[yellow]scaling is off in this topology (no scaling: section): pools keep the "
            "sizes of their agents' pool files[/]"
        )
    out.print(scale_table(pools))
    for p in pools:
        r = _record(p)
        if isinstance(r, ScaleRecord) and r.reasons:
            out.print(f"[bold]{p.unit}[/]: {r.reasons[0]}", highlight=False)
