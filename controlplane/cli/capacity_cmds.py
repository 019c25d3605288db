"""failoverctl's capacity commands: what each region bears (docs/capacity.md).

    failoverctl capacity show [REGION]   its CBU, the capacity behind it, the last probe
    failoverctl capacity probe REGION    measure it: a WARM replica out of rotation, step-loaded

The bearing is the one the failover planner and the status use (``GetCapacity``
computes it on the same snapshot); the probe record is ``capacity/<region>`` as the
capacity probe stored it, every step of its curves included.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.cli import render
from controlplane.cli.client import EXIT_REFUSED
from controlplane.cli.common import JsonOpt, ReasonOpt, _call, _ctx, _show, err, out
from controlplane.cli.drill_cmds import runs_table, wait_for_run
from controlplane.kernel.capacity import failed, meets_sla
from controlplane.kernel.capacity_record import CapacityRecord, HitProbe, ProbeStep
from controlplane.kernel.drills import CAPACITY_PROBE

capacity_app = typer.Typer(
    help="What each region bears: its capacity utilisation (CBU), the capacity behind "
    "it (a fresh probe, else the topology's capacity_rps) and its last capacity probe.",
    no_args_is_help=True,
)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) + " UTC" if ts else "-"


def _rps(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} rps"


def entry_json(e: pb.RegionCapacityRecord) -> dict[str, Any]:
    """One region for --json: the bearing as GetStatus shows it, and the record as
    stored (null: no probe yet)."""
    record = json.loads(e.record_json) if e.record_json else None
    return {"region": e.region, "bearing": render.to_dict(e.bearing), "record": record}


def bearing_lines(region: str, b: pb.RegionCapacity) -> list[str]:
    head = (
        f"[bold]{region}[/]: CBU {render.cbu_text(b)} · allowed now {b.allowed_rps:.1f} rps "
        f"at hit rate {b.hit_rate:.2f} · serving {b.load_rps:.1f} rps "
        f"(warn above {b.warn_cbu:g}, page above {b.page_cbu:g})"
    )
    active = f" · {b.active_replicas} ACTIVE replica(s)" if b.HasField("active_replicas") else ""
    return [head, f"  capacity: {b.source}: {b.reason}{active}"]


def record_lines(r: CapacityRecord) -> list[str]:
    recover = "not measured" if r.t_recover_s is None else f"{r.t_recover_s:.1f} s"
    wasted = "" if r.wasted_work_share is None else f", wasted work {r.wasted_work_share:.1%}"
    scaling = "measured" if r.scaling_measured else "assumed"
    if r.scaling_unmeasured:
        scaling += f": {r.scaling_unmeasured}"
    by = f" by {r.prober}" if r.prober else ""
    return [
        f"  last probe: {_when(r.measured_at)} ({render.ago(r.measured_at)}), engine "
        f"{r.engine_version or '?'}, replica {r.replica}{by}, took {r.probe_s:.0f} s",
        f"  per replica: R_base {r.r_base_rps:.1f} rps (cold), beta {r.beta:.2f}, factor of "
        f"safety {r.factor_of_safety:g}, T_recover {recover}{wasted}",
        f"  region: {r.active_replicas} ACTIVE replica(s) when measured, scaling "
        f"efficiency {r.scaling_efficiency:g} ({scaling}); SLA: first-token p99 under "
        f"{r.slo.ttft_p99_s:g} s, errors under {r.slo.error_rate:.1%}",
    ]


def _verdict(s: ProbeStep, r: CapacityRecord) -> str:
    if failed(s.step(), r.slo):
        return "[bold red]failure[/]"
    return "[green]within SLA[/]" if meets_sla(s.step(), r.slo) else "[yellow]over SLA[/]"


def probe_line(p: HitProbe, r: CapacityRecord) -> str:
    bound = "" if p.ultimate_bounded else " (no step broke the SLA: a lower bound)"
    return (
        f"  probe at hit rate {p.hit_rate:.2f}: baseline p99 {p.baseline_p99_s:.3f} s, knee "
        f"{_rps(p.knee_rps)}, ultimate {_rps(p.ultimate_rps)}{bound}, allowed "
        f"{p.ultimate_rps / r.factor_of_safety:.1f} rps, failure {_rps(p.failure_rps)}"
    )


def steps_table(p: HitProbe, r: CapacityRecord) -> Table:
    t = Table()
    for col in ("offered rps", "first-token p99 s", "errors", "throughput rps", "timeouts", "step"):
        t.add_column(col)
    for s in p.steps:
        t.add_row(
            f"{s.offered_rps:.1f}",
            f"{s.p99_ttft_s:.3f}",
            f"{s.error_rate:.2%}",
            f"{s.throughput_rps:.1f}",
            str(s.timeouts),
            _verdict(s, r),
        )
    return t


def show_region(e: pb.RegionCapacityRecord) -> None:
    for line in bearing_lines(e.region, e.bearing):
        out.print(line, highlight=False)
    if not e.record_json:
        out.print("  no capacity probe yet: failovers plan on the typed capacity_rps")
        return
    try:
        record = CapacityRecord.model_validate_json(e.record_json)
    except ValidationError as exc:  # a record from a newer probe than this failoverctl
        err.print(f"  [yellow]cannot read the probe record ({exc.error_count()} problems);[/]")
        err.print("  [yellow]--json shows it as stored[/]")
        return
    for line in record_lines(record):
        out.print(line, highlight=False)
    for p in sorted(record.probes, key=lambda p: p.hit_rate):
        out.print(probe_line(p, record), highlight=False)
        if p.steps:
            out.print(steps_table(p, record))
        else:
            out.print("    no steps stored")


@capacity_app.command("show")
def capacity_show(
    ctx: typer.Context,
    region: Annotated[str, typer.Argument(help="One region; every region if omitted.")] = "",
    json_out: JsonOpt = False,
) -> None:
    """What a region bears now: CBU, allowed load, its source, and the last probe's curves.

    The source is measured (a fresh probe of the engine the region runs), stale (a
    probe too old or of another engine: the typed capacity_rps is used) or typed (no
    probe yet).

    Example: failoverctl capacity show us-east --json | jq '.[0].bearing.cbu'
    """
    c = _ctx(ctx, json_out)
    resp = _call(c, lambda s: s.GetCapacity, pb.CapacityRequest(region=region))
    if c.json:
        render.print_json(out, [entry_json(e) for e in resp.regions])
        return
    for i, e in enumerate(resp.regions):
        if i:
            out.print()
        show_region(e)


@capacity_app.command("probe")
def capacity_probe(
    ctx: typer.Context,
    region: Annotated[str, typer.Argument(help="The region to measure.")],
    reason: ReasonOpt,
    replica: Annotated[
        str,
        typer.Option(
            help="Probe this replica (base URL; refused if in rotation). "
            "Default: a WARM replica of the region's warm pool (two when it has two: "
            "both are also loaded at once, for the scaling efficiency)."
        ),
    ] = "",
    wait: Annotated[bool, typer.Option(help="Wait for the result (progress shown).")] = True,
    wait_s: Annotated[float, typer.Option(help="How long to wait.")] = 1800.0,
    json_out: JsonOpt = False,
) -> None:
    """Measure what REGION bears: the drill service step-loads replicas out of rotation.

    It never loads production: it borrows a WARM replica from the region's warm pool
    (woken, kept out of rotation, put back to sleep afterwards) or the replica named,
    which must not be in rotation. With two WARM replicas it borrows both and also
    loads them at once, for the scaling efficiency (else 1.0 is assumed, and said).
    It runs under the drill lock (never beside a drill), stores the result at
    capacity/<region> (audited) and writes an HTML report. Waits for it, then shows
    the region's capacity: exit 0 when it measured, 1 when it aborted.

    Example: failoverctl capacity probe us-east -r "after the vLLM upgrade"
    """
    c = _ctx(ctx, json_out)
    req = pb.DrillRequest(
        scenario=CAPACITY_PROBE, region=region, reason=reason, actor=c.actor, replica=replica
    )
    resp = _call(c, lambda s: s.RequestDrill, req)
    if not wait:
        _show(c, resp, lambda: err.print(f"queued: request {resp.intent_id}"))
        return
    if not c.json:
        err.print(f"queued: request {resp.intent_id}; waiting for the drill service ...")
    run = wait_for_run(c, resp.intent_id, wait_s)
    cap = _call(c, lambda s: s.GetCapacity, pb.CapacityRequest(region=region))
    if c.json:
        render.print_json(
            out,
            {"run": render.to_dict(run), "capacity": [entry_json(e) for e in cap.regions]},
        )
    else:
        out.print(runs_table([run], "Capacity probe"))
        if run.report_path:
            out.print(f"report: {run.report_path}")
        for e in cap.regions:
            show_region(e)
    if not run.passed:
        raise typer.Exit(EXIT_REFUSED)
