"""The etcd channel when ``etcd.ca`` / ``etcd.user`` are set: TLS and etcd's own auth.

aetcd builds only plaintext channels, and its token reaches only the calls made through
its helpers, not the raw stubs ``EtcdStore`` uses. So with TLS or a user the store uses
this client instead: the same generated stubs on a channel built here, with etcd's
``token`` metadata added to every call by an interceptor. The token is fetched on first
use and fetched again after etcd says it is invalid (it expires when unused).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from aetcd import rpc

from controlplane.kernel.store.port import StoreError
from controlplane.kernel.store.settings import EtcdConfig

_AUTHENTICATE = "/etcdserverpb.Auth/Authenticate"
_INVALID_TOKEN = ("invalid auth token", "user name is empty")


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise StoreError(f"etcd.{what}: cannot read {path}: {e.strerror}") from None


class _Token(  # grpc is untyped here: its bases are Any
    grpc.aio.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.aio.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user, password
        self.channel: grpc.aio.Channel | None = None
        self._token: str | None = None
        self._lock = asyncio.Lock()

    async def _get(self) -> str:
        async with self._lock:
            if self._token is None:
                assert self.channel is not None
                resp = await rpc.AuthStub(self.channel).Authenticate(
                    rpc.AuthenticateRequest(name=self.user, password=self.password), timeout=5
                )
                self._token = str(resp.token)
            return self._token

    async def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        method = d.method.decode() if isinstance(d.method, bytes) else d.method
        if method == _AUTHENTICATE:
            return d
        md = grpc.aio.Metadata(*(d.metadata or ()), ("token", await self._get()))
        return grpc.aio.ClientCallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready)

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        call = await continuation(await self._details(client_call_details), request)
        try:
            await call
        except grpc.aio.AioRpcError as e:
            if any(m in (e.details() or "") for m in _INVALID_TOKEN):
                self._token = None  # the store retries; the retry authenticates again
        return call

    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(await self._details(client_call_details), request)

    async def intercept_stream_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(await self._details(client_call_details), request_iterator)

    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(await self._details(client_call_details), request_iterator)


class SecureEtcdClient:
    """What ``EtcdStore`` uses of an ``aetcd.Client``: the channel and three stubs."""

    def __init__(self, config: EtcdConfig, target: str, options: dict[str, Any]) -> None:
        opts = dict(options)
        interceptors: list[grpc.aio.ClientInterceptor] = []
        if config.user is not None and config.password_file is not None:
            password = _read(config.password_file, "password_file").decode().strip()
            token = _Token(config.user, password)
            interceptors.append(token)
        if config.ca is not None:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(config.ca, "ca"),
                private_key=_read(config.key, "key") if config.key else None,
                certificate_chain=_read(config.cert, "cert") if config.cert else None,
            )
            # The target lists resolved addresses; the certificates name the members.
            name = config.server_name or config.endpoints[0].rpartition(":")[0].strip("[]")
            opts["grpc.ssl_target_name_override"] = name
            self.channel = grpc.aio.secure_channel(
                target, creds, options=list(opts.items()), interceptors=interceptors or None
            )
        else:
            self.channel = grpc.aio.insecure_channel(
                target, options=list(opts.items()), interceptors=interceptors or None
            )
        for i in interceptors:
            if isinstance(i, _Token):
                i.channel = self.channel
        self.kvstub = rpc.KVStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()
