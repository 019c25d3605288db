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

The request strategies are in ``grpc_strategies.py``, the servers' harness and the
property's check (``check_call``) in ``grpc_harness.py``; the servers themselves are
this module's fixtures, shared by all its tests (module scope: one control-plane
replica and one agent, whose call counts the last test reads).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tectonic_api.v1 import agent_pb2 as apb
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulator
from controlplane.kernel.codec import decode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from regions.agent.server import AgentConfig, AgentHandle, serve_agent
from tests.fuzz.grpc_harness import (
    CONTROL_PLANE,
    GRPC_DEFAULT_MAX_RECEIVE,
    METHODS,
    MUTATING,
    READ_ONLY,
    Server,
    State,
    _human,
    _model_of,
    _seed,
    check_call,
    invoke,
    server_options_spy,
)
from tests.fuzz.grpc_strategies import RAW, message_strategy, padding
from tests.integration.cp_harness import fast_topology, running_replica

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


# ---- the servers -------------------------------------------------------------------------


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
