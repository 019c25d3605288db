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
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.cli import render
from controlplane.cli.client import EXIT_REFUSED, EXIT_UNREACHABLE
from controlplane.cli.common import JsonOpt, ReasonOpt, _call, _ctx, _show, err, out
from controlplane.cli.drill_cmds import runs_table
from controlplane.kernel.capacity.bearing import failed, meets_sla
from controlplane.kernel.capacity.record import CapacityRecord, HitProbe, ProbeStep
from controlplane.kernel.drills import CAPACITY_PROBE, CAPACITY_PROBE_MAX_S

# A drill service republishes drills/catalog every tick (30 s by default) and holds
# drills/lock on a lease while it runs anything: a catalog older than this, and no
# lock, means no drill service is running (or it ticks slower than this).
SERVICE_SILENT_S = 120.0
START_SERVICE = (
    "start one: python -m chaos --schedule chaos/schedule.yaml --topology TOPOLOGY "
    "--etcd HOST:PORT --cluster NAME (the --topology runs the capacity prober), then retry"
)

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


def recovery_text(t_recover_s: float | None, measured_over_s: float | None) -> str:
    """T_recover as said: the time, "did not recover within N s" when it was measured
    over N s and the replica was still over the SLA at the end, else "not measured"."""
    if t_recover_s is not None:
        return f"{t_recover_s:.1f} s"
    if measured_over_s is not None:
        return f"did not recover within {measured_over_s:g} s"
    return "not measured"


def recovery_window_s(r: CapacityRecord) -> float | None:
    """How long the recovery was watched, when the record says (``t_recover_window_s``,
    written by the probe once the record carries it; None: not measured, or a record
    from before)."""
    value = getattr(r, "t_recover_window_s", None)
    return float(value) if isinstance(value, int | float) else None


def record_lines(r: CapacityRecord) -> list[str]:
    recover = recovery_text(r.t_recover_s, recovery_window_s(r))
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
    wait: Annotated[
        bool, typer.Option(help="Wait for the result, saying where it is (queued, running).")
    ] = True,
    wait_s: Annotated[float, typer.Option(help="How long to wait.")] = 1800.0,
    json_out: JsonOpt = False,
) -> None:
    """Measure what REGION bears: the drill service step-loads replicas out of rotation.

    It never loads production: it borrows a WARM replica from the region's warm pool
    (woken, kept out of rotation, put back to sleep afterwards) or the replica named,
    which must not be in rotation. With two WARM replicas it borrows both and also
    loads them at once, for the scaling efficiency (else 1.0 is assumed, and said).
    It runs under the drill lock (never beside a drill), stores the result at
    capacity/<region> (audited) and writes an HTML report. Waits for it, saying where
    it is (queued, behind what, running since when; the probe's steps are in the
    service's log), then shows the region's capacity: exit 0 when it measured, 1 when
    it aborted or --wait-s ran out, 3 when no drill service runs (nothing is queued
    then) or it stopped meanwhile. With --json: one JSON line per change, then the
    result's.

    Example: failoverctl capacity probe us-east -r "after the vLLM upgrade"
    """
    c = _ctx(ctx, json_out)
    silent = service_silence(_call(c, lambda s: s.ListDrills, pb.DrillsRequest(limit=1)))
    if silent:  # nothing queued: a request would wait for a service nobody runs
        err.print(f"[bold red]error:[/] {silent}; nothing was queued")
        raise typer.Exit(EXIT_UNREACHABLE)
    req = pb.DrillRequest(
        scenario=CAPACITY_PROBE, region=region, reason=reason, actor=c.actor, replica=replica
    )
    resp = _call(c, lambda s: s.RequestDrill, req)
    if not wait:
        _show(c, resp, lambda: err.print(f"queued: request {resp.intent_id}"))
        return
    if not c.json:
        err.print(f"queued: request {resp.intent_id}; waiting for the drill service ...")
    run = follow_probe(c, resp.intent_id, wait_s)
    cap = _call(c, lambda s: s.GetCapacity, pb.CapacityRequest(region=region))
    if c.json:  # JSON lines: the progress lines, then this one
        result = {"run": render.to_dict(run), "capacity": [entry_json(e) for e in cap.regions]}
        out.print(json.dumps(result), highlight=False, soft_wrap=True)
    else:
        out.print(runs_table([run], "Capacity probe"))
        if run.report_path:
            out.print(f"report: {run.report_path}")
        for e in cap.regions:
            show_region(e)
    if not run.passed:
        raise typer.Exit(EXIT_REFUSED)


def service_silence(resp: pb.DrillsResponse, now: float | None = None) -> str:
    """Why no drill service can run the probe ("" when one runs): none ever published
    its catalog, or it has not for SERVICE_SILENT_S and holds no drill lock."""
    if resp.running:
        return ""  # a service holds the lock on a live lease
    if not resp.service:
        return f"no drill service is running (none has ever published its catalog); {START_SERVICE}"
    age = (time.time() if now is None else now) - resp.published_at
    if age <= SERVICE_SILENT_S:
        return ""
    return (
        f"no drill service is running: {resp.service} last published {age:.0f} s ago "
        f"(a running one does every tick) and no drill runs; {START_SERVICE}"
    )


def progress_text(resp: pb.DrillsResponse, request_id: str) -> str:
    """Where the request is, from what ListDrills shows: queued (and behind what), or
    the drill running now (the lock: who, which, since when)."""
    mine = next((p for p in resp.pending if p.id == request_id), None)
    if mine is not None and not _runs(resp.running, mine):
        ahead = [p for p in resp.pending if p.id != request_id]
        if resp.running:
            return f"queued behind the drill running now: {_lock_text(resp.running)}"
        return f"queued ({len(ahead)} request(s) ahead)" if ahead else "queued"
    if resp.running:
        step = f"; {resp.progress}" if resp.progress else ""
        return f"running: {_lock_text(resp.running)}{step}"
    return ""


def _runs(raw_lock: str, request: pb.PendingDrill) -> bool:
    """Whether the drill holding the lock is this request's (the service keeps a request
    until its run is recorded): the same scenario and region, started since it was
    asked for."""
    try:
        lock = json.loads(raw_lock)
        return (
            lock["scenario"] == request.scenario
            and (not request.region or lock["region"] == request.region)
            and float(lock["started_at"]) >= request.requested_at - 1.0
        )
    except (ValueError, KeyError, TypeError):
        return False


def _lock_text(raw: str) -> str:
    try:
        lock = json.loads(raw)
        since = float(lock["started_at"])
        what = f"{lock['scenario']} on {lock['region'] or '(default region)'}"
        # a start time, not an age: the line changes only when the drill does
        at = datetime.fromtimestamp(since, UTC).strftime("%H:%M:%S UTC")
        return f"{what} by {lock['holder']} since {at}"
    except (ValueError, KeyError, TypeError):
        return raw[:200]


def follow_probe(c: Any, request_id: str, wait_s: float) -> pb.DrillRun:
    """Wait for the run answering ``request_id``, saying each change of where it is
    (text on stderr; with --json, one JSON line per change on stdout). Exit 3 when the
    drill service stops meanwhile, 1 when ``wait_s`` runs out."""
    deadline = time.monotonic() + wait_s
    said = ""
    started = time.monotonic()
    while time.monotonic() < deadline:
        resp = _call(c, lambda s: s.ListDrills, pb.DrillsRequest(limit=50))
        run: pb.DrillRun | None = next((r for r in resp.runs if r.request_id == request_id), None)
        if run is not None:
            return run
        now = progress_text(resp, request_id)
        silent = service_silence(resp)
        if silent:
            _say(c, request_id, "service stopped", silent, started)
            err.print(
                f"[bold red]error:[/] {silent}; request {request_id} stays queued for it "
                "(failoverctl drill list)"
            )
            raise typer.Exit(EXIT_UNREACHABLE)
        if now and now != said:
            _say(c, request_id, now.split(":", 1)[0], now, started)
            said = now
        time.sleep(1.0)
    err.print(
        f"[bold red]error:[/] no result for request {request_id} within {wait_s:g} s (a "
        f"probe takes up to {CAPACITY_PROBE_MAX_S:g} s); follow it with failoverctl drill list"
    )
    raise typer.Exit(EXIT_REFUSED)


def _say(c: Any, request_id: str, state: str, text: str, started: float) -> None:
    if c.json:
        line = {
            "request": request_id,
            "state": state,
            "detail": text,
            "elapsed_s": round(time.monotonic() - started, 1),
        }
        out.print(json.dumps(line), highlight=False, soft_wrap=True)
    else:
        err.print(text, highlight=False)
