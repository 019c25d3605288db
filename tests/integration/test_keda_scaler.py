"""KEDA's external scaler on a real gRPC server and a real etcd, called through the stubs
generated from KEDA's own proto (proto/externalscaler): the metric spec, the metric
following ``scale/<unit>``, IsActive and its stream, the units named by ``unit`` or by
``region`` and ``model``, and every refusal with its status code. Last, a control-plane
replica serves it beside its own service (and lists it for reflection)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from externalscaler import externalscaler_pb2 as pb
from externalscaler import externalscaler_pb2_grpc as pb_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from controlplane.api.keda_scaler import KedaScaler, add_keda_scaler
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.store.etcd import EtcdStore
from tests.integration.cp_harness import FAST_TIMING, running_replica

pytestmark = [pytest.mark.etcd]
MODELS = {"chat": "llama-chat", "code": "qwen-coder"}
STREAM_WAIT_S = 5.0  # a generous ceiling for one streamed answer, never a pass criterion


def topology_for(endpoints: tuple[str, ...], cluster: str) -> Topology:
    """east without pools (unit ``east``), west with two pools (``west.chat``, ``west.code``)."""
    return parse_topology(
        {
            "cluster": cluster,
            "etcd": {"endpoints": list(endpoints)},
            "regions": [
                {"name": "east", "zone": "us", "agent": "127.0.0.1:9", "capacity_rps": 100},
                {
                    "name": "west",
                    "zone": "us",
                    "pools": [
                        {"name": p, "models": [m], "agent": "127.0.0.1:9", "capacity_rps": 50}
                        for p, m in MODELS.items()
                    ],
                },
            ],
            "timing": FAST_TIMING,
        }
    )


@pytest.fixture
def topology(etcd: object, cluster_name: str) -> Topology:
    return topology_for(etcd.endpoints, cluster_name)  # type: ignore[attr-defined]


@pytest.fixture
async def stub(
    etcd_store: EtcdStore, keys: Keys, topology: Topology
) -> AsyncIterator[pb_grpc.ExternalScalerStub]:
    server = grpc.aio.server()
    add_keda_scaler(server, KedaScaler(etcd_store, keys, topology, poll_s=0.05))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield pb_grpc.ExternalScalerStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


async def size(store: EtcdStore, keys: Keys, unit: str, active: int) -> None:
    """Write ``scale/<unit>`` as the leader's scaler would."""
    now = time.time()
    record = ScaleRecord(unit=unit, active=active, warm=1, decided_at=now, changed_at=now)
    await store.put(keys.scale(unit), encode(record))


def ref(**metadata: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=metadata)


async def metric(stub: pb_grpc.ExternalScalerStub, **metadata: str) -> pb.MetricValue:
    # KEDA sends the name GetMetricSpec gave (less its "s<trigger>-" prefix); it is not needed
    name = f"tectonic-desired-{metadata['unit']}" if "unit" in metadata else ""
    resp = await stub.GetMetrics(
        pb.GetMetricsRequest(scaledObjectRef=ref(**metadata), metricName=name)
    )
    assert len(resp.metricValues) == 1
    value: pb.MetricValue = resp.metricValues[0]
    assert value.metricValueFloat == value.metricValue  # the float field KEDA prefers
    return value


async def refusal(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value


async def test_metric_spec_and_metrics_follow_the_record(
    stub: pb_grpc.ExternalScalerStub, etcd_store: EtcdStore, keys: Keys
) -> None:
    spec = await stub.GetMetricSpec(ref(unit="east"))
    assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [
        ("tectonic-desired-east", 1, 1.0)
    ]
    await size(etcd_store, keys, "east", 3)
    value = await metric(stub, unit="east")
    assert (value.metricName, value.metricValue) == ("tectonic-desired-east", 3)
    assert (await stub.IsActive(ref(unit="east"))).result is True
    await size(etcd_store, keys, "east", 5)
    assert (await metric(stub, unit="east")).metricValue == 5
    await size(etcd_store, keys, "east", 0)
    assert (await metric(stub, unit="east")).metricValue == 0
    assert (await stub.IsActive(ref(unit="east"))).result is False


async def test_a_pool_by_unit_or_by_region_and_model(
    stub: pb_grpc.ExternalScalerStub, etcd_store: EtcdStore, keys: Keys
) -> None:
    await size(etcd_store, keys, "west.code", 2)
    await size(etcd_store, keys, "west.chat", 7)
    assert (await metric(stub, unit="west.code")).metricValue == 2
    by_model = await metric(stub, region="west", model="qwen-coder")
    assert (by_model.metricName, by_model.metricValue) == ("tectonic-desired-west.code", 2)
    spec = await stub.GetMetricSpec(ref(region="west", model="llama-chat"))
    assert spec.metricSpecs[0].metricName == "tectonic-desired-west.chat"
    await size(etcd_store, keys, "east", 4)
    assert (await metric(stub, region="east")).metricName == "tectonic-desired-east"
    assert (await metric(stub, region="east")).metricValue == 4


async def test_stream_is_active_sends_the_answer_then_each_change(
    stub: pb_grpc.ExternalScalerStub, etcd_store: EtcdStore, keys: Keys
) -> None:
    await size(etcd_store, keys, "west.chat", 1)
    stream = stub.StreamIsActive(ref(unit="west.chat"))
    try:
        first = await asyncio.wait_for(stream.read(), STREAM_WAIT_S)
        assert first.result is True
        await size(etcd_store, keys, "west.chat", 2)  # still active: nothing is sent
        await size(etcd_store, keys, "west.chat", 0)
        assert (await asyncio.wait_for(stream.read(), STREAM_WAIT_S)).result is False
        await size(etcd_store, keys, "west.chat", 3)
        assert (await asyncio.wait_for(stream.read(), STREAM_WAIT_S)).result is True
    finally:
        stream.cancel()


async def test_refusals_say_what_to_do_and_the_server_keeps_serving(
    stub: pb_grpc.ExternalScalerStub, etcd_store: EtcdStore, keys: Keys
) -> None:
    unknown = await refusal(stub.GetMetricSpec(ref(unit="mars")))
    assert unknown.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'mars'" in (unknown.details() or "")
    assert "east, west.chat, west.code" in (unknown.details() or "")
    for call in (stub.IsActive(ref()), stub.GetMetrics(pb.GetMetricsRequest())):
        missing = await refusal(call)
        assert missing.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "metadata 'unit'" in (missing.details() or "")
    several = await refusal(stub.GetMetricSpec(ref(region="west")))
    assert several.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "west.chat, west.code" in (several.details() or "")
    no_model = await refusal(stub.GetMetricSpec(ref(region="west", model="gpt-9")))
    assert no_model.code() == grpc.StatusCode.INVALID_ARGUMENT

    # Not sized yet: the spec is fixed, the value is not known.
    assert (await stub.GetMetricSpec(ref(unit="west.code"))).metricSpecs
    for call in (
        stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(unit="west.code"))),
        stub.IsActive(ref(unit="west.code")),
    ):
        unsized = await refusal(call)
        assert unsized.code() == grpc.StatusCode.UNAVAILABLE
        details = unsized.details() or ""
        assert "has not sized west.code yet" in details and "scaling:" in details
    stream = stub.StreamIsActive(ref(unit="west.code"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(stream.read(), STREAM_WAIT_S)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    # A record that does not parse, and the stream KEDA may try: refused, not crashed.
    await etcd_store.put(keys.scale("west.code"), b"{not json")
    corrupt = await refusal(stub.IsActive(ref(unit="west.code")))
    assert corrupt.code() == grpc.StatusCode.DATA_LOSS
    push = stub.StreamMetricSpec(ref(unit="east"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(push.read(), STREAM_WAIT_S)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED  # KEDA then polls GetMetricSpec
    await size(etcd_store, keys, "east", 1)
    assert (await stub.IsActive(ref(unit="east"))).result is True


async def test_a_replica_serves_it_beside_its_own_service(etcd: object) -> None:
    topology = topology_for(etcd.endpoints, f"k{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]
    async with running_replica(topology) as run:
        keda = pb_grpc.ExternalScalerStub(run.channel)
        spec = await keda.GetMetricSpec(ref(unit="west.chat"))
        assert spec.metricSpecs[0].metricName == "tectonic-desired-west.chat"
        refl = reflection_pb2_grpc.ServerReflectionStub(run.channel)
        names: list[str] = []
        async for r in refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        ):
            names = [s.name for s in r.list_services_response.service]
        assert "externalscaler.ExternalScaler" in names and "tectonic.v1.ControlPlane" in names
