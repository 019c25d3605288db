"""What a replay carries: never a user's credentials, only the data plane's own.

Gateways keep the prompts a region answered, with the headers they were forwarded
with, to replay them there later (``regions.gateway.prompt_memory``, warm first), and
agents replay the leader's catalog to their replicas (pre-warm). A replay is the data
plane's own request, not the user's: what is kept for one is stripped of
``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``X-Api-Key`` and any header the
topology lists (``prefixes.replay_strip_headers``), so no credential sits in memory;
when it is sent, it authenticates with the data plane's own key (vLLM's
``--api-key``: ``Authorization: Bearer <key>``) when one is configured, else with none.
It carries a request id of its own, derived from the replayed request's (``replay_id``),
and the replayer's log lines name it (``controlplane/kernel/logs.py``).
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterable
from pathlib import Path

from controlplane.kernel.logs import REQUEST_ID_HEADER

# Lowercase: header names compare case-insensitively (RFC 9110 §5.1).
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key"})


def strip_names(extra: Iterable[str] = ()) -> frozenset[str]:
    """The lowercased names a replay is stripped of: the credentials and ``extra``."""
    return CREDENTIAL_HEADERS | {name.strip().lower() for name in extra if name.strip()}


def replay_headers(
    headers: Iterable[tuple[str, str]],
    strip: Iterable[str] = (),
    api_key: str | None = None,
    request_id: str | None = None,
) -> list[tuple[str, str]]:
    """``headers`` without the credential headers and those named in ``strip`` (any
    case); with ``Authorization: Bearer <api_key>`` when a key is given (the data
    plane's own, for vLLM's ``--api-key``); with ``x-request-id: <request_id>`` in place
    of the one kept when an id is given (a replay is a request of its own)."""
    names = strip_names(strip) | ({REQUEST_ID_HEADER} if request_id else set())
    out = [(k, v) for k, v in headers if k.lower() not in names]
    if api_key:
        out.append(("Authorization", f"Bearer {api_key}"))
    if request_id:
        out.append((REQUEST_ID_HEADER, request_id))
    return out


def replay_id(headers: Iterable[tuple[str, str]], kind: str) -> str:
    """The request id of a replay of ``kind`` (``warm``, ``prewarm``): the replayed
    request's own id with ``-<kind>`` after it, so a search for the user's request finds
    its replays too; ``<kind>-<new id>`` when it had none."""
    given = next((v for k, v in headers if k.lower() == REQUEST_ID_HEADER), "")
    return f"{given[:120]}-{kind}" if given else f"{kind}-{uuid.uuid4().hex}"


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
