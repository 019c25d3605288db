"""What the data plane counts as a failed request, and how a forward failed: types, not
strings, so a kind no metric knows cannot be counted (``tectonic_gateway_errors_total``
starts every kind at zero) and the forwarding's retry rules match members. Pure."""

from __future__ import annotations

from enum import StrEnum


class UpstreamFailure(StrEnum):
    """How one attempt on one replica failed (``regions/gateway/http1.py``)."""

    CONNECT = "connect"  # never connected: safe to try another replica
    DISCONNECT = "disconnect"  # the connection closed under the request
    TIMEOUT = "timeout"  # no data for the silence limit
    PROTOCOL = "protocol"  # a response HTTP/1.1 does not allow
    REQUEST = "request"  # the request itself cannot be sent (a header would split it)


class ErrorKind(StrEnum):
    """A failed request, as ``errors_total{kind}`` counts it."""

    CONNECT = "connect"
    DISCONNECT = "disconnect"
    TIMEOUT = "timeout"
    PROTOCOL = "protocol"
    REQUEST = "request"
    UPSTREAM_5XX = "upstream_5xx"  # the replica answered 5xx
    STREAM_BROKEN = "stream_broken"  # a stream cut after its first byte
    CLIENT_GONE = "client_gone"  # the client left mid-response
    NO_REPLICA = "no_replica"  # no replica of the region took it
    NO_REGION = "no_region"  # no region may serve the session
    BAD_REQUEST = "bad_request"  # refused before routing

    @classmethod
    def of(cls, failure: UpstreamFailure) -> ErrorKind:
        return cls(failure.value)


UPSTREAM_KINDS: tuple[ErrorKind, ...] = tuple(ErrorKind.of(f) for f in UpstreamFailure)
# Counted per region; and for requests that never had one (region label "none").
REGION_KINDS: tuple[ErrorKind, ...] = (
    *UPSTREAM_KINDS,
    ErrorKind.UPSTREAM_5XX,
    ErrorKind.STREAM_BROKEN,
    ErrorKind.CLIENT_GONE,
    ErrorKind.NO_REPLICA,
)
NO_REGION_KINDS: tuple[ErrorKind, ...] = (
    ErrorKind.NO_REGION,
    ErrorKind.NO_REPLICA,
    ErrorKind.BAD_REQUEST,
)
