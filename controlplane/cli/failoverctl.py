"""failoverctl — the on-call CLI for Tectonic.

Talks gRPC to any control-plane replica (``--server``, or ``TECTONIC_SERVER``; a
comma-separated list is tried in order). Everything that moves traffic asks for a
reason and a confirmation; ``--json`` prints machine-readable output; exit codes are
documented in ``controlplane/cli/client.py`` and in ``failoverctl --help``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Annotated

import typer
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.cli import render
from controlplane.cli.capacity_cmds import capacity_app
from controlplane.cli.client import (
    DEFAULT_SERVER,
    EXIT_BAD_INPUT,
    EXIT_REFUSED,
    Client,
    default_actor,
)
from controlplane.cli.common import (
    Ctx,
    ForOpt,
    JsonOpt,
    ModelOpt,
    ReasonOpt,
    YesOpt,
    _call,
    _confirm,
    _ctx,
    _exit_on_error,
    _show,
    _start,
    _status,
    _units,
    err,
    out,
    parse_duration,
)
from controlplane.cli.contexts import Settings, config_app, with_context
from controlplane.cli.cost_cmds import cost_app
from controlplane.cli.dashboard_cmd import dashboard
from controlplane.cli.doctor_cmd import doctor
from controlplane.cli.drill_cmds import drill_app, prefixes_app, readiness_app
from controlplane.cli.hold_cmds import hold, release
from controlplane.cli.scale_cmds import scale_app
from controlplane.kernel.version import version_text

HELP = (
    "The on-call CLI for Tectonic: region states, failovers, recovery, sessions.\n\n"
    "Exit codes: 0 done · 1 refused by the control plane (a safety rule; your token's role "
    "is too low, e.g. a viewer asking for a failover, which needs operator; or rate limited: "
    "retry after the time it says) · 2 bad input · 3 control plane unreachable or the TLS "
    "handshake refused (nothing changed) · 4 aborted at the confirmation prompt · 5 not "
    "authenticated (no --token / TECTONIC_TOKEN, or one the control plane does not know).\n\n"
    "Secured deployments: --ca (TECTONIC_CA) verifies the control plane; --cert/--key "
    "(TECTONIC_CERT/TECTONIC_KEY) are your client certificate for mutual TLS; --token "
    "(prefer the env TECTONIC_TOKEN: command lines show up in ps) is your bearer token.\n\n"
    "Contexts: --context NAME (TECTONIC_CONTEXT, else current-context) of $TECTONIC_CONFIG "
    "or ~/.config/tectonic/failoverctl.yaml gives what no flag or env var does (a token "
    "only by token-file, a path): failoverctl config --help. With --json an error is one "
    'JSON object on stderr: {"error": {"code", "message", "kind"}}.'
)

app = typer.Typer(help=HELP, no_args_is_help=True, rich_markup_mode="rich")
sessions_app = typer.Typer(help="Look up or pin a sticky session.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_text("failoverctl"))
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    server: Annotated[
        str,
        typer.Option(
            envvar="TECTONIC_SERVER", help="Control-plane replicas, host:port[,host:port]."
        ),
    ] = DEFAULT_SERVER,
    actor: Annotated[
        str, typer.Option(envvar="TECTONIC_ACTOR", help="Who you are, for the audit log.")
    ] = "",
    timeout: Annotated[float, typer.Option(help="Seconds per call.")] = 5.0,
    ca: Annotated[
        str, typer.Option(envvar="TECTONIC_CA", help="PEM CA that signed the control plane (TLS).")
    ] = "",
    cert: Annotated[
        str, typer.Option(envvar="TECTONIC_CERT", help="Your PEM client certificate (mTLS).")
    ] = "",
    key: Annotated[
        str, typer.Option(envvar="TECTONIC_KEY", help="Your PEM client key (mTLS).")
    ] = "",
    token: Annotated[
        str,
        typer.Option(
            envvar="TECTONIC_TOKEN",
            help="Bearer token (prefer the env var); the audit log records its principal.",
            show_default=False,
        ),
    ] = "",
    context: Annotated[
        str,
        typer.Option(
            envvar="TECTONIC_CONTEXT",
            help="The context of the config file for what no flag or env var gives "
            "(default: its current-context); see failoverctl config --help.",
            show_default=False,
        ),
    ] = "",
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            # eager: print and exit before --server and the credentials are checked
            is_eager=True,
            callback=_print_version,
            help="Print the Tectonic version and exit.",
        ),
    ] = False,
) -> None:
    s = with_context(ctx, context, Settings(server, actor, timeout, ca, cert, key, token))
    servers = [x.strip() for x in s.server.split(",") if x.strip()]
    if not servers:
        err.print("error: --server is empty")
        raise typer.Exit(EXIT_BAD_INPUT)
    if bool(s.cert) != bool(s.key):
        err.print("error: --cert and --key go together (your client certificate and its key)")
        raise typer.Exit(EXIT_BAD_INPUT)
    client = Client(servers, s.timeout, s.credentials())
    ctx.obj = _start(Ctx(client, s.actor or default_actor(), False))


@app.command()
def status(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Every region's state, health, capacity utilisation (CBU), routing and progress.

    Example: failoverctl status --json | jq '.regions[] | select(.state != "NORMAL")'
    """
    c = _ctx(ctx, json_out)
    st = _status(c)
    _show(c, st, lambda: out.print(render.status_table(st)))


@app.command()
def regions(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Who sees each region how: observer votes and the signals behind the verdict.

    Example: failoverctl regions
    """
    c = _ctx(ctx, json_out)
    st = _status(c)
    _show(c, st.regions, lambda: out.print(render.regions_table(st)))


@app.command()
def history(
    ctx: typer.Context,
    region: Annotated[str, typer.Option(help="Only this region.")] = "",
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many, newest last.")] = 50,
    json_out: JsonOpt = False,
) -> None:
    """The audit log: transitions, switches, intents, pauses — who, what, why.

    Example: failoverctl history --region us-east --limit 20
    """
    c = _ctx(ctx, json_out)
    h = _call(c, lambda s: s.GetHistory, pb.HistoryRequest(region=region, limit=limit))

    def lines() -> None:
        for ev in h.events:
            out.print(render.event_line(ev), highlight=False)

    _show(c, h.events, lines)


@app.command()
def events(
    ctx: typer.Context,
    region: Annotated[str, typer.Option(help="Only this region.")] = "",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming.")] = False,
    replay: Annotated[int, typer.Option(min=0, max=1000, help="Recent events first.")] = 20,
    json_out: JsonOpt = False,
) -> None:
    """Stream events as they happen (Ctrl-C to stop); without --follow, show recent ones.

    Example: failoverctl events --follow --region us-east
    """
    c = _ctx(ctx, json_out)
    if not follow:
        history(ctx, region=region, limit=max(replay, 1), json_out=json_out)
        return
    with _exit_on_error(), contextlib.suppress(KeyboardInterrupt):
        for e in c.client.stream(
            lambda s: s.WatchEvents(pb.WatchEventsRequest(region=region, replay=replay))
        ):
            if c.json:
                out.print_json(data=render.to_dict(e))
            else:
                out.print(render.event_line(e), highlight=False)


def _intent_status(c: Ctx, intent_id: str) -> pb.IntentStatus:
    got: pb.IntentStatus = _call(c, lambda s: s.GetIntent, pb.GetIntentRequest(intent_id=intent_id))
    return got


def _wait_for_intent(c: Ctx, intent_id: str, deadline: float) -> pb.IntentStatus | None:
    """The intent's outcome once the leader has decided it; None if still pending at
    ``deadline`` (no leader acting?)."""
    while time.monotonic() < deadline:
        st = _intent_status(c, intent_id)
        if st.state != pb.INTENT_PENDING:
            return st
        time.sleep(0.3)
    return None


def _wait_for_outcome(c: Ctx, region: str, intent_id: str, epoch0: int, within: float) -> None:
    """Wait for the leader to carry out the intent (a refusal ends the command with exit
    code 1 and the leader's reason), then for the routing switch."""
    deadline = time.monotonic() + within
    outcome = _wait_for_intent(c, intent_id, deadline)
    if outcome is None:
        err.print(
            f"[yellow]intent {intent_id} still pending after {within:.0f}s[/]: no leader has "
            f"acted on it yet; `failoverctl intent {intent_id}` tells its outcome"
        )
        return
    if outcome.state == pb.INTENT_REFUSED:
        err.print(f"[bold red]refused by the leader:[/] {outcome.detail}", highlight=False)
        raise typer.Exit(EXIT_REFUSED)
    _wait_for_switch(c, region, epoch0, max(deadline - time.monotonic(), 1.0))


def _wait_for_switch(c: Ctx, region: str, epoch0: int, within: float) -> None:
    """Show progress until the failover's routing switch is recorded (or the region has
    already moved on past it: a fast recovery can follow within seconds)."""
    deadline, last = time.monotonic() + within, ""
    while time.monotonic() < deadline:
        r = next(x for x in _status(c).regions if x.name == region)
        steps = r.failover_steps_done.split(",") if r.failover_steps_done else []
        now = f"{render.state_name(r.state)}, steps done: {', '.join(steps) or 'none yet'}"
        if now != last:
            err.print(f"  {region}: {now}", highlight=False)
            last = now
        if "switch" in steps:
            err.print(f"{region}: traffic now goes to {render.routing_text(dict(r.routing))}")
            return
        if r.epoch > epoch0 and r.state != pb.FAILING_OVER:
            err.print(
                f"{region}: failed over and already moved on to "
                f"{render.state_name(r.state)}; see failoverctl history"
            )
            return
        time.sleep(0.3)
    err.print(
        f"[yellow]still in progress after {within:.0f}s[/]; follow with "
        f"`failoverctl events -f --region {region}`"
    )


@app.command()
def failover(
    ctx: typer.Context,
    region: Annotated[
        str,
        typer.Argument(
            help="The region to move traffic away from (with model pools: all of its "
            "pools, one with --model, or a pool by its name <region>.<pool>)."
        ),
    ],
    reason: ReasonOpt,
    to: Annotated[
        list[str] | None, typer.Option("--to", help="Target region (repeatable).")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(help="Override the residency, barred and headroom rules. Needs a reason."),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan only.")] = False,
    yes: YesOpt = False,
    wait: Annotated[
        bool, typer.Option(help="Wait for the leader to carry it out and for the switch.")
    ] = True,
    json_out: JsonOpt = False,
    model: ModelOpt = "",
) -> None:
    """Move a region's traffic to other regions (shows the plan, then asks).

    Example: failoverctl failover us-east --reason "INC-42: TTFT 5x" --to us-west
    Example: failoverctl failover us-east --model qwen-coder --reason "bad rollout"
    """
    c = _ctx(ctx, json_out)
    units = _units(c, region, model)
    reqs = [
        pb.FailoverRequest(
            region=u, to=to or [], reason=reason, force=force, actor=c.actor, dry_run=True
        )
        for u in units
    ]
    plans = [_call(c, lambda s: s.RequestFailover, req) for req in reqs]

    def one_or_all(
        msgs: list[pb.FailoverResponse],
    ) -> pb.FailoverResponse | list[pb.FailoverResponse]:
        return msgs[0] if len(msgs) == 1 else msgs  # one region: one object, as ever

    def show_plans() -> None:
        for plan in plans:
            out.print(render.plan_text(plan.plan))

    if dry_run:
        _show(c, one_or_all(plans), show_plans)
        return
    if not c.json:
        show_plans()
    _confirm(f"Fail over {', '.join(units)} now?", yes)
    epochs = {x.name: x.epoch for x in _status(c).regions}
    resps = []
    for req in reqs:
        req.dry_run = False
        resps.append(_call(c, lambda s: s.RequestFailover, req))
    ids = ", ".join(
        f"{req.region}: intent {r.intent_id}" for req, r in zip(reqs, resps, strict=True)
    )
    _show(
        c,
        one_or_all(resps),
        lambda: err.print(
            f"accepted: {ids}" if len(reqs) > 1 else f"accepted: intent {resps[0].intent_id}"
        ),
    )
    if wait and not c.json:
        for req, resp in zip(reqs, resps, strict=True):
            _wait_for_outcome(c, req.region, resp.intent_id, epochs[req.region], 60.0)


@app.command()
def intent(
    ctx: typer.Context,
    intent_id: Annotated[str, typer.Argument(help="The id a failover or recover printed.")],
    json_out: JsonOpt = False,
) -> None:
    """What the leader did with an accepted failover or recovery: pending, done, refused.

    Example: failoverctl intent 3f9c2a1b7e4d --json
    """
    c = _ctx(ctx, json_out)
    st = _intent_status(c, intent_id)

    def text() -> None:
        state = pb.IntentState.Name(st.state).removeprefix("INTENT_").lower()
        out.print(
            f"intent {st.intent_id}: {st.kind} {st.region} by {st.actor}: {state}"
            + (f" ({st.detail})" if st.detail else ""),
            highlight=False,
        )

    _show(c, st, text)
    if st.state == pb.INTENT_REFUSED:
        raise typer.Exit(EXIT_REFUSED)


@app.command()
def recover(
    ctx: typer.Context,
    region: Annotated[
        str,
        typer.Argument(
            help="A FAILING_OVER region to bring back (with model pools: all of its pools, "
            "one with --model, or a pool by its name <region>.<pool>)."
        ),
    ],
    reason: ReasonOpt,
    yes: YesOpt = False,
    json_out: JsonOpt = False,
    model: ModelOpt = "",
) -> None:
    """Start graduated recovery of a failed-over region now, without waiting for the dwell.

    Example: failoverctl recover us-east --reason "driver rolled back"
    """
    c = _ctx(ctx, json_out)
    units = _units(c, region, model)
    what = ", ".join(units)
    _confirm(f"Start recovery of {what}? New sessions will move back in steps.", yes)
    resps = [
        _call(
            c,
            lambda s: s.RequestRecovery,
            pb.RecoveryRequest(region=u, reason=reason, actor=c.actor),
        )
        for u in units
    ]
    ids = ", ".join(r.intent_id for r in resps)
    accepted = f"accepted: intent {ids}; follow with failoverctl status"
    _show(c, resps[0] if len(resps) == 1 else resps, lambda: err.print(accepted))


@app.command()
def pause(
    ctx: typer.Context, reason: ReasonOpt, for_: ForOpt = "1h", json_out: JsonOpt = False
) -> None:
    """Stop automatic failovers, recovery steps, the ladder and the scaler for a while
    (manual commands still work); automation resumes by itself when it ends.

    Example: failoverctl pause --reason "etcd maintenance" --for 2h
    """
    c = _ctx(ctx, json_out)
    seconds = parse_duration(for_)
    req = pb.PauseRequest(reason=reason, actor=c.actor, for_s=seconds)
    resp = _call(c, lambda s: s.Pause, req)
    _show(c, resp, lambda: err.print(f"automation paused for {for_}: it resumes by itself then"))


@app.command()
def resume(ctx: typer.Context, reason: ReasonOpt, json_out: JsonOpt = False) -> None:
    """Resume automation before its pause ends.

    Example: failoverctl resume --reason "INC-123 closed"
    """
    c = _ctx(ctx, json_out)
    resp = _call(c, lambda s: s.Resume, pb.PauseRequest(reason=reason, actor=c.actor))
    _show(c, resp, lambda: err.print("automation resumed"))


@sessions_app.command("get")
def sessions_get(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="The session id (x-session-id).")],
    json_out: JsonOpt = False,
) -> None:
    """Where a session is pinned.

    Example: failoverctl sessions get conv-8f2a
    """
    c = _ctx(ctx, json_out)
    info = _call(c, lambda s: s.GetSession, pb.GetSessionRequest(session_id=session_id))

    def text() -> None:
        if not info.found:
            out.print(f"{session_id}: not pinned (new or expired)")
        else:
            out.print(
                f"{session_id}: served in {info.region} (home {info.home}), moved "
                f"{info.moves} times, pinned {render.ago(info.pinned_at)}, epoch {info.epoch}"
            )

    _show(c, info, text)


@sessions_app.command("pin")
def sessions_pin(
    ctx: typer.Context,
    session_id: Annotated[str, typer.Argument(help="The session id.")],
    region: Annotated[str, typer.Option("--region", help="Serve it from this region.")],
    reason: ReasonOpt,
    yes: YesOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Pin a session to a region by hand (e.g. to debug one conversation).

    Example: failoverctl sessions pin conv-8f2a --region us-west --reason "repro INC-42"
    """
    c = _ctx(ctx, json_out)
    _confirm(f"Pin {session_id} to {region}?", yes)
    req = pb.PinSessionRequest(session_id=session_id, region=region, reason=reason, actor=c.actor)
    info = _call(c, lambda s: s.PinSession, req)
    _show(c, info, lambda: out.print(f"{session_id}: pinned to {info.region}"))


# The readiness, prefixes and drill commands (drill_cmds.py), capacity (capacity_cmds.py).
app.command()(hold)
app.command()(release)
app.command()(dashboard)
app.command()(doctor)
app.add_typer(readiness_app, name="readiness")
app.add_typer(prefixes_app, name="prefixes")
app.add_typer(drill_app, name="drill")
app.add_typer(capacity_app, name="capacity")
app.add_typer(scale_app, name="scale")
app.add_typer(cost_app, name="cost")
app.add_typer(config_app, name="config")


def run() -> None:
    app()


if __name__ == "__main__":
    run()
