"""What a replay carries: never a user's credentials, only the data plane's own.

Gateways keep the prompts a region answered, with the headers they were forwarded
with, to replay them there later (``regions.gateway.prompt_memory``, warm first), and
agents replay the leader's catalog to their replicas (pre-warm). A replay is the data
plane's own request, not the user's: what is kept for one is stripped of
``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``X-Api-Key`` and any header the
topology lists (``prefixes.replay_strip_headers``), so no credential sits in memory;
when it is sent, it authenticates with the data plane's own key (vLLM's
``--api-key``: ``Authorization: Bearer <key>``) when one is configured, else with none.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

# Lowercase: header names compare case-insensitively (RFC 9110 §5.1).
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key"})


def strip_names(extra: Iterable[str] = ()) -> frozenset[str]:
    """The lowercased names a replay is stripped of: the credentials and ``extra``."""
    return CREDENTIAL_HEADERS | {name.strip().lower() for name in extra if name.strip()}


def replay_headers(
    headers: Iterable[tuple[str, str]],
    strip: Iterable[str] = (),
    api_key: str | None = None,
) -> list[tuple[str, str]]:
    """``headers`` without the credential headers and those named in ``strip`` (any
    case); with ``Authorization: Bearer <api_key>`` when a key is given (the data
    plane's own, for vLLM's ``--api-key``)."""
    names = strip_names(strip)
    out = [(k, v) for k, v in headers if k.lower() not in names]
    if api_key:
        out.append(("Authorization", f"Bearer {api_key}"))
    return out


def read_api_key(path: str | Path) -> str:
    """The replay API key in the file at ``path`` (its first line, stripped): a file,
    never a command-line value, which any local user could read from the process list.
    Raises ValueError when the file is empty."""
    text = Path(path).read_text(encoding="utf-8")
    key = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not key:
        raise ValueError(f"{path}: no API key in the file")
    return key


def add_replay_key_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    """``--replay-api-key-file`` for a process whose ``what`` (its replays) need the data
    plane's own key; read it with ``replay_key``."""
    p.add_argument(
        "--replay-api-key-file",
        default=None,
        metavar="PATH",
        help=f"a file holding the data plane's own API key for the replicas (vLLM's "
        f"--api-key): {what} send it as Authorization: Bearer, never a user's credentials; "
        "a file, not a value, to keep it out of the process list",
    )


def replay_key(p: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The key ``--replay-api-key-file`` names (None without it); a usage error naming
    the flag when the file cannot be read or holds none."""
    if not args.replay_api_key_file:
        return None
    try:
        return read_api_key(args.replay_api_key_file)
    except (OSError, ValueError) as e:
        p.error(f"--replay-api-key-file: {e}")
