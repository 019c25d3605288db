"""gRPC credentials from the ``security:`` section: server credentials, client channels
that present this process's certificate and bearer token, and where that token comes
from. Every link (failoverctl, agents, gateways, the leader's calls to agents) builds its
channel here, so TLS is either on for a link or refused by the other end, never half."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from controlplane.kernel.config import ConfigError
from controlplane.kernel.security import SecurityConfig, TlsConfig

TOKEN_ENV = "TECTONIC_TOKEN"
ChannelOptions = Sequence[tuple[str, Any]]


def read_pem(path: str, what: str) -> bytes:
    """The file's bytes, or ConfigError naming the setting (``security.tls.cert``)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {path}: {e.strerror}") from None
    if b"-----BEGIN" not in data:
        raise ConfigError(f"{what}: {path} is not a PEM file")
    return data


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(read_pem(tls.key, "security.tls.key"), read_pem(tls.cert, "security.tls.cert"))],
        root_certificates=read_pem(tls.ca, "security.tls.ca"),
        require_client_auth=tls.require_client_cert,
    )


def channel_credentials(
    ca: str | None, cert: str | None = None, key: str | None = None
) -> grpc.ChannelCredentials:
    """Verify the server against ``ca`` (None: the system's roots); present ``cert`` /
    ``key`` when given (mutual TLS)."""
    if (cert is None) != (key is None):
        raise ConfigError("a client certificate needs both cert and key")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(ca, "ca") if ca else None,
        private_key=read_pem(key, "key") if key else None,
        certificate_chain=read_pem(cert, "cert") if cert else None,
    )


def own_token(security: SecurityConfig | None) -> str | None:
    """This process's bearer token: ``$TECTONIC_TOKEN``, else ``security.token_file``."""
    if env := os.environ.get(TOKEN_ENV, "").strip():
        return env
    if security is None or security.token_file is None:
        return None
    try:
        return Path(security.token_file).read_text().strip() or None
    except OSError as e:
        raise ConfigError(
            f"security.token_file: cannot read {security.token_file}: {e.strerror}"
        ) from None


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


# ---- asyncio channels (agents, gateways, the leader) ---------------------------------------
class _AioBearer(  # grpc is untyped here: its bases are Any
    grpc.aio.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.UnaryStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds ``authorization: Bearer`` to every call. Metadata rather than call
    credentials, so that a token also works on a plaintext test link."""

    def __init__(self, token: str) -> None:
        self._md = bearer(token)

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        md = grpc.aio.Metadata(*(d.metadata or ()), *self._md)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready)

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)

    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


def aio_channel(
    target: str,
    security: SecurityConfig | None,
    *,
    options: ChannelOptions = (),
    token: str | None = None,
) -> grpc.aio.Channel:
    """A channel to ``target``: TLS with this process's certificate when
    ``security.tls`` is set, plaintext otherwise; ``token`` (default: :func:`own_token`)
    on every call."""
    token = token if token is not None else own_token(security)
    interceptors = [_AioBearer(token)] if token else None
    tls = security.tls if security is not None else None
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    creds = channel_credentials(tls.ca, tls.cert, tls.key)
    return grpc.aio.secure_channel(target, creds, options=options, interceptors=interceptors)


# ---- blocking channels (failoverctl) ----------------------------------------------------------
class _SyncBearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._md = bearer(token)

    def _details(self, d: Any) -> Any:
        return _SyncDetails(
            d.method,
            d.timeout,
            (*(d.metadata or ()), *self._md),
            d.credentials,
            d.wait_for_ready,
            d.compression,
        )

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return continuation(self._details(client_call_details), request)


class _SyncDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(
        self,
        method: str,
        timeout: float | None,
        metadata: Sequence[tuple[str, str]],
        credentials: grpc.CallCredentials | None,
        wait_for_ready: bool | None,
        compression: grpc.Compression | None,
    ) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready = credentials, wait_for_ready
        self.compression = compression


def sync_channel(
    target: str,
    *,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    token: str | None = None,
    options: ChannelOptions = (),
) -> grpc.Channel:
    """A blocking channel: TLS when ``ca`` (or a client certificate) is given."""
    if ca or cert or key:
        ch = grpc.secure_channel(target, channel_credentials(ca, cert, key), options=options)
    else:
        ch = grpc.insecure_channel(target, options=options)
    return grpc.intercept_channel(ch, _SyncBearer(token)) if token else ch
