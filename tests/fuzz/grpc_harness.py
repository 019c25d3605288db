"""The servers under the gRPC fuzzing (tests/fuzz/test_fuzz_grpc.py) and the property
each call is checked against.

``Server`` is one server under fuzzing: its channel, its configured receive limit (read
from the options it was actually built with, by ``server_options_spy``), what counts as
its state and a call that proves it still serves. ``_seed`` writes the state the deeper
paths need; ``_model_of`` names the model each key's readers decode it with.
``check_call`` sends one request and checks it: OK or a clean status (``CLEAN``) with a
human message; nothing changed by a refused call or a read (``READ_ONLY``); what an
accepted call wrote readable by its readers; the server still serving.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from pydantic import BaseModel
from tectonic_api.v1 import agent_pb2 as apb
from tectonic_api.v1 import controlplane_pb2 as pb

from controlplane.core.intents import IntentOutcome
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import CapacityRecord, HitProbe, WorkloadProfile
from controlplane.kernel.codec import encode
from controlplane.kernel.drills import DrillCatalog, DrillRequest, ScenarioInfo
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import (
    AuditEntry,
    ControlFlags,
    HealthReport,
    Intent,
    Readiness,
    RegionRecord,
    RegionState,
)
from controlplane.kernel.prefix.catalog import CatalogEntry, PrefixCatalog
from controlplane.kernel.sessions.resolve import SessionPin
from controlplane.kernel.store.etcd import EtcdStore
from tests.fuzz.grpc_strategies import SCENARIOS, replay_payload
from tests.integration.cp_harness import fast_topology

CONTROL_PLANE = pb.DESCRIPTOR.services_by_name["ControlPlane"]
REGION_AGENT = apb.DESCRIPTOR.services_by_name["RegionAgent"]
SERVICES = (CONTROL_PLANE, REGION_AGENT)
METHODS = [m for s in SERVICES for m in s.methods]

CLEAN = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.ABORTED,
    }
)
# What each method may change. A method in neither set fails test_every_method_is_fuzzed
# (test_fuzz_grpc.py): say whether it writes before it is fuzzed, so the no-state-change
# check knows.
READ_ONLY = frozenset(
    {
        "tectonic.v1.ControlPlane.GetStatus",
        "tectonic.v1.ControlPlane.WatchEvents",
        "tectonic.v1.ControlPlane.GetHistory",
        "tectonic.v1.ControlPlane.GetIntent",
        "tectonic.v1.ControlPlane.GetSession",
        "tectonic.v1.ControlPlane.GetReadiness",
        "tectonic.v1.ControlPlane.TopPrefixes",
        "tectonic.v1.ControlPlane.ListDrills",
        "tectonic.v1.ControlPlane.GetCapacity",
        "tectonic.v1.ControlPlane.GetScale",
        "tectonic.v1.ControlPlane.GetCost",
        "tectonic.v1.RegionAgent.Describe",
    }
)
MUTATING = frozenset(
    {
        "tectonic.v1.ControlPlane.ReportHealth",
        "tectonic.v1.ControlPlane.RequestFailover",
        "tectonic.v1.ControlPlane.RequestRecovery",
        "tectonic.v1.ControlPlane.Pause",
        "tectonic.v1.ControlPlane.Resume",
        "tectonic.v1.ControlPlane.Hold",
        "tectonic.v1.ControlPlane.Release",
        "tectonic.v1.ControlPlane.LiftBudget",
        "tectonic.v1.ControlPlane.UnliftBudget",
        "tectonic.v1.ControlPlane.PinSession",
        "tectonic.v1.ControlPlane.OverrideReadiness",
        "tectonic.v1.ControlPlane.RequestDrill",
        "tectonic.v1.RegionAgent.Prewarm",
    }
)
GRPC_DEFAULT_MAX_RECEIVE = 4 * 1024 * 1024  # grpc's own, when a server sets none
STREAM_WAIT_S = 0.2  # a stream that neither errs nor sends this long counts as open: OK
FAILED_REGION = "central"  # its last drill failed: OverrideReadiness has work to do
FAILING_OVER = "west"  # RequestRecovery has something to recover


# ---- the servers -------------------------------------------------------------------------


def _identity(b: bytes) -> bytes:
    return b


@contextlib.contextmanager
def server_options_spy(into: dict[str, object]) -> Iterator[None]:
    """Record the options of every grpc.aio server built meanwhile: the limit the test
    checks is the one the server was actually given."""
    real = grpc.aio.server

    def spy(*args: Any, **kwargs: Any) -> Any:
        into.update(dict(kwargs.get("options") or ()))
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grpc.aio, "server", spy)
        yield


State = Mapping[str, tuple[bytes, int]]  # key: (value, revision)


@dataclass
class Server:
    """One server under fuzzing: its channel, its receive limit, what counts as its
    state, and a call that proves it still serves."""

    channel: grpc.aio.Channel
    max_receive: int
    state: Callable[[], Awaitable[State]]
    alive: Callable[[], Awaitable[object]]
    # Raises if a value an accepted call wrote cannot be read back by its readers.
    readable: Callable[[str, bytes], None] = lambda key, value: None
    checked: dict[str, int] = field(default_factory=dict)  # calls per outcome, for a glance


def _model_of(keys: Keys, key: str) -> type[BaseModel] | None:
    """The model the readers of ``key`` decode it with (None: not checked here)."""
    rel = key.removeprefix(keys.root)
    by_prefix: dict[str, type[BaseModel]] = {
        "reports/": HealthReport,
        "intents/": Intent,
        "sessions/": SessionPin,
        "audit/": AuditEntry,
        "drills/requests/": DrillRequest,
        "intent-claims/": Intent,
        "intent-outcomes/": IntentOutcome,
    }
    for prefix, model in by_prefix.items():
        if rel.startswith(prefix):
            return model
    if rel == "control":
        return ControlFlags
    if rel.startswith("regions/") and rel.endswith("/readiness"):
        return Readiness
    return None


async def _seed(store: EtcdStore, keys: Keys) -> None:
    """State for the deeper paths: a failed drill verdict (OverrideReadiness), a region
    failing over (RequestRecovery), a drill catalog (RequestDrill), a prefix catalog
    (TopPrefixes) and a capacity probe (GetCapacity, GetStatus)."""
    payload = replay_payload()
    await store.put(keys.readiness(FAILED_REGION), encode(Readiness(passed=False, drill="d-1")))
    await store.put(keys.readiness("east"), encode(Readiness(passed=True, drill="d-2")))
    record = RegionRecord(region=FAILING_OVER, state=RegionState.FAILING_OVER, epoch=1)
    await store.put(keys.region_state(FAILING_OVER), encode(record))
    catalog = DrillCatalog(
        service="fuzz-drills",
        published_at=1.0,
        scenarios=tuple(ScenarioInfo(name=s, title=s, region="east") for s in SCENARIOS),
    )
    await store.put(keys.drill_catalog(), encode(catalog))
    prefixes = PrefixCatalog(
        region="east",
        at=1.0,
        params=fast_topology(("h:1",), "x").prefixes.params,
        min_sessions=3,
        shared_prefixes=2,
        gateways=1,
        entries=(
            CatalogEntry(key="k000", count=9, sessions=3, payload=payload),
            CatalogEntry(key="k001", count=5, sessions=1),
        ),
    )
    await store.put(keys.prefixes("east"), encode(prefixes))
    probe = HitProbe(hit_rate=0.0, baseline_p99_s=0.1, ultimate_rps=20.0, ultimate_bounded=True)
    capacity = CapacityRecord(
        region="east",
        measured_at=1.0,
        engine_version="fuzz",
        replica="http://east-0:8000",
        slo=CapacitySLO(ttft_p99_s=1.0),
        factor_of_safety=2.0,
        probes=(probe,),
        r_base_rps=20.0,
        beta=0.8,
        profile=WorkloadProfile(
            prompt_tokens_p50=100, prompt_tokens_p90=400, output_tokens=16, shared_prefix_share=0.5
        ),
    )
    await store.put(keys.capacity("east"), encode(capacity))


# ---- the property --------------------------------------------------------------------------


def _human(details: str | None) -> bool:
    text = (details or "").strip()
    return len(text) >= 5 and any(c.isalpha() for c in text)


async def invoke(
    channel: grpc.aio.Channel, method: MethodDescriptor, payload: bytes, wait: float = STREAM_WAIT_S
) -> grpc.aio.AioRpcError | None:
    """Send ``payload`` as the request of ``method``; the error it got, None if none (a
    stream that stays quiet for ``wait`` seconds counts as none)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    if not method.server_streaming:
        unary = channel.unary_unary(
            path, request_serializer=_identity, response_deserializer=_identity
        )
        try:
            await unary(payload, timeout=20)
        except grpc.aio.AioRpcError as e:
            return e
        return None
    stream = channel.unary_stream(
        path, request_serializer=_identity, response_deserializer=_identity
    )
    call = stream(payload, timeout=20)
    try:
        async with asyncio.timeout(wait):
            async for _ in call:
                break  # it answers: enough
    except TimeoutError:
        pass  # open and quiet (an event stream with nothing to replay): fine
    except grpc.aio.AioRpcError as e:
        return e
    finally:
        call.cancel()
    return None


def _diff(before: State, after: State) -> str:
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return ", ".join(changed[:10])


async def check_call(server: Server, method: MethodDescriptor, payload: bytes) -> None:
    name = method.full_name
    before = await server.state()
    err = await invoke(server.channel, method, payload)
    after = await server.state()
    if err is not None:
        code, details = err.code(), err.details()
        assert code in CLEAN, f"{name} answered {code.name}: {details}"
        assert _human(details), f"{name} answered {code.name} without a message: {details!r}"
        changed = _diff(before, after)
        assert after == before, f"{name} was refused ({code.name}) but changed: {changed}"
    elif name in READ_ONLY:
        assert after == before, f"{name} is a read but changed: {_diff(before, after)}"
    else:  # accepted: what it wrote must be readable by whoever reads it
        for key, (value, revision) in after.items():
            if before.get(key) != (value, revision):
                server.readable(key, value)
    outcome = "ok" if err is None else err.code().name
    server.checked[outcome] = server.checked.get(outcome, 0) + 1
    await server.alive()
