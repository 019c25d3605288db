"""A stand-in for grpcurl's commands that the README shows, for machines without grpcurl
(no Debian package ships it): ``[-plaintext] [-d JSON] ADDRESS list`` and
``[-plaintext] [-d JSON] ADDRESS SERVICE/METHOD`` for unary methods.

Like grpcurl it knows nothing of Tectonic's protos: it learns every type from the
server through reflection, and it asks ``grpc.reflection.v1`` (what grpcurl asks
first), so a server that serves only v1alpha fails here as it does for grpcurl.

    python -m tests.grpcurl_reflection -plaintext 127.0.0.1:50051 list
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha import reflection_pb2 as rpb  # same messages as v1 on the wire

_V1 = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"


def _ask(
    channel: grpc.Channel, request: rpb.ServerReflectionRequest
) -> rpb.ServerReflectionResponse:
    call = channel.stream_stream(
        _V1,
        request_serializer=rpb.ServerReflectionRequest.SerializeToString,
        response_deserializer=rpb.ServerReflectionResponse.FromString,
    )
    (answer,) = list(call(iter([request]), timeout=10))
    if answer.HasField("error_response"):
        raise SystemExit(f"reflection error: {answer.error_response.error_message}")
    return answer


def _pool_for(channel: grpc.Channel, symbol: str) -> descriptor_pool.DescriptorPool:
    answer = _ask(channel, rpb.ServerReflectionRequest(file_containing_symbol=symbol))
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(b)
        for b in answer.file_descriptor_response.file_descriptor_proto
    ]
    pool, added = descriptor_pool.DescriptorPool(), set()
    while len(added) < len(files):  # dependencies first, in whatever order they came
        progress = False
        for f in files:
            if f.name not in added and all(d in added for d in f.dependency):
                pool.Add(f)
                added.add(f.name)
                progress = True
        if not progress:
            missing = {d for f in files for d in f.dependency} - added
            raise SystemExit(f"reflection gave no descriptor for {sorted(missing)}")
    return pool


def main(argv: Sequence[str]) -> int:
    args, data, plaintext = list(argv), "{}", False
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag == "-plaintext":
            plaintext = True
        elif flag == "-d":
            data = args.pop(0)
        else:
            raise SystemExit(f"unsupported flag {flag}")
    if not plaintext or len(args) != 2:
        raise SystemExit("usage: -plaintext [-d JSON] ADDRESS (list | SERVICE/METHOD)")
    address, what = args
    with grpc.insecure_channel(address) as channel:
        if what == "list":
            answer = _ask(channel, rpb.ServerReflectionRequest(list_services=""))
            for name in sorted(s.name for s in answer.list_services_response.service):
                print(name)
            return 0
        service, method_name = what.rsplit("/", 1)
        pool = _pool_for(channel, service)
        method = pool.FindServiceByName(service).methods_by_name[method_name]
        request = message_factory.GetMessageClass(method.input_type)()
        json_format.Parse(data, request)
        reply_type = message_factory.GetMessageClass(method.output_type)
        call = channel.unary_unary(
            f"/{service}/{method_name}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=reply_type.FromString,
        )
        try:
            reply = call(request, timeout=10)
        except grpc.RpcError as e:
            print(f"ERROR:\n  Code: {e.code().name}\n  Message: {e.details()}", file=sys.stderr)
            return 1
        print(json.dumps(json_format.MessageToDict(reply), indent=2))
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
