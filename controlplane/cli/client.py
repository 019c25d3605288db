"""failoverctl's connection to the control plane: any replica, sync gRPC, clear errors.

Exit codes scripts can trust:

| code | meaning |
|---|---|
| 0 | done |
| 1 | refused: the control plane said no (a safety rule, a state that does not allow it) |
| 2 | bad input (unknown region, missing reason, malformed id), or a usage error |
| 3 | the control plane (or etcd behind it) is unreachable; nothing was changed |
| 4 | aborted by the operator at the confirmation prompt |
| 5 | not authenticated: no token, or one the control plane does not know (--token) |

With ``--json`` an error is one JSON object on stderr,
``{"error": {"code": 3, "message": "...", "kind": "unreachable"}}``, the kind one of
refused, bad_input, unreachable, aborted, unauthenticated (``EXIT_KINDS``).

A role too low for the command (``PERMISSION_DENIED``) and a rate limit are refusals
(1); an oversized request is bad input (2); a TLS handshake the server refused (wrong
CA, no client certificate) reads as unreachable (3), with a hint at --ca/--cert/--key.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from controlplane.kernel.config import ConfigError
from controlplane.kernel.rpc.tls import sync_channel

EXIT_OK, EXIT_REFUSED, EXIT_BAD_INPUT, EXIT_UNREACHABLE, EXIT_ABORTED = 0, 1, 2, 3, 4
EXIT_UNAUTHENTICATED = 5
# The ``kind`` of ``{"error": {"code", "message", "kind"}}``, what --json prints on stderr.
EXIT_KINDS = {
    EXIT_REFUSED: "refused",
    EXIT_BAD_INPUT: "bad_input",
    EXIT_UNREACHABLE: "unreachable",
    EXIT_ABORTED: "aborted",
    EXIT_UNAUTHENTICATED: "unauthenticated",
}
DEFAULT_SERVER = "127.0.0.1:50051"
T = TypeVar("T")


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def default_actor() -> str:
    return f"{os.environ.get('USER', 'unknown')}@{socket.gethostname()}"


_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: EXIT_BAD_INPUT,
    grpc.StatusCode.FAILED_PRECONDITION: EXIT_REFUSED,
    grpc.StatusCode.PERMISSION_DENIED: EXIT_REFUSED,
    grpc.StatusCode.UNAUTHENTICATED: EXIT_UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: EXIT_BAD_INPUT,
    grpc.StatusCode.NOT_FOUND: EXIT_BAD_INPUT,
}
_RETRY_ELSEWHERE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass(frozen=True)
class Credentials:
    """TLS files (``ca`` alone: server-verified TLS; with ``cert``/``key``: mutual TLS)
    and the bearer token; all None: plaintext, no token."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token: str | None = None


def _message(code: grpc.StatusCode, detail: str) -> str:
    """What the operator should do about a refusal of the security layer."""
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return (
            f"not authenticated: {detail}. Pass --token (or set TECTONIC_TOKEN) with a "
            "token from your Tectonic admin (python -m controlplane.kernel.security hash-token)."
        )
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return f"permission denied: {detail}. Ask your Tectonic admin for a token with that role."
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "rate limit" in detail:
        return f"refused: {detail}"
    return f"{code.name}: {detail}"


def _exit_code(code: grpc.StatusCode, detail: str) -> int:
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "rate limit" in detail:
        return EXIT_REFUSED  # not bad input: the same command works a little later
    return _CODES.get(code, EXIT_REFUSED)


_TLS_FILES = (
    "--ca must be the CA that signed the server's certificate, and a server that "
    "requires client certificates needs --cert/--key signed by its CA"
)


def _tls_hint(detail: str, tls: bool) -> str:
    low = detail.lower()
    if any(w in low for w in ("ssl", "handshake", "certificate", "tls")):
        return f" (TLS handshake failed: {_TLS_FILES})"
    if tls:
        # With TLS 1.3 a server that refuses our certificate just closes the socket.
        return f" (if a replica runs there, it may have refused the TLS handshake: {_TLS_FILES})"
    return ""


@dataclass
class Client:
    """Tries each listed replica in turn; any replica answers reads and takes intents."""

    servers: list[str]
    timeout_s: float = 5.0
    credentials: Credentials = field(default_factory=Credentials)

    def _channel(self, target: str) -> grpc.Channel:
        c = self.credentials
        return sync_channel(target, ca=c.ca, cert=c.cert, key=c.key, token=c.token)

    def _hint(self, detail: str) -> str:
        c = self.credentials
        return _tls_hint(detail, bool(c.ca or c.cert))

    def _open(self, target: str) -> grpc.Channel:
        try:
            return self._channel(target)
        except ConfigError as e:
            raise CliError(f"{e}", EXIT_BAD_INPUT) from None

    def call(self, fn: Callable[[pb_grpc.ControlPlaneStub], T]) -> T:
        errors: list[str] = []
        for target in self.servers:
            with self._open(target) as ch:
                stub = pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
                try:
                    return fn(stub)
                except grpc.RpcError as e:
                    code = e.code()
                    detail = e.details() or ""
                    if code in _RETRY_ELSEWHERE:
                        errors.append(f"{target}: {code.name} {detail}{self._hint(detail)}")
                        continue
                    raise CliError(_message(code, detail), _exit_code(code, detail)) from e
        raise CliError(
            "control plane unreachable; tried "
            + "; ".join(errors)
            + ". Check --server (or TECTONIC_SERVER, or the context's server: failoverctl "
            "config view) and that a replica is running.",
            EXIT_UNREACHABLE,
        )

    def stream(self, fn: Callable[[pb_grpc.ControlPlaneStub], Iterator[T]]) -> Iterator[T]:
        """A server stream from the first replica that accepts it."""
        errors: list[str] = []
        for target in self.servers:
            with self._open(target) as ch:
                stub = pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
                try:
                    yield from fn(stub)
                    return
                except grpc.RpcError as e:
                    code = e.code()
                    detail = e.details() or ""
                    if code in _RETRY_ELSEWHERE:
                        errors.append(f"{target}: {code.name}{self._hint(detail)}")
                        continue
                    if code is grpc.StatusCode.CANCELLED:
                        return
                    raise CliError(_message(code, detail), _exit_code(code, detail)) from e
        raise CliError("control plane unreachable; tried " + "; ".join(errors), EXIT_UNREACHABLE)
