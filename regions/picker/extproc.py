"""The wire side of the endpoint picker protocol (the Gateway API Inference Extension's,
over Envoy's external processing API): reading what Envoy sends, building what the
picker answers. Pure: messages in, messages out.

- The picked endpoints go in the ``x-gateway-destination-endpoint`` request header
  and, with the same value, in the ``envoy.lb`` dynamic metadata: ``ip:port`` of the
  chosen replica first, then the fallbacks Envoy tries in order before the first byte.
- The data plane may narrow the choice with a subset hint, the filter metadata
  ``envoy.lb.subset_hint`` / ``x-gateway-destination-endpoint-subset`` (a list).
- On the response headers, ``envoy.lb`` / ``x-gateway-destination-endpoint-served``
  says which endpoint really served.
- A refusal is an ImmediateResponse: 503 (with ``Retry-After``) when nothing can
  serve, 429 when the request is shed, 400/413 for a bad request.
- Before holding a request for a pool at zero (scale to zero), the picker asks Envoy to
  wait for its answer (``override_message_timeout``): Envoy's ``message_timeout`` is
  far shorter than a wake.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2, struct_pb2

DESTINATION = "x-gateway-destination-endpoint"
SUBSET = "x-gateway-destination-endpoint-subset"
SERVED = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
# Set on a request sent to another region's entry point: that region's picker serves it
# there (one hop at most, whatever its own cache says of the session).
VIA_HEADER = "x-tectonic-via"
REGION_HEADER = "x-tectonic-region"  # which region the picker sent the request to
# Envoy forwards a streamed body to the picker in pieces of at most this size; the
# picker's own body chunks stay below it too.
BODY_CHUNK = 62_000

BodyMode = int  # ProcessingMode.BodySendMode: NONE 0, STREAMED 1, BUFFERED 2, ...
BODY_NONE, BODY_BUFFERED, BODY_FULL_DUPLEX = 0, 2, 4


def headers_of(message: pb.HttpHeaders) -> dict[str, str]:
    """The request's or response's headers by lowercase name (Envoy sends them lowercase,
    pseudo-headers included: ``:path``, ``:method``, ``:status``). Envoy 1.40 puts values
    in ``raw_value``; older ones in ``value``."""
    out: dict[str, str] = {}
    for h in message.headers.headers:
        out[h.key] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return out


def _namespace(metadata: base_pb2.Metadata, name: str) -> Mapping[str, struct_pb2.Value]:
    ns = metadata.filter_metadata.get(name)
    return ns.fields if ns is not None else {}


def subset_of(metadata: base_pb2.Metadata) -> frozenset[str] | None:
    """The data plane's subset hint: the endpoints the picker must choose among; None
    when there is no hint (any endpoint of the pool). An empty hint is an empty set:
    nothing is eligible."""
    value = _namespace(metadata, SUBSET_NAMESPACE).get(SUBSET)
    if value is None:
        return None
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return frozenset(v.string_value for v in value.list_value.values if v.string_value)
    if kind == "string_value":  # tolerate "a,b": the header's own format
        return frozenset(p.strip() for p in value.string_value.split(",") if p.strip())
    return frozenset()


def served_of(metadata: base_pb2.Metadata) -> str:
    """The endpoint that served, from the response's metadata ('' when not said)."""
    value = _namespace(metadata, LB_NAMESPACE).get(SERVED)
    return value.string_value if value is not None else ""


def _set(name: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _destination_metadata(value: str) -> struct_pb2.Struct:
    meta = struct_pb2.Struct()
    meta.fields[LB_NAMESPACE].struct_value.fields[DESTINATION].string_value = value
    return meta


def routed(
    endpoints: Sequence[str],
    headers: Iterable[tuple[str, str]] = (),
    *,
    on_body: bool,
    body: bytes | None = None,
) -> pb.ProcessingResponse:
    """Send the request to ``endpoints`` (in order), setting ``headers`` too: the answer
    to the request headers (``on_body`` False) or to the buffered body (True), whose
    bytes ``body`` replaces when not None."""
    value = ",".join(endpoints)
    common = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(
            set_headers=[_set(DESTINATION, value), *(_set(k, v) for k, v in headers)]
        ),
        clear_route_cache=True,  # the route depends on the destination header
    )
    if body is not None:
        common.body_mutation.body = body
    meta = _destination_metadata(value)
    if on_body:
        return pb.ProcessingResponse(
            request_body=pb.BodyResponse(response=common), dynamic_metadata=meta
        )
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=common), dynamic_metadata=meta
    )


def body_chunks(body: bytes) -> Iterator[pb.ProcessingResponse]:
    """The request body handed back in full-duplex streamed mode (Envoy forwards what
    the picker streams back, not what it received): chunks under ``BODY_CHUNK``, the
    last one ending the stream."""
    if not body:
        yield _chunk(b"", True)
        return
    for start in range(0, len(body), BODY_CHUNK):
        piece = body[start : start + BODY_CHUNK]
        yield _chunk(piece, start + BODY_CHUNK >= len(body))


def _chunk(piece: bytes, last: bool) -> pb.ProcessingResponse:
    common = pb.CommonResponse()
    common.body_mutation.streamed_response.body = piece
    common.body_mutation.streamed_response.end_of_stream = last
    return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))


def immediate(
    status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()
) -> pb.ProcessingResponse:
    """Answer the client at once with ``status`` and a JSON ``body``; nothing is sent
    upstream."""
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=pb.HeaderMutation(
                set_headers=[_set("content-type", "application/json"), *_sets(headers)]
            ),
            body=body,
        )
    )


def _sets(headers: Iterable[tuple[str, str]]) -> list[base_pb2.HeaderValueOption]:
    return [_set(k, v) for k, v in headers]


# Answers that change nothing, one per phase (immutable once built: shared).
CONTINUE_REQUEST_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
CONTINUE_REQUEST_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse())
CONTINUE_RESPONSE_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
CONTINUE_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse())
CONTINUE_REQUEST_TRAILERS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
CONTINUE_RESPONSE_TRAILERS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def extend(seconds: float) -> pb.ProcessingResponse:
    """Ask Envoy to wait ``seconds`` (whole milliseconds, at least 1) for the answer to
    the message it sent last: ext_proc's ``override_message_timeout``, which restarts
    Envoy's message timer with it and answers nothing (the answer still follows). Envoy
    takes it once per message, and only within its filter's ``max_message_timeout``
    (ignored when that is unset or shorter: ``override_message_timeout_ignored``)."""
    timeout = duration_pb2.Duration()
    timeout.FromMilliseconds(max(1, math.ceil(seconds * 1000)))
    return pb.ProcessingResponse(override_message_timeout=timeout)


def region_header(region: str) -> pb.ProcessingResponse:
    """The answer to the response headers: tell the client which region served."""
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                header_mutation=pb.HeaderMutation(set_headers=[_set(REGION_HEADER, region)])
            )
        )
    )


def endpoint_of(replica: str) -> str:
    """A replica's base URL (``http://10.0.0.7:8000``) as the protocol's ``ip:port``."""
    return replica.split("://", 1)[-1].rstrip("/")
