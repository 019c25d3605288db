"""How failoverctl shows things: rich tables for people, JSON for scripts."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from tectonic_api.v1 import controlplane_pb2 as pb

STATE_STYLE = {
    "NORMAL": "green",
    "DEGRADED": "yellow",
    "FAILING_OVER": "bold red",
    "RECOVERED": "cyan",
    "UNKNOWN": "bold magenta",  # the store refuses writes: the stored state may be stale
}
HEALTH_NAME = {
    pb.HEALTHY: "HEALTHY",
    pb.HEALTH_DEGRADED: "DEGRADED",
    pb.UNHEALTHY: "UNHEALTHY",
    pb.UNKNOWN: "UNKNOWN",
    pb.HEALTH_UNSPECIFIED: "-",
}
HEALTH_STYLE = {
    "HEALTHY": "green",
    "DEGRADED": "yellow",
    "UNHEALTHY": "bold red",
    "UNKNOWN": "magenta",
}


def to_dict(msg: Message) -> dict[str, Any]:
    d: dict[str, Any] = MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return d


def print_json(console: Console, data: object) -> None:
    console.print_json(json.dumps(data))


def state_name(v: int) -> str:
    return str(pb.RegionState.Name(v)).removeprefix("REGION_STATE_")


def ago(ts: float) -> str:
    if ts <= 0:
        return "-"
    s = max(0.0, time.time() - ts)
    return (
        f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"
    )


def routing_text(routing: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(routing.items(), key=lambda kv: -kv[1]))


def cbu_style(c: pb.RegionCapacity) -> str:
    """Past page_cbu the region carries more than it bears (red, the page alert's
    threshold); past warn_cbu a warning (yellow); else green."""
    if c.cbu > c.page_cbu:
        return "bold red"
    return "yellow" if c.cbu > c.warn_cbu else "green"


def cbu_text(c: pb.RegionCapacity) -> str:
    """The CBU, coloured by the topology's thresholds, and where the capacity comes
    from when it is not a fresh probe (typed, or stale: the probe is not used)."""
    figure = "∞" if math.isinf(c.cbu) else f"{c.cbu:.2f}"
    text = f"[{cbu_style(c)}]{figure}[/]"
    if c.source == "stale":
        text += " [yellow](stale)[/]"
    elif c.source == "typed":
        text += " [dim](typed)[/]"
    return text


def scale_text(r: pb.RegionStatus) -> str:
    """What the scaler wants: ACTIVE (+ WARM standby); "-" without a record."""
    if not r.HasField("scale"):
        return "-"
    warm = f" +{r.scale.warm} warm" if r.scale.warm else ""
    if r.scale.active == 0:  # scale to zero: asleep on purpose, not down
        return f"[cyan]0 asleep[/]{warm}"
    return f"{r.scale.active}{warm}"


def _clock(at: float) -> str:
    """A wall-clock time in UTC, with how far away it is."""
    left = at - time.time()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
    return f"{when} (in {left / 60:.0f} min)" if left >= 0 else when


def status_table(st: pb.StatusResponse) -> Table:
    leader = st.leader or "[red]none[/red]"
    title = f"leader {leader} · answered by {st.responder}"
    if st.paused:
        title += f" · [bold yellow]AUTOMATION PAUSED[/bold yellow] ({st.pause_reason})"
        if st.paused_until:  # absent from older servers
            title += f" until {_clock(st.paused_until)}"
    if st.HasField("store") and not st.store.writable:  # absent from older servers
        title += f" · [bold red]ETCD REFUSES WRITES[/bold red] ({st.store.reason})"
    t = Table(title=title, title_justify="left")
    cols = (
        "region", "zone", "state", "health", "cbu", "scale", "since", "routing", "progress",
        "reason",
    )  # fmt: skip
    for col in cols:
        t.add_column(col)
    shown_region = ""
    for r in st.regions:
        if r.pool_of and r.pool_of != shown_region:  # a region's pools, under its name
            t.add_row(f"[bold]{r.pool_of}[/bold]", r.zone, *[""] * (len(cols) - 2))
        shown_region = r.pool_of
        state, health = state_name(r.state), HEALTH_NAME.get(r.health, "?")
        shown = f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"
        if r.state == pb.REGION_STATE_UNKNOWN:
            shown += f" (stored: {state_name(r.stored_state)})"
        progress = r.failover_steps_done or (
            f"recovery {r.recovery_step}/{r.recovery_steps}" if r.recovery_steps else ""
        )
        if r.degradation_steps:
            ladder = "ladder: " + ", ".join(r.degradation_steps)
            progress = f"{progress}; {ladder}" if progress else ladder
        name = f"  └ {r.name} ({', '.join(r.models)})" if r.pool else r.name
        name += " [red](barred)[/red]" if r.barred else ""
        if r.HasField("hold"):  # absent from older servers, and while not held
            name += f" [bold yellow](held until {_clock(r.hold.until)})[/]"
            progress = (
                f"{progress}; held: {r.hold.reason}" if progress else f"held: {r.hold.reason}"
            )
        if r.HasField("budget_lift"):  # absent from older servers, and while not lifted
            name += f" [bold yellow](budget lifted until {_clock(r.budget_lift.until)})[/]"
            lifted = f"budget lifted: {r.budget_lift.reason}"
            progress = f"{progress}; {lifted}" if progress else lifted
        t.add_row(
            name,
            r.zone,
            shown,
            f"[{HEALTH_STYLE.get(health, 'white')}]{health}[/]",
            cbu_text(r.capacity) if r.HasField("capacity") else "-",
            scale_text(r),
            ago(r.since),
            routing_text(dict(r.routing)),
            progress,
            r.reason,
        )
    return t


def regions_table(st: pb.StatusResponse) -> Table:
    t = Table(title="observers and signals", title_justify="left")
    for col in ("region", "votes", "signals"):
        t.add_column(col)
    for r in st.regions:
        votes = ", ".join(f"{k}={v}" for k, v in sorted(r.votes.items()))
        signals = ", ".join(f"{k}={v:g}" for k, v in sorted(r.signals.items()))
        t.add_row(r.name, votes or "-", signals or "-")
    return t


def event_line(e: pb.Event) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(e.at))
    if e.HasField("decision"):
        d = e.decision
        cause = f", {d.cause}" if d.cause and d.cause != "automatic" else ""
        what = f"{state_name(d.from_state)} → {state_name(d.to_state)} ({d.trigger}{cause})"
    else:
        what = e.action + (f" [{e.result}]" if e.result and e.result != "ok" else "")
    extra = "; ".join(f"{k}={v}" for k, v in sorted(e.details.items()))
    return (
        f"{when}  {e.region or '-':<12} {what}  by {e.actor}"
        + (f": {e.reason}" if e.reason else "")
        + (f"  ({extra})" if extra else "")
    )


def plan_text(p: pb.FailoverPlan) -> str:
    lines = [
        f"fail over {p.source} → {routing_text(dict(p.targets))}"
        + (" [forced]" if p.forced else "")
        + (" · pre-warm first, then switch" if p.warm_first else " · switch, then warm")
    ]
    if p.headroom_short:
        lines.append("  [yellow]warning: targets' headroom is short of the source's load[/]")
    lines += [f"  note: {n}" for n in p.notes]
    return "\n".join(lines)
