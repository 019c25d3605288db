"""Property-based fuzzing of every gRPC method (issue 8, item 5): ``tectonic.v1.ControlPlane``
on a real in-process control-plane replica (real etcd) and ``tectonic.v1.RegionAgent`` on
an in-process agent in front of a simulator process.

Methods are enumerated from the proto descriptors, so a new method is fuzzed without a
change here; request messages are generated from the descriptors too (huge, unicode and
control-character strings, negative / NaN / infinite numbers, unknown enum values, long
repeated and map fields), mixed with values that pass the first checks (region names, a
scenario the drill catalog lists, a valid replay payload) so that the fuzzing reaches
the deeper ones. Raw bytes, valid protobuf wire format or not, go through a generic
``unary_unary`` / ``unary_stream`` call.

Properties, for every call:

* the answer is OK or a clean status (``CLEAN``), never UNKNOWN / INTERNAL (an exception
  the service did not handle), with a human message;
* the server keeps serving (GetStatus / Describe answer afterwards);
* nothing changes when nothing should: every key under the deployment's prefix is
  compared before and after each refused call and each call of a read-only method. The
  replica is a follower (a foreign "leader" holds the lease, the agent probe is off), so
  its reconcile loop writes nothing and every change comes from the call under test;
  ``reports/`` is compared too, since only ReportHealth writes it here;
* what an accepted call wrote, its readers can read: each changed key decodes with the
  model the loop and the gateways read it with (a NaN health signal was once accepted,
  stored as ``null``, and made the leader drop the whole report as corrupt);
* a request over the server's configured ``grpc.max_receive_message_length`` (read from
  the options the server was actually built with) is refused with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from tectonic_api.v1 import agent_pb2 as apb
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulator
from controlplane.core.intents import IntentOutcome
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import CapacityRecord, HitProbe, WorkloadProfile
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import Topology
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
from controlplane.kernel.prefix.identity import PromptKind
from controlplane.kernel.prefix.prewarm import ReplayPayload
from controlplane.kernel.sessions.resolve import SessionPin
from controlplane.kernel.store.etcd import EtcdStore
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from tests.integration.cp_harness import REGIONS, fast_topology, running_replica

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

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
# What each method may change. A method in neither set fails test_every_method_is_fuzzed:
# say whether it writes before it is fuzzed, so the no-state-change check knows.
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
        "tectonic.v1.ControlPlane.PinSession",
        "tectonic.v1.ControlPlane.OverrideReadiness",
        "tectonic.v1.ControlPlane.RequestDrill",
        "tectonic.v1.RegionAgent.Prewarm",
    }
)
GRPC_DEFAULT_MAX_RECEIVE = 4 * 1024 * 1024  # grpc's own, when a server sets none
STREAM_WAIT_S = 0.2  # a stream that neither errs nor sends this long counts as open: OK
SCENARIOS = ("region-blackout", "latency-injection")
FAILED_REGION = "central"  # its last drill failed: OverrideReadiness has work to do
FAILING_OVER = "west"  # RequestRecovery has something to recover


# ---- values that reach the deeper checks, and strategies from the descriptors --------------


def replay_payload(i: int = 0, model: str = "tiny") -> ReplayPayload:
    return ReplayPayload(
        key=f"k{i:03d}",
        kind=PromptKind.TEXT,
        model=model,
        prompt=f"tenant {i} " + "rule " * 40,
        blocks=2,
        block_size=16,
        tokens=32,
        tokens_exact=False,
    )


WORDS = st.sampled_from(
    [
        *REGIONS,
        *SCENARIOS,
        "",
        " ",
        "\t",
        "mars",
        "EAST",
        " east",
        "east\n",
        "east/..",
        "agent:east",
        "gateway:g1",
        "probe:controlplane",
        "fuzz",
        "alice",
        "operator",
        "s-1",
        "sess-42",
        "a/b",
        "../x",
        "%2F",
        "x" * 64,
        "x" * 65,
        "x" * 128,
        "x" * 129,
        "x" * 256,
        "x" * 257,
        "x" * 1024,
        "x" * 1025,
        "\x00",
        "\x7f",
        "\x1b[2J",
        "\u202e",
        "🦀",
        "Zürich",
        "'; DROP",
        "{region}",
        "nan",
        "-1",
    ]
)
TEXT = st.one_of(
    WORDS,
    WORDS,  # twice as likely: most of the fuzzing should get past the first check
    st.text(max_size=30),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=300),
    st.integers(0, 100_000).map(lambda n: "y" * n),  # around the request size limit
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=10,
)
PAYLOAD_FIELDS = sorted(replay_payload().model_dump(mode="json"))


@st.composite
def payload_bytes(draw: st.DrawFn) -> bytes:
    """A replay payload for Prewarm: valid, mutated, JSON of anything, or no JSON at all."""
    kind = draw(st.sampled_from(["valid", "mutated", "json", "binary"]))
    if kind == "binary":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(JSONISH)).encode()
    data = replay_payload(draw(st.integers(0, 999)), draw(st.sampled_from(["tiny", "nope"])))
    doc = data.model_dump(mode="json")
    if kind == "mutated":
        key = draw(st.sampled_from(PAYLOAD_FIELDS))
        if draw(st.booleans()):
            doc.pop(key)
        else:
            doc[key] = draw(JSONISH)
    return json.dumps(doc).encode()


UINT32 = st.one_of(
    st.sampled_from([0, 1, 2, 16, 20, 50, 256, 257, 500, 501, 1000, 1001, 2**31, 2**32 - 1]),
    st.integers(0, 2**32 - 1),
)
DOUBLE = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 30.0, 600.0, 600.0001, -1.0, 1e308, math.nan, math.inf]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_T = FieldDescriptor


REGION_NAMES = st.sampled_from(REGIONS)
# Values that pass a field's first check, by field name: three times as likely as TEXT,
# so that most calls reach the checks after it.
HINTS: dict[str, st.SearchStrategy[str]] = {
    "region": REGION_NAMES,
    "source": REGION_NAMES,
    "home": REGION_NAMES,
    "to": REGION_NAMES,
    "reason": st.sampled_from(["drill", "maintenance window", "fuzz"]),
    "actor": st.sampled_from(["alice", "fuzz", ""]),
    "session_id": st.text(
        st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters="/"),
        min_size=1,
        max_size=40,
    ),
    "observer": st.sampled_from(["agent:east", "gateway:g1", "probe:controlplane", "x@y"]),
    "scenario": st.sampled_from(SCENARIOS),
    "failover_id": st.text("abcdef0123456789-", min_size=1, max_size=40),
    "intent_id": st.text("abcdef0123456789", min_size=12, max_size=12),
}


def _scalar(f: FieldDescriptor, tame: bool) -> st.SearchStrategy[Any]:
    """Values of one field. ``tame``: ones that pass its first check, where this file
    knows it (``HINTS``); NaN and infinities stay in, they are numbers all the same."""
    if f.type == _T.TYPE_STRING:
        hint = HINTS.get(f.name)
        if tame:
            return hint if hint is not None else st.text(max_size=20)
        return TEXT if hint is None else st.one_of(hint, TEXT)
    if f.type == _T.TYPE_BYTES:
        return payload_bytes() if f.name == "payloads" else st.binary(max_size=300)
    if f.type == _T.TYPE_BOOL:
        return st.booleans()
    if f.type in (_T.TYPE_DOUBLE, _T.TYPE_FLOAT):
        return DOUBLE
    if f.type in (_T.TYPE_UINT32, _T.TYPE_FIXED32):
        return st.integers(0, 30) if tame else UINT32
    if f.type in (_T.TYPE_UINT64, _T.TYPE_FIXED64):
        return st.integers(0, 30) if tame else st.integers(0, 2**64 - 1) | UINT32
    if f.type in (_T.TYPE_INT32, _T.TYPE_SINT32, _T.TYPE_SFIXED32):
        return st.integers(-(2**31), 2**31 - 1)
    if f.type in (_T.TYPE_INT64, _T.TYPE_SINT64, _T.TYPE_SFIXED64):
        return st.integers(-(2**63), 2**63 - 1)
    if f.type == _T.TYPE_ENUM:  # proto3 enums are open: unknown numbers are kept
        # 0 (UNSPECIFIED) comes as "unset", and from the integers.
        known = st.sampled_from([v.number for v in f.enum_type.values if v.number])
        return known if tame else known | st.integers(-(2**31), 2**31 - 1)
    if f.type == _T.TYPE_MESSAGE:
        return message_strategy(f.message_type)
    raise NotImplementedError(f"no strategy for {f.full_name} (type {f.type})")


def _field(f: FieldDescriptor, tame: bool) -> st.SearchStrategy[Any]:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        small = st.dictionaries(_scalar(key, tame), _scalar(value, tame), max_size=6)
        if tame:
            return small
        big = st.integers(60, 300).map(lambda n: {f"k{i}": 0 for i in range(n)})
        return small | big  # over any per-request bound
    if f.is_repeated:
        item = _scalar(f, tame)
        if tame:
            return st.lists(item, max_size=4)
        many = st.integers(100, 3000).map(
            lambda n: ["east"] * n if f.type == _T.TYPE_STRING else [b"{}"] * n
        )
        return st.lists(item, max_size=6) | st.lists(item, min_size=15, max_size=40) | many
    return _scalar(f, tame)


def message_strategy(desc: Descriptor) -> st.SearchStrategy[Message]:
    """Messages of type ``desc``: tame ones (each field likely to pass its first check,
    so the calls reach the later ones) or wild ones (any value the field's type allows);
    each field set or left out. Raises NotImplementedError for a field type it cannot
    generate."""
    cls = GetMessageClass(desc)

    def build(tame: bool) -> st.SearchStrategy[Message]:
        fields = {f.name: _field(f, tame) for f in desc.fields}
        if not tame:  # each field set three times in four
            fields = {name: st.one_of(v, v, v, st.none()) for name, v in fields.items()}
        return st.fixed_dictionaries(fields).map(
            lambda kw: cls(**{k: v for k, v in kw.items() if v is not None})
        )

    return st.one_of(build(tame=True), build(tame=False))


def _wire_field(number: int, wire: int, body: bytes) -> bytes:
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)

    tag = varint(number << 3 | wire)
    if wire == 2:
        return tag + varint(len(body)) + body
    return tag + body


WIRE = st.lists(
    st.tuples(st.integers(1, 20), st.sampled_from([0, 1, 2, 5]), st.binary(max_size=40)).map(
        lambda t: _wire_field(
            t[0], t[1], {0: b"\x01", 1: b"\x00" * 8, 2: t[2], 5: b"\x00" * 4}[t[1]]
        )
    ),
    max_size=8,
).map(b"".join)  # valid wire format: known field numbers with any wire type, unknown ones
RAW = st.one_of(st.binary(max_size=400), WIRE)


def padding(size: int) -> bytes:
    """A ``size``-byte message of any type: one unknown length-delimited field."""
    overhead = len(_wire_field(99, 2, b"x" * size)) - size
    msg = _wire_field(99, 2, b"x" * (size - overhead))
    return msg if len(msg) == size else _wire_field(99, 2, b"x" * (size - overhead + 1))


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


@pytest.fixture(scope="module")
async def cp(etcd: EtcdServer) -> AsyncIterator[Server]:
    cluster = f"fuzz-{secrets.token_hex(4)}"
    topology: Topology = fast_topology(etcd.endpoints, cluster)
    keys = Keys(cluster)
    store = EtcdStore(topology.etcd)
    await store.connect()
    # A foreign leader: this replica follows, so its loop never writes.
    lease = await store.grant_lease(3600)
    assert await store.create(keys.leader(), b"fuzz-foreign-leader", lease=lease)
    await _seed(store, keys)
    options: dict[str, object] = {}
    stack = contextlib.AsyncExitStack()
    with server_options_spy(options):
        run = await stack.enter_async_context(running_replica(topology))
    limit = options.get("grpc.max_receive_message_length", GRPC_DEFAULT_MAX_RECEIVE)
    assert isinstance(limit, int)

    async def state() -> State:
        page = await store.get_prefix(keys.root)
        return {kv.key: (kv.value, kv.mod_revision) for kv in page.kvs if kv.key != keys.leader()}

    async def alive() -> object:
        st_ = await run.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        assert not st_.responder_is_leader and st_.leader == "fuzz-foreign-leader"
        return st_

    def readable(key: str, value: bytes) -> None:
        model = _model_of(keys, key)
        if model is not None:
            decode(model, value, key)  # CorruptValue: the loop / gateways could not read it

    try:
        yield Server(run.channel, limit, state, alive, readable)
    finally:
        await stack.aclose()
        await store.revoke_lease(lease)
        await store.close()


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


@pytest.fixture(scope="module")
def simulator() -> Iterator[Proc]:
    proc = start_simulator(
        extra_args=["--decode-tokens-per-s", "100000", "--prefill-tokens-per-s", "10000000"]
    )
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
async def agent(simulator: Proc) -> AsyncIterator[Server]:
    options: dict[str, object] = {}
    with server_options_spy(options):
        handle: AgentHandle = await serve_agent(
            AgentConfig(region="b", replicas=(simulator.url,), interval=5, timeout=1)
        )
    limit = options.get("grpc.max_receive_message_length", GRPC_DEFAULT_MAX_RECEIVE)
    assert isinstance(limit, int)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{handle.port}")
    describe = channel.unary_unary(
        "/tectonic.v1.RegionAgent/Describe",
        request_serializer=apb.DescribeRequest.SerializeToString,
        response_deserializer=apb.AgentDescription.FromString,
    )

    async def state() -> State:
        assert handle.service is not None
        # A run's progress moves on its own; which runs exist only changes by a call.
        return {fid: (b"", run.progress.total) for fid, run in handle.service._runs.items()}

    async def alive() -> object:
        d = await describe(apb.DescribeRequest(), timeout=5)
        assert d.region == "b" and d.replicas_active == 1
        return d

    try:
        yield Server(channel, limit, state, alive)
    finally:
        await channel.close()
        await handle.stop(grace=0)


def _server_of(method: MethodDescriptor, cp: Server, agent: Server) -> Server:
    return cp if method.containing_service is CONTROL_PLANE else agent


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


FUZZ = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
IDS = [m.full_name.removeprefix("tectonic.v1.") for m in METHODS]


# ---- tests ---------------------------------------------------------------------------------


def test_every_method_is_fuzzed() -> None:
    """A new method needs a strategy (its fields' types) and a say on whether it writes."""
    names = {m.full_name for m in METHODS}
    for m in METHODS:
        message_strategy(m.input_type)  # raises for a field type it cannot generate
    unclassified = names - READ_ONLY - MUTATING
    assert not unclassified, f"add these methods to READ_ONLY or MUTATING: {sorted(unclassified)}"
    assert not (READ_ONLY | MUTATING) - names, "READ_ONLY / MUTATING name methods that are gone"


@pytest.mark.parametrize("method", METHODS, ids=IDS)
@FUZZ
@given(data=st.data())
async def test_generated_requests_get_ok_or_a_clean_refusal(
    cp: Server, agent: Server, method: MethodDescriptor, data: st.DataObject
) -> None:
    request = data.draw(message_strategy(method.input_type), label="request")
    await check_call(_server_of(method, cp, agent), method, request.SerializeToString())


# Requests that once broke a property, pinned (a run of the fuzzing may not draw them).
PINNED = [
    pytest.param(  # accepted, stored as null: the leader dropped the report as corrupt
        "ReportHealth",
        pb.HealthReport(
            region="east",
            observer="agent:east",
            kind=pb.AGENT,
            health=pb.HEALTHY,
            signals={"load_rps": math.nan, "queue": math.inf},
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        id="nan-signal",
    ),
]


@pytest.mark.parametrize(("name", "request_", "code"), PINNED)
async def test_pinned_requests(
    cp: Server, name: str, request_: Message, code: grpc.StatusCode
) -> None:
    method = CONTROL_PLANE.methods_by_name[name]
    await check_call(cp, method, request_.SerializeToString())
    err = await invoke(cp.channel, method, request_.SerializeToString())
    assert err is not None and err.code() is code, err


@pytest.mark.parametrize("method", METHODS, ids=IDS)
@settings(FUZZ, max_examples=15)
@given(raw=RAW)
async def test_raw_bytes_that_parse_get_ok_or_a_clean_refusal(
    cp: Server, agent: Server, method: MethodDescriptor, raw: bytes
) -> None:
    """Bytes that are a valid message of the method's type (unknown fields, wrong wire
    types): the same property. Bytes that are not: see the test below; here also
    that they change nothing and the server keeps serving."""
    server = _server_of(method, cp, agent)
    try:
        GetMessageClass(method.input_type).FromString(raw)
    except DecodeError:
        before = await server.state()
        await invoke(server.channel, method, raw)
        assert await server.state() == before
        await server.alive()
        return
    await check_call(server, method, raw)


@pytest.mark.parametrize("method", METHODS, ids=IDS)
async def test_bytes_that_are_no_message_get_invalid_argument(
    cp: Server, agent: Server, method: MethodDescriptor
) -> None:
    server = _server_of(method, cp, agent)
    err = await invoke(server.channel, method, b"\xff\xff\xff\xff")
    assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT, (
        err and f"{err.code().name}: {err.details()}"
    )


@pytest.mark.parametrize("method", METHODS, ids=IDS)
async def test_a_request_over_the_configured_limit_is_refused(
    cp: Server, agent: Server, method: MethodDescriptor
) -> None:
    """Refused with RESOURCE_EXHAUSTED at ``limit + 1`` bytes (an unknown length-delimited
    field, valid for every message type), and nothing changes; one just under the
    limit is not refused for its size."""
    server = _server_of(method, cp, agent)
    size = server.max_receive + 1
    before = await server.state()
    err = await invoke(server.channel, method, padding(size), wait=20)  # MiBs to send
    assert err is not None and err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, (
        f"{method.full_name} took {size} bytes over a {server.max_receive}-byte limit: "
        f"{err and err.code().name}"
    )
    assert _human(err.details()) and await server.state() == before
    err = await invoke(server.channel, method, padding(server.max_receive - 64))
    assert err is None or err.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    await server.alive()


async def test_the_control_plane_limit_is_a_small_one(cp: Server) -> None:
    """Control-plane requests are small: its limit is far below grpc's 4 MiB default."""
    assert cp.max_receive <= 1024 * 1024


async def test_the_fuzzing_reached_acceptance_and_refusal(cp: Server, agent: Server) -> None:
    """Runs last in this module: the strategies produced both accepted and refused calls
    (a fuzzer that only ever hits the first check proves little)."""
    for server in (cp, agent):
        if not server.checked:
            if os.environ.get("CI"):  # CI runs the whole module: the fuzzers ran before this
                pytest.fail("the fuzz tests above made no calls")
            pytest.skip("run with the fuzz tests above")
        assert server.checked.get("ok", 0) > 0, server.checked
        assert any(k != "ok" for k in server.checked), server.checked
