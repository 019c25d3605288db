"""Requests that are not a message of their method's type get INVALID_ARGUMENT.

grpc.aio answers bytes its deserializer cannot parse with UNKNOWN ("Unexpected
DecodeError"), which reads as a server bug to a client. This interceptor wraps the
deserializer of every ``tectonic.v1`` method: a failure becomes a marker, and the
method answers INVALID_ARGUMENT saying which message was expected, before any of its
code runs (so nothing can change).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

OURS = "/tectonic.v1."


class _Undecodable:
    def __init__(self, why: str) -> None:
        self.why = why


def _safe(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as e:  # the protobuf runtime's DecodeError, or worse
            return _Undecodable(f"{type(e).__name__}: {e}"[:200])

    return parse


async def _refuse(method: str, bad: _Undecodable, context: grpc.aio.ServicerContext) -> None:
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"the request is not a valid {method.rsplit('/', 1)[-1]} request message ({bad.why})",
    )


class DecodeGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method: str = details.method
        if (
            handler is None
            or not method.startswith(OURS)
            or handler.request_streaming
            or handler.request_deserializer is None
        ):
            return handler
        parse = _safe(handler.request_deserializer)
        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, _Undecodable):
                    await _refuse(method, request, context)
                return await inner_unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=parse,
                response_serializer=handler.response_serializer,
            )
        inner_stream = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await _refuse(method, request, context)
            async for item in inner_stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=parse, response_serializer=handler.response_serializer
        )
