"""Authentication, authorization and rate limits for every gRPC call: a server interceptor.

For each call: health checks and reflection pass; any other method must be in
``METHOD_PERMISSIONS`` (default deny); with tokens configured the caller's
``authorization: Bearer <token>`` names a principal whose role must grant the method's
permission; commands (drill, operate) then take one from the principal's rate bucket.
Refusals: UNAUTHENTICATED (no or unknown token), PERMISSION_DENIED (role too low, or a
method nobody may call), RESOURCE_EXHAUSTED (rate; trailing ``retry-after-ms``). The
principal is put in a context variable for the servicer: :func:`current_principal`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc

from controlplane.kernel.security import (
    METHOD_PERMISSIONS,
    RATE_LIMITED,
    Permission,
    Principal,
    RateLimiter,
    SecurityConfig,
    TokenVerifier,
    is_open,
    method_name,
    roles_with,
)

log = logging.getLogger("tectonic.auth")
RETRY_AFTER_KEY = "retry-after-ms"
ANONYMOUS = "anonymous"  # the rate-limit key when tokens are off

# gRPC runs each call's interceptors and handler in one fresh contextvars.Context, so a
# value set in intercept_service is seen by that call's servicer and by no other call.
_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "tectonic_principal", default=None
)


def current_principal() -> str | None:
    """The authenticated caller's name, inside a servicer method; None when tokens are
    off. Audit entries use it instead of the client-supplied ``actor``."""
    p = _principal.get()
    return p.name if p is not None else None


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        security: SecurityConfig,
        *,
        now: Callable[[], float] = time.monotonic,
        table: Mapping[str, Permission] | None = None,
    ) -> None:
        self.verifier = TokenVerifier(security.tokens)
        lim = security.limits
        self.limiter = RateLimiter(lim.mutating_per_minute, lim.mutating_burst, now)
        self.limits = lim
        self.table = table if table is not None else METHOD_PERMISSIONS

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method: str = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or is_open(method):
            return handler  # unknown methods stay UNIMPLEMENTED
        principal: Principal | None = None
        if self.verifier:
            token = _bearer(handler_call_details.invocation_metadata)
            if token is None:
                return _refuse(
                    handler,
                    grpc.StatusCode.UNAUTHENTICATED,
                    "no bearer token: send 'authorization: Bearer <token>' (failoverctl: "
                    "--token or TECTONIC_TOKEN; agents and gateways: security.token_file)",
                )
            principal = self.verifier.cached(token)
            if principal is None:
                # One scrypt (up to 0.4 s here): off the event loop; hashlib frees the GIL.
                principal = await asyncio.to_thread(self.verifier.verify, token)
            if principal is None:
                return _refuse(
                    handler,
                    grpc.StatusCode.UNAUTHENTICATED,
                    "invalid token: it matches no entry of security.tokens (revoked, "
                    "mistyped, or for another deployment)",
                )
        permission = self.table.get(method)
        if permission is None:
            return _refuse(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method} has no entry in the access table (controlplane/kernel/security.py "
                "METHOD_PERMISSIONS); refused by default",
            )
        if principal is not None and not principal.may(permission):
            needs = " or ".join(r.value for r in roles_with(permission))
            return _refuse(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"your token's role is {principal.role.value} (principal {principal.name}); "
                f"{method_name(method)} needs {needs}",
            )
        if permission in RATE_LIMITED:
            wait = self.limiter.take(principal.name if principal else ANONYMOUS)
            if wait > 0:
                return _refuse(
                    handler,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"rate limit: {self.limits.mutating_burst} commands at once, then "
                    f"{self.limits.mutating_per_minute:g} a minute per principal; "
                    f"retry in {wait:.1f}s",
                    trailing=((RETRY_AFTER_KEY, str(max(1, round(wait * 1000)))),),
                )
        _principal.set(principal)
        return handler


def _bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _refuse(
    handler: grpc.RpcMethodHandler,
    code: grpc.StatusCode,
    message: str,
    trailing: tuple[tuple[str, str], ...] = (),
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that only aborts with ``code``.
    The request is not even deserialized."""

    async def deny(context: grpc.aio.ServicerContext) -> None:
        log.warning("refused %s from %s: %s", code.name, context.peer(), message)
        await context.abort(code, message, trailing_metadata=trailing)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await deny(context)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await deny(context)
        yield  # pragma: no cover - makes this an async generator

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(stream)
    return grpc.unary_unary_rpc_method_handler(unary)
