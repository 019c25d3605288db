"""KEDA's external scaler (``externalscaler.ExternalScaler``) over the scaler's records.

Advisory mode (docs/keda.md): a KEDA ``external`` trigger names a failover unit in its
metadata (``unit: east.chat``, or ``region`` plus ``model``) and KEDA's HPA sizes that
pool's workload to the leader's desired ACTIVE replicas (``scale/<unit>``,
``ScaleRecord.active``): the metric's target is 1, so replicas = the metric's value.

Every call reads the unit's one key from etcd (a linearizable get of a small value)
instead of keeping a watched copy: KEDA polls each ScaledObject every few seconds, so the
load is small, any replica answers with what etcd holds now, and there is no background
task for the replica to supervise. ``StreamIsActive`` polls the same key every
``poll_s``.

Bad metadata gets INVALID_ARGUMENT saying what to set; a unit the leader has not sized
yet gets UNAVAILABLE (KEDA retries); etcd trouble gets UNAVAILABLE too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping

import grpc
from externalscaler import externalscaler_pb2 as pb
from externalscaler import externalscaler_pb2_grpc as pb_grpc

from controlplane.api.rpc_checks import abort, bad_request
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.store.port import Store, StoreError

log = logging.getLogger("tectonic.keda")

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["ExternalScaler"].full_name
# HPA metric names must be path segments (no '/' or '%'); a unit's dot is fine, and KEDA
# adds its own "s<trigger>-" prefix.
METRIC_PREFIX = "tectonic-desired-"
POLL_S = 1.0
_SHOWN = 64  # characters of a caller's value quoted back in an error


def metric_name(unit: str) -> str:
    return METRIC_PREFIX + unit


class KedaScaler(pb_grpc.ExternalScalerServicer):
    def __init__(
        self, store: Store, keys: Keys, topology: Topology, *, poll_s: float = POLL_S
    ) -> None:
        self.store, self.keys, self.topology, self.poll_s = store, keys, topology, poll_s

    # ---- the RPCs ----------------------------------------------------------------------
    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        # Needs no record: the spec is fixed per unit, and KEDA builds its HPA from this
        # answer once, before the leader may have sized the pool.
        unit = await self._unit(request, context)
        spec = pb.MetricSpec(metricName=metric_name(unit), targetSize=1, targetSizeFloat=1.0)
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        unit = await self._unit(request.scaledObjectRef, context)
        active = (await self._record(unit, context)).active
        value = pb.MetricValue(
            metricName=metric_name(unit), metricValue=active, metricValueFloat=float(active)
        )
        return pb.GetMetricsResponse(metricValues=[value])

    async def IsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        unit = await self._unit(request, context)
        return pb.IsActiveResponse(result=(await self._record(unit, context)).active > 0)

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """The current answer, then each change, until the client goes away (gRPC
        cancels this generator). After the first answer a failed read keeps the stream
        and the last answer: KEDA reopens a broken stream only after a backoff of up to
        a minute, longer than etcd's usual blips."""
        unit = await self._unit(request, context)
        active = (await self._record(unit, context)).active > 0
        yield pb.IsActiveResponse(result=active)
        failing = False
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                record = await self._read(unit)
            except (StoreError, CorruptValue) as e:
                if not failing:
                    log.warning("StreamIsActive %s: %s; keeping the last answer", unit, e)
                failing = True
                continue
            failing = False
            if record is not None and (record.active > 0) != active:
                active = record.active > 0
                yield pb.IsActiveResponse(result=active)

    async def StreamMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        # The spec never changes (target 1): KEDA falls back to GetMetricSpec on this code.
        await abort(
            context,
            grpc.StatusCode.UNIMPLEMENTED,
            "the metric spec is fixed; use GetMetricSpec",
        )
        yield pb.GetMetricSpecResponse()  # pragma: no cover - makes this a generator

    # ---- helpers -----------------------------------------------------------------------
    async def _unit(self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext) -> str:
        """The failover unit the trigger's metadata names, or INVALID_ARGUMENT."""
        unit, why = resolve_unit(self.topology, ref.scalerMetadata)
        if unit is None:
            await bad_request(context, why)
        return unit

    async def _record(self, unit: str, context: grpc.aio.ServicerContext) -> ScaleRecord:
        """The unit's record, or an abort: UNAVAILABLE (none yet, or etcd unreachable),
        DATA_LOSS (it does not parse)."""
        try:
            record = await self._read(unit)
        except CorruptValue as e:
            await abort(context, grpc.StatusCode.DATA_LOSS, f"{e}; the leader rewrites it")
        except StoreError as e:
            await abort(context, grpc.StatusCode.UNAVAILABLE, f"etcd: {e}; retry shortly")
        if record is None:
            hint = (
                "is the topology's scaling: section set?"
                if self.topology.scaling is None
                else "is a leader elected and are its agents reporting?"
            )
            await abort(
                context,
                grpc.StatusCode.UNAVAILABLE,
                f"the leader has not sized {unit} yet (no {self.keys.scale(unit)}): {hint}",
            )
        return record

    async def _read(self, unit: str) -> ScaleRecord | None:
        key = self.keys.scale(unit)
        kv = await self.store.get(key)
        return None if kv is None else decode(ScaleRecord, kv.value, key)


def resolve_unit(topology: Topology, metadata: Mapping[str, str]) -> tuple[str | None, str]:
    """The unit named by ``unit``, or by ``region`` (its only unit, or the one answering
    ``model``); else None and what to set."""
    units = ", ".join(topology.names)
    unit = metadata.get("unit", "").strip()
    if unit:
        if unit in topology.names:
            return unit, ""
        return None, f"unknown unit {unit[:_SHOWN]!r} in the trigger's metadata; known: {units}"
    region = metadata.get("region", "").strip()
    if not region:
        return None, f"set the trigger's metadata 'unit' to a failover unit: one of {units}"
    if region not in topology.sites:
        sites = ", ".join(topology.sites)
        return None, f"unknown region {region[:_SHOWN]!r}; known regions: {sites}"
    model = metadata.get("model", "").strip()
    if model:
        found = topology.unit_for(region, model)
        if found is None:
            return None, f"no pool of region {region} serves model {model[:_SHOWN]!r}"
        return found, ""
    own = topology.units_of(region)
    if len(own) == 1:
        return own[0], ""
    return None, f"region {region} has several pools ({', '.join(own)}): set 'unit' or 'model'"


def add_keda_scaler(server: grpc.aio.Server, scaler: KedaScaler) -> str:
    """Serve ``scaler`` on ``server``; returns its service's name (for reflection)."""
    pb_grpc.add_ExternalScalerServicer_to_server(scaler, server)  # type: ignore[no-untyped-call]
    return SERVICE_NAME
