"""gRPC server reflection under both protocol names.

Current grpcurl and most other clients ask ``grpc.reflection.v1.ServerReflection``
first; older ones ask ``grpc.reflection.v1alpha``. grpcio-reflection ships only the
v1alpha service. The v1 protocol has the same messages with the same field numbers
under another package, so the same servicer answers both byte for byte: it is
registered a second time under the v1 name, with the v1alpha message classes doing
the (de)serialising. The v1 file descriptor is derived from the library's own v1alpha
one (renamed) and added to the default pool, so that a client can also describe the
reflection service itself under its v1 name.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc as v1alpha_grpc

V1ALPHA_SERVICE = reflection.SERVICE_NAME
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE = f"{V1_PACKAGE}.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _register_v1_descriptor() -> None:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return  # already there (another library, or an earlier server in this process)
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(fdp)
    old = f".{fdp.package}."
    fdp.name, fdp.package = _V1_FILE, V1_PACKAGE
    for svc in fdp.service:
        for m in svc.method:
            m.input_type = m.input_type.replace(old, f".{V1_PACKAGE}.")
            m.output_type = m.output_type.replace(old, f".{V1_PACKAGE}.")
    for msg in fdp.message_type:
        for f in msg.field:
            if f.type_name.startswith(old):
                f.type_name = f".{V1_PACKAGE}." + f.type_name[len(old) :]
    pool.Add(fdp)


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection on ``server`` under v1 and v1alpha, listing ``service_names``
    and both reflection services."""
    _register_v1_descriptor()
    names = (*service_names, V1_SERVICE, V1ALPHA_SERVICE)
    servicer = reflection.aio.ReflectionServicer(names)
    v1alpha_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=v1alpha_pb2.ServerReflectionRequest.FromString,
        response_serializer=v1alpha_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": handler}),)
    )
