"""Helpers every failoverctl command uses: the consoles, the per-invocation context
(``Ctx``), the shared options, one unary call with its errors turned into exit codes,
``--json`` or text output, and the confirmation prompt.

In a module of their own so that failoverctl.py and its command modules (drill_cmds.py)
import them without importing each other.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from google.protobuf.message import Message
from rich.console import Console
from rich.markup import escape
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from controlplane.cli import render
from controlplane.cli.client import EXIT_ABORTED, EXIT_BAD_INPUT, EXIT_KINDS, Client, CliError

out = Console()
err = Console(stderr=True)
T = TypeVar("T")


@dataclass
class Ctx:
    client: Client
    actor: str
    json: bool


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
ReasonOpt = Annotated[str, typer.Option("--reason", "-r", help="Why (goes to the audit log).")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ForOpt = Annotated[
    str,
    typer.Option(
        "--for",
        help="How long it lasts: 90s, 30m, 2h, 1d (at most 7d); then it ends by itself, "
        "in the audit log. Run the command again to extend it.",
    ),
]
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``1d`` or plain seconds, in seconds (bad input: exit 2
    with what to type)."""
    t = text.strip().lower()
    scale = _DURATION_UNITS.get(t[-1:])
    try:
        value = float(t[:-1] if scale else t) * (scale or 1.0)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        what = f"--for {text!r} is not a duration: say 90s, 30m, 2h or 1d"
        raise _error(what, EXIT_BAD_INPUT, _wants_json())
    return value


# This invocation's Ctx, for the error helpers that are not handed one: set by ``main``
# (_start) and by every command (_ctx).
_CURRENT: ContextVar[Ctx | None] = ContextVar("failoverctl_ctx", default=None)


def _start(c: Ctx) -> Ctx:
    """``main``: ``c`` is this invocation's Ctx."""
    _CURRENT.set(c)
    return c


def _ctx(ctx: typer.Context, json_out: bool) -> Ctx:
    c: Ctx = ctx.obj
    c.json = json_out
    _CURRENT.set(c)
    return c


def _wants_json(c: Ctx | None = None) -> bool:
    """Whether the running command was given --json: ``c``'s, else that of the
    invocation's Ctx (for helpers not handed one: parse_duration, _confirm)."""
    c = c or _CURRENT.get()
    return bool(c is not None and c.json)


def _error(message: str, code: int, json_out: bool) -> typer.Exit:
    """Print an error on stderr, one JSON object with ``json_out``
    (``{"error": {"code", "message", "kind"}}``), and return the Exit to raise."""
    if json_out:
        body = {"code": code, "message": message, "kind": EXIT_KINDS.get(code, "error")}
        typer.echo(json.dumps({"error": body}), err=True)
    else:
        err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def _fail(e: CliError, c: Ctx | None = None) -> typer.Exit:
    """A CliError as an error on stderr (JSON when the command was given --json)."""
    return _error(str(e), e.code, _wants_json(c))


@contextlib.contextmanager
def _exit_on_error(c: Ctx | None = None) -> Iterator[None]:
    """A CliError ends the command: its message on stderr, its exit code."""
    try:
        yield
    except CliError as e:
        raise _fail(e, c) from None


def _call(c: Ctx, rpc: Callable[[pb_grpc.ControlPlaneStub], Callable[..., T]], request: Any) -> T:
    """One unary call, ``rpc(stub)(request)``, with the per-call timeout; see _exit_on_error."""
    with _exit_on_error(c):
        return c.client.call(lambda s: rpc(s)(request, timeout=c.client.timeout_s))


def _show(c: Ctx, msg: Message | Iterable[Message], text: Callable[[], object]) -> None:
    """With --json the message (or a list of the messages) as JSON on stdout; else ``text()``."""
    if not c.json:
        text()
    elif isinstance(msg, Message):
        render.print_json(out, render.to_dict(msg))
    else:
        render.print_json(out, [render.to_dict(m) for m in msg])


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        why = "refusing to act without confirmation: no terminal to ask on; pass --yes"
        if not _wants_json():
            err.print(why)
            raise typer.Exit(EXIT_ABORTED)
        raise _error(why, EXIT_ABORTED, True)
    if not typer.confirm(question, default=False):
        if not _wants_json():
            err.print("aborted; nothing was changed")
            raise typer.Exit(EXIT_ABORTED)
        raise _error("aborted; nothing was changed", EXIT_ABORTED, True)


def _status(c: Ctx) -> pb.StatusResponse:
    st: pb.StatusResponse = _call(c, lambda s: s.GetStatus, pb.GetStatusRequest())
    return st


ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        help="With model pools: only the pool of REGION that answers this model "
        "(default: every pool of the region).",
    ),
]


def _units(c: Ctx, region: str, model: str) -> list[str]:
    """The failover units REGION names: itself (a region without pools, or a pool's
    unit <region>.<pool>), else every pool of the region, or with ``model`` the one
    answering it. Exits with a clear error when none does."""
    regions = _status(c).regions
    units = [r for r in regions if r.name == region] or [r for r in regions if r.pool_of == region]
    if model:
        units = [r for r in units if model in r.models]
    if not units:
        known = sorted({r.pool_of or r.name for r in regions})
        what = (
            f"no pool of {region} answers model {model!r}" if model else f"unknown region {region}"
        )
        what += f" (regions: {', '.join(known)}; failoverctl status lists pools)"
        raise _error(what, EXIT_BAD_INPUT, c.json)
    return [r.name for r in units]


def _each_unit(
    c: Ctx,
    rpc: Callable[[pb_grpc.ControlPlaneStub], Callable[..., Any]],
    region: str,
    model: str,
    reason: str,
    said: Callable[[str], str],
    for_s: float | None = None,
) -> None:
    """One hold-shaped call (``HoldRequest``: hold, release, a budget's lift and its end)
    to each unit REGION names, then their answers as JSON, or ``said(their names)``."""
    timed = {} if for_s is None else {"for_s": for_s}
    resps = [
        _call(c, rpc, pb.HoldRequest(region=u, reason=reason, actor=c.actor, **timed))
        for u in _units(c, region, model)
    ]
    names = ", ".join(r.region for r in resps)
    _show(c, resps[0] if len(resps) == 1 else resps, lambda: err.print(said(names)))
