"""Named contexts for failoverctl, like kubectl's: one YAML file names each control
plane (its replicas, TLS files, token file, actor, timeout) so that on-call types
``failoverctl --context prod-eu status`` instead of five flags.

The file is ``$TECTONIC_CONFIG``, else ``$XDG_CONFIG_HOME/tectonic/failoverctl.yaml``
(``~/.config/tectonic/failoverctl.yaml`` when XDG_CONFIG_HOME is unset)::

    current-context: prod-eu
    contexts:
      prod-eu:
        server: cp-0.eu:50051,cp-1.eu:50051
        ca: ~/.tectonic/eu-ca.pem
        token-file: ~/.tectonic/eu-token     # the token itself is never in this file
        actor: alice
        timeout: 10

Precedence, per setting: a command-line flag or its environment variable
(``TECTONIC_SERVER``...) > the context > the built-in default. The context is
``--context``, else ``$TECTONIC_CONTEXT``, else ``current-context``. Relative paths
are relative to the file's folder. Any problem with the file is exit code 2, before
anything is called.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.table import Table

from controlplane.cli.client import EXIT_BAD_INPUT, Credentials
from controlplane.cli.common import JsonOpt, _error, err, out

_FIX = "fix the file, or point TECTONIC_CONFIG at another one (see failoverctl config --help)"


class ContextError(Exception):
    """A problem with the config file or the chosen context: exit code 2."""


class Context(BaseModel):
    """One control plane: ``server`` is required, the rest is optional."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    server: str = Field(min_length=1, description="host:port[,host:port]")
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token_file: str | None = Field(default=None, alias="token-file")
    actor: str | None = None
    timeout: float | None = Field(default=None, gt=0)


class ConfigFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    current_context: str | None = Field(default=None, alias="current-context")
    contexts: dict[str, Context] = Field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    """failoverctl's connection settings, as the global options give them."""

    server: str
    actor: str
    timeout: float
    ca: str
    cert: str
    key: str
    token: str

    def credentials(self) -> Credentials:
        return Credentials(
            ca=self.ca or None,
            cert=self.cert or None,
            key=self.key or None,
            token=self.token or None,
        )


def config_path() -> Path:
    """``$TECTONIC_CONFIG``, else the XDG config folder's tectonic/failoverctl.yaml."""
    explicit = os.environ.get("TECTONIC_CONFIG", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "tectonic" / "failoverctl.yaml"


def _explicit_file() -> bool:
    return bool(os.environ.get("TECTONIC_CONFIG", "").strip())


def _problems(path: Path, e: ValidationError) -> str:
    lines = []
    for p in e.errors():
        where = ".".join(str(x) for x in p["loc"]) or "(top level)"
        if p["type"] == "extra_forbidden" and p["loc"][-1] == "token":
            lines.append(
                f"{where}: a token is never stored in the file; put it in a file of its "
                "own and name that file with token-file"
            )
        elif p["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown field (a typo?)")
        else:
            lines.append(f"{where}: {p['msg']}")
    return f"config file {path} is not valid: " + "; ".join(lines) + f"; {_FIX}"


def parse(text: str, path: Path) -> ConfigFile:
    """The file's text as a ConfigFile; ContextError naming ``path`` and the fix."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ContextError(f"config file {path} is not valid YAML ({e}); {_FIX}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ContextError(f"config file {path} must be a mapping (current-context, contexts)")
    try:
        return ConfigFile.model_validate(data)
    except ValidationError as e:
        raise ContextError(_problems(path, e)) from None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ContextError(f"cannot read config file {path}: {e}; {_FIX}") from None


def load(path: Path) -> ConfigFile | None:
    """The config file, or None when it does not exist (and was not asked for by name)."""
    if not path.exists():
        if _explicit_file():
            raise ContextError(
                f"config file {path} (TECTONIC_CONFIG) does not exist; create it or unset "
                "TECTONIC_CONFIG"
            )
        return None
    return parse(_read(path), path)


def _resolve_path(p: str, path: Path) -> str:
    """``~`` expanded; a relative path is relative to the config file's folder."""
    q = Path(p).expanduser()
    return str(q if q.is_absolute() else path.parent / q)


def select(name: str) -> tuple[str, Context, Path] | None:
    """The context to use: ``name`` (--context or TECTONIC_CONTEXT), else the file's
    current-context; None when there is neither (or no file and no name)."""
    path = config_path()
    cfg = load(path)
    if cfg is None:
        if name:
            raise ContextError(
                f"context {name!r} asked for (--context or TECTONIC_CONTEXT) but there is no "
                f"config file at {path}; create it (see failoverctl config --help) or set "
                "TECTONIC_CONFIG"
            )
        return None
    name = name or cfg.current_context or ""
    if not name:
        return None
    if name not in cfg.contexts:
        known = ", ".join(sorted(cfg.contexts)) or "none"
        raise ContextError(
            f"no context {name!r} in config file {path} (contexts: {known}); pass --context "
            "with one of them, or run failoverctl config use-context NAME"
        )
    return name, cfg.contexts[name], path


def _read_token(token_file: str, name: str, path: Path) -> str:
    try:
        token = Path(token_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ContextError(
            f"cannot read token-file {token_file} of context {name!r} ({path}): {e}"
        ) from None
    if not token:
        raise ContextError(f"token-file {token_file} of context {name!r} ({path}) is empty")
    return token


def _given(ctx: typer.Context, param: str) -> bool:
    """Whether the option came from the command line or its environment variable
    (click's ParameterSource; by name, as Typer may vendor its own click)."""
    source = ctx.get_parameter_source(param)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def apply_context(ctx: typer.Context, name: str, s: Settings) -> Settings:
    """``s`` with every setting neither a flag nor an env var gave taken from the chosen
    context (if any); raises ContextError for any problem with the file."""
    chosen = select(name)
    if chosen is None:
        return s
    name, c, path = chosen
    got: dict[str, Any] = {}
    if not _given(ctx, "server"):
        got["server"] = c.server
    if c.actor and not _given(ctx, "actor"):
        got["actor"] = c.actor
    if c.timeout is not None and not _given(ctx, "timeout"):
        got["timeout"] = c.timeout
    for f in ("ca", "cert", "key"):
        value = getattr(c, f)
        if value and not _given(ctx, f):
            got[f] = _resolve_path(value, path)
    if c.token_file and not _given(ctx, "token"):
        got["token"] = _read_token(_resolve_path(c.token_file, path), name, path)
    return replace(s, **got)


def with_context(ctx: typer.Context, name: str, s: Settings) -> Settings:
    """``main``: apply_context, a problem with the file an error (text: there is no Ctx
    yet) and exit code 2. ``failoverctl config`` reads the file itself (so that
    use-context can fix a current-context that names no context)."""
    if ctx.invoked_subcommand == "config":
        return s
    try:
        return apply_context(ctx, name, s)
    except ContextError as e:
        raise _error(str(e), EXIT_BAD_INPUT, False) from None


# ---- failoverctl config ---------------------------------------------------------------

config_app = typer.Typer(
    help="Named contexts (like kubectl's): the file $TECTONIC_CONFIG, else "
    "~/.config/tectonic/failoverctl.yaml ($XDG_CONFIG_HOME respected). It holds "
    "'current-context: NAME' and 'contexts: {NAME: {server, ca, cert, key, token-file, "
    "actor, timeout}}' (all but server optional). A token is never stored in the file: "
    "token-file names a file holding it (read and stripped). Flags and TECTONIC_* env "
    "vars win over the context, the context over the defaults; --context NAME, else "
    "TECTONIC_CONTEXT, else current-context picks it.",
    short_help="Named contexts, like kubectl's: the control planes of the config file.",
    no_args_is_help=True,
)


def _context_dict(c: Context) -> dict[str, Any]:
    return c.model_dump(by_alias=True, exclude_none=True)


def _view_table(cfg: ConfigFile, in_use: str) -> Table:
    t = Table("", "context", "server", "ca", "cert / key", "token-file", "actor", "timeout")
    for name, c in sorted(cfg.contexts.items()):
        t.add_row(
            "*" if name == in_use else "",
            name,
            c.server,
            c.ca or "-",
            f"{c.cert} / {c.key}" if c.cert or c.key else "-",
            c.token_file or "-",
            c.actor or "-",
            f"{c.timeout:g}s" if c.timeout is not None else "-",
        )
    return t


def _load_or_fail(json_out: bool) -> tuple[Path, ConfigFile | None]:
    path = config_path()
    try:
        return path, load(path)
    except ContextError as e:
        raise _error(str(e), EXIT_BAD_INPUT, json_out) from None


@config_app.command("view")
def view(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """The config file's contexts and which one is in use (*); never a token.

    The file holds token-file paths only, and that is what is shown.

    Example: failoverctl config view --json | jq '.contexts | keys'
    """
    path, cfg = _load_or_fail(json_out)
    cfg = cfg or ConfigFile()
    in_use = _context_name(ctx) or cfg.current_context or ""
    if json_out:
        data = {
            "file": str(path),
            "exists": path.exists(),
            "current-context": cfg.current_context,
            "in-use": in_use or None,
            "contexts": {n: _context_dict(c) for n, c in sorted(cfg.contexts.items())},
        }
        out.print_json(json.dumps(data))
        return
    if not path.exists():
        err.print(f"no config file at {path}; see failoverctl config --help", highlight=False)
        return
    out.print(f"config file: {path}", highlight=False)
    out.print(f"current-context: {cfg.current_context or '(none)'}", highlight=False)
    if in_use and in_use != cfg.current_context:
        out.print(f"in use (--context / TECTONIC_CONTEXT): {in_use}", highlight=False)
    if cfg.contexts:
        out.print(_view_table(cfg, in_use))
    else:
        out.print("no contexts")


def _context_name(ctx: typer.Context) -> str:
    """The context --context or TECTONIC_CONTEXT named (the root command's option)."""
    name = ctx.find_root().params.get("context")
    return str(name or "")


_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]*")
_CURRENT = re.compile(r"^current-context[ \t]*:.*?(?P<comment>[ \t]+#.*)?$", re.MULTILINE)


def rewrite_current(text: str, name: str) -> str:
    """``text`` with its top-level current-context set to ``name``; the rest (other
    keys, comments, layout, the line's own comment) as it was."""
    scalar = name if _PLAIN.fullmatch(name) else json.dumps(name)  # JSON strings are YAML
    line = f"current-context: {scalar}"
    if _CURRENT.search(text):
        return _CURRENT.sub(lambda m: line + (m["comment"] or ""), text, count=1)
    return f"{line}\n{text}"


def _write(path: Path, text: str) -> None:
    """Replace the file at once (a crash leaves the old or the new one), same mode."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@config_app.command("use-context")
def use_context(
    name: Annotated[str, typer.Argument(help="A context of the config file.")],
) -> None:
    """Make NAME the file's current-context (the rest of the file is kept as it is).

    Example: failoverctl config use-context prod-eu
    """
    path, cfg = _load_or_fail(False)
    if cfg is None:
        raise _error(
            f"no config file at {path}; create it (see failoverctl config --help)",
            EXIT_BAD_INPUT,
            False,
        )
    if name not in cfg.contexts:
        known = ", ".join(sorted(cfg.contexts)) or "none"
        raise _error(f"no context {name!r} in {path} (contexts: {known})", EXIT_BAD_INPUT, False)
    try:
        text = rewrite_current(_read(path), name)
        if parse(text, path).current_context != name:
            raise ContextError(f"could not set current-context in {path}; edit it by hand")
        _write(path, text)
    except (ContextError, OSError) as e:
        raise _error(str(e), EXIT_BAD_INPUT, False) from None
    err.print(f"current context: {name} ({path})", highlight=False)
