"""failoverctl's connection to the control plane: any replica, sync gRPC, clear errors.

Exit codes scripts can trust:

| code | meaning |
|---|---|
| 0 | done |
| 1 | refused: the control plane said no (a safety rule, a state that does not allow it) |
| 2 | bad input (unknown region, missing reason, malformed id), or a usage error |
| 3 | the control plane (or etcd behind it) is unreachable; nothing was changed |
| 4 | aborted by the operator at the confirmation prompt |
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import grpc
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

EXIT_OK, EXIT_REFUSED, EXIT_BAD_INPUT, EXIT_UNREACHABLE, EXIT_ABORTED = 0, 1, 2, 3, 4
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
    grpc.StatusCode.UNAUTHENTICATED: EXIT_REFUSED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: EXIT_BAD_INPUT,
    grpc.StatusCode.NOT_FOUND: EXIT_BAD_INPUT,
}
_RETRY_ELSEWHERE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass
class Client:
    """Tries each listed replica in turn; any replica answers reads and takes intents."""

    servers: list[str]
    timeout_s: float = 5.0

    def call(self, fn: Callable[[pb_grpc.ControlPlaneStub], T]) -> T:
        errors: list[str] = []
        for target in self.servers:
            with grpc.insecure_channel(target) as ch:
                stub = pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
                try:
                    return fn(stub)
                except grpc.RpcError as e:
                    code = e.code()
                    detail = e.details()
                    if code in _RETRY_ELSEWHERE:
                        errors.append(f"{target}: {code.name} {detail}")
                        continue
                    raise CliError(f"{code.name}: {detail}", _CODES.get(code, EXIT_REFUSED)) from e
        raise CliError(
            "control plane unreachable; tried "
            + "; ".join(errors)
            + ". Check --server (or TECTONIC_SERVER) and that a replica is running.",
            EXIT_UNREACHABLE,
        )

    def stream(self, fn: Callable[[pb_grpc.ControlPlaneStub], Iterator[T]]) -> Iterator[T]:
        """A server stream from the first replica that accepts it."""
        errors: list[str] = []
        for target in self.servers:
            with grpc.insecure_channel(target) as ch:
                stub = pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
                try:
                    yield from fn(stub)
                    return
                except grpc.RpcError as e:
                    code = e.code()
                    if code in _RETRY_ELSEWHERE:
                        errors.append(f"{target}: {code.name}")
                        continue
                    if code is grpc.StatusCode.CANCELLED:
                        return
                    raise CliError(
                        f"{code.name}: {e.details()}",
                        _CODES.get(code, EXIT_REFUSED),
                    ) from e
        raise CliError("control plane unreachable; tried " + "; ".join(errors), EXIT_UNREACHABLE)
