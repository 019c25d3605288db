"""Asking an endpoint picker (``tectonic-epp``) where a request goes, as Envoy does: one
header-only ``ext_proc`` exchange over gRPC. For the benches and tests that speak to a
picker without an Envoy in front of it."""

from __future__ import annotations

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as xpb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as xpb_grpc


async def ask_picker(address: str, session: str, path: str) -> xpb.ProcessingResponse:
    """The picker's answer to the headers of a POST to ``path`` of ``session``: a header
    mutation naming the destination, or an ImmediateResponse. A message that only asks
    for more time (``override_message_timeout``: the picker holds the request while its
    pool wakes from zero) is passed over, as Envoy does."""
    headers = {":path": path, ":method": "POST", "x-session-id": session}
    message = xpb.ProcessingRequest(
        request_headers=xpb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()
                ]
            ),
            end_of_stream=True,
        )
    )
    async with grpc.aio.insecure_channel(address) as channel:
        call = xpb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(message)
        while True:
            answer = await call.read()
            if answer is grpc.aio.EOF:
                raise RuntimeError(f"the picker at {address} ended the stream unanswered")
            assert isinstance(answer, xpb.ProcessingResponse)
            if answer.WhichOneof("response") is not None:
                break
        await call.done_writing()
    return answer
