"""Checks every RPC of the gRPC service shares.

A bad request aborts with INVALID_ARGUMENT and a message that says what to do; etcd
trouble becomes UNAVAILABLE (retryable). Either way nothing was changed.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar, cast

import grpc

from controlplane.kernel.config import Topology
from controlplane.kernel.rpc.auth import current_principal
from controlplane.kernel.sessions.store import validate_session_id
from controlplane.kernel.store.port import StoreFull, StoreUnavailable

MAX_REASON = 1024
MAX_ACTOR = 128
DEFAULT_ACTOR = "operator"

Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def store_errors(fn: Handler) -> Handler:
    """etcd trouble becomes UNAVAILABLE (retryable), or RESOURCE_EXHAUSTED while etcd is
    full, instead of an opaque UNKNOWN with a traceback per call."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except StoreUnavailable as e:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"etcd is unreachable ({e}); nothing was changed, retry shortly",
            )
        except StoreFull as e:
            # Not UNAVAILABLE: retrying does not help until an operator frees space.
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"etcd refuses writes ({e}); nothing was changed (runbooks/etcd-space.md)",
            )

    return cast(Handler, wrapper)


async def abort(ctx: grpc.aio.ServicerContext, code: grpc.StatusCode, msg: str) -> NoReturn:
    await ctx.abort(code, msg)
    raise AssertionError("unreachable")  # ctx.abort raises


async def bad_request(ctx: grpc.aio.ServicerContext, msg: str) -> NoReturn:
    await abort(ctx, grpc.StatusCode.INVALID_ARGUMENT, msg)


async def known_region(ctx: grpc.aio.ServicerContext, topology: Topology, region: str) -> str:
    if region not in topology.names:
        await bad_request(
            ctx, f"unknown region {region[:64]!r}; known regions: {', '.join(topology.names)}"
        )
    return region


async def known_target(ctx: grpc.aio.ServicerContext, topology: Topology, region: str) -> str:
    """A drill's target: a failover unit, or a region with model pools (all of them)."""
    if region in topology.sites:
        return region
    return await known_region(ctx, topology, region)


async def checked_text(
    ctx: grpc.aio.ServicerContext, name: str, value: str, limit: int, *, required: bool
) -> str:
    """``value`` without surrounding blanks, at most ``limit`` characters."""
    value = value.strip()
    if required and not value:
        await bad_request(ctx, f"{name} is required: say why, for the audit log")
    if len(value) > limit:
        await bad_request(ctx, f"{name} is at most {limit} characters (got {len(value)})")
    return value


async def reason_and_actor(
    ctx: grpc.aio.ServicerContext, reason: str, actor: str, *, reason_required: bool = True
) -> tuple[str, str]:
    """An operator command's reason (for the audit log) and who asked (``operator``
    when the request does not say), checked in that order."""
    reason = await checked_text(ctx, "reason", reason, MAX_REASON, required=reason_required)
    actor = await checked_text(ctx, "actor", actor, MAX_ACTOR, required=False)
    # With tokens on, the audit log names the authenticated principal, never a claim.
    return reason, current_principal() or actor or DEFAULT_ACTOR


async def session_id(ctx: grpc.aio.ServicerContext, value: str) -> str:
    try:
        return validate_session_id(value)
    except ValueError as e:
        await bad_request(ctx, str(e))
