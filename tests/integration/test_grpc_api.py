"""The control plane's gRPC API end to end: a real replica on 127.0.0.1, a real etcd.

Health reports are pushed over gRPC by the test, playing the agent and gateway
vantage points; the replica's own agent probe is off (there are no agents here).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.procs import until as poll
from controlplane.kernel.config import Topology
from tests.integration.cp_harness import fast_topology, region, running_replica, until

pytestmark = pytest.mark.etcd


@pytest.fixture
def topology(etcd: object) -> Topology:
    return fast_topology(etcd.endpoints, f"t{uuid.uuid4().hex[:8]}")  # type: ignore[attr-defined]


async def test_automatic_failover_over_grpc_with_event_stream(topology: Topology) -> None:
    async with running_replica(topology) as run:
        st = await until(
            lambda s: s.responder_is_leader and all(r.health == pb.HEALTHY for r in s.regions),
            run.stub,
            {},
        )
        assert st.leader == "cp-a" and region(st, "east").state == pb.NORMAL

        events = run.stub.WatchEvents(pb.WatchEventsRequest(region="east"))
        st = await until(
            lambda s: (
                region(s, "east").state == pb.FAILING_OVER
                and region(s, "east").failover_steps_done == "switch,prewarm"
            ),
            run.stub,
            {"east": pb.UNHEALTHY},
        )
        east = region(st, "east")
        assert set(east.routing) == {"west", "central"}  # same zone only
        assert east.routing["west"] == pytest.approx(90 / 130, abs=1e-3)  # by headroom
        assert east.health == pb.UNHEALTHY

        seen: list[pb.Event] = []
        async with asyncio.timeout(10):
            async for ev in events:
                seen.append(ev)
                if ev.action == "routing_switch":
                    break
        events.cancel()
        transition = next(e for e in seen if e.action == "transition")
        assert transition.decision.from_state == pb.NORMAL
        assert transition.decision.to_state == pb.FAILING_OVER
        assert transition.decision.actor == "cp-a"
        assert transition.decision.signals["votes_down"] == 2

        # Healthy again: dwell, then graduated recovery back to NORMAL.
        st = await until(lambda s: region(s, "east").state == pb.NORMAL, run.stub, {})
        assert dict(region(st, "east").routing) == {"east": 1.0}
        hist = await run.stub.GetHistory(pb.HistoryRequest(region="east", limit=100))
        path = [
            (e.decision.from_state, e.decision.to_state)
            for e in hist.events
            if e.action == "transition"
        ]
        assert path == [
            (pb.NORMAL, pb.FAILING_OVER),
            (pb.FAILING_OVER, pb.RECOVERED),
            (pb.RECOVERED, pb.NORMAL),
        ]
        assert any(e.action == "recovery_step" for e in hist.events)


async def test_bad_requests_are_refused_and_change_nothing(topology: Topology) -> None:
    async with running_replica(topology) as run:
        await until(
            lambda s: s.responder_is_leader and all(r.health == pb.HEALTHY for r in s.regions),
            run.stub,
            {},
        )
        before = await run.stub.GetHistory(pb.HistoryRequest(limit=1000))

        async def code_of(call: object) -> grpc.StatusCode:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call  # type: ignore[misc]
            return e.value.code()

        s = run.stub
        assert (
            await code_of(s.RequestFailover(pb.FailoverRequest(region="mars", reason="x")))
            == grpc.StatusCode.INVALID_ARGUMENT
        )
        assert (
            await code_of(s.RequestFailover(pb.FailoverRequest(region="east")))
            == grpc.StatusCode.INVALID_ARGUMENT
        )  # no reason
        assert (
            await code_of(
                s.RequestFailover(pb.FailoverRequest(region="east", to=["eu"], reason="try"))
            )
            == grpc.StatusCode.FAILED_PRECONDITION
        )
        assert (
            await code_of(
                s.RequestFailover(pb.FailoverRequest(region="east", to=["nowhere"], reason="try"))
            )
            == grpc.StatusCode.INVALID_ARGUMENT
        )
        assert (
            await code_of(s.RequestRecovery(pb.RecoveryRequest(region="east", reason="x")))
            == grpc.StatusCode.FAILED_PRECONDITION
        )  # not failed over
        assert (
            await code_of(
                s.ReportHealth(pb.HealthReport(region="east", observer="agent:east", kind=pb.AGENT))
            )
            == grpc.StatusCode.INVALID_ARGUMENT
        )  # health unset
        assert (
            await code_of(
                s.ReportHealth(
                    pb.HealthReport(region="nope", observer="x", kind=pb.AGENT, health=pb.HEALTHY)
                )
            )
            == grpc.StatusCode.INVALID_ARGUMENT
        )
        assert await code_of(s.Pause(pb.PauseRequest())) == grpc.StatusCode.INVALID_ARGUMENT
        for bad in (-1.0, 8 * 86400.0, float("nan"), float("inf")):  # a pause ends, within 7 d
            got = await code_of(s.Pause(pb.PauseRequest(reason="r", for_s=bad)))
            assert got == grpc.StatusCode.INVALID_ARGUMENT, bad
        assert await code_of(s.Resume(pb.PauseRequest())) == grpc.StatusCode.INVALID_ARGUMENT
        assert not (await s.GetStatus(pb.GetStatusRequest())).paused  # none of those paused
        assert (
            await code_of(
                s.RequestFailover(pb.FailoverRequest(region="east", reason="x" * 200_000))
            )
            == grpc.StatusCode.RESOURCE_EXHAUSTED
        )
        assert (
            await code_of(s.RequestFailover(pb.FailoverRequest(region="east", reason="y" * 5000)))
            == grpc.StatusCode.INVALID_ARGUMENT
        )

        dry = await s.RequestFailover(
            pb.FailoverRequest(region="east", reason="plan it", dry_run=True)
        )
        assert dry.dry_run and not dry.accepted and set(dry.plan.targets) == {"west", "central"}

        after = await s.GetHistory(pb.HistoryRequest(limit=1000))
        assert list(after.events) == list(before.events)  # nothing audited: nothing happened
        st = await s.GetStatus(pb.GetStatusRequest())
        assert all(r.state == pb.NORMAL for r in st.regions) and not st.paused


async def test_manual_failover_pause_and_recovery(topology: Topology) -> None:
    async with running_replica(topology) as run:
        s = run.stub
        await until(
            lambda st: st.responder_is_leader and all(r.health == pb.HEALTHY for r in st.regions),
            s,
            {},
        )
        await s.Pause(pb.PauseRequest(reason="maintenance", actor="alice"))
        resp = await s.RequestFailover(
            pb.FailoverRequest(region="west", to=["central"], reason="drain west", actor="alice")
        )
        assert resp.accepted and resp.intent_id
        st = await until(
            lambda st: region(st, "west").failover_steps_done == "prewarm,switch", s, {}
        )
        assert st.paused and dict(region(st, "west").routing) == {"central": 1.0}
        # Paused: an unhealthy region is not failed over automatically.
        await asyncio.sleep(1.0)
        st = await until(
            lambda st: region(st, "east").health == pb.UNHEALTHY, s, {"east": pb.UNHEALTHY}
        )
        assert region(st, "east").state == pb.NORMAL
        await s.RequestRecovery(pb.RecoveryRequest(region="west", reason="done", actor="alice"))
        st = await until(lambda st: region(st, "west").state == pb.RECOVERED, s, {})
        # Graduated recovery is automation too: it waits while paused.
        await asyncio.sleep(1.0)
        st = await until(lambda st: True, s, {})
        assert region(st, "west").state == pb.RECOVERED and region(st, "west").recovery_step == 0
        await s.Resume(pb.PauseRequest(reason="done", actor="alice"))
        st = await until(lambda st: region(st, "west").state == pb.NORMAL, s, {})
        hist = await s.GetHistory(pb.HistoryRequest(limit=200))
        actors = {(e.action, e.actor) for e in hist.events}
        assert ("intent_failover", "alice") in actors and ("pause", "alice") in actors
        assert ("transition", "alice") in actors


async def test_a_pause_ends_by_itself_and_the_leader_audits_it(topology: Topology) -> None:
    async with running_replica(topology) as run:
        s = run.stub
        await until(lambda st: st.responder_is_leader, s, {})
        before = time.time()
        await s.Pause(pb.PauseRequest(reason="INC-7 look", actor="alice"))  # the default: 1 h
        st = await s.GetStatus(pb.GetStatusRequest())
        assert st.paused and before + 3600 <= st.paused_until <= time.time() + 3600
        await s.Pause(pb.PauseRequest(reason="INC-7 short", actor="alice", for_s=1.5))
        # from its until on, status says unpaused (read off the clock); the leader's
        # next tick writes the end
        st = await until(lambda st: not st.paused, s, {})
        assert st.paused_until == 0 and st.pause_reason == ""

        async def resumes() -> list[pb.Event]:
            hist = await s.GetHistory(pb.HistoryRequest(limit=200))
            return [e for e in hist.events if e.action == "resume"]

        async def resumed_once() -> bool:
            return bool(await resumes())

        await poll(resumed_once, within=20, what="the leader's resume entry")
        await asyncio.sleep(1.0)  # ticks go on: the end is written once
        hist = await s.GetHistory(pb.HistoryRequest(limit=200))
        resumed = await resumes()
        assert len(resumed) == 1 and resumed[0].actor == st.leader, resumed
        assert "alice" in resumed[0].reason and "INC-7 short" in resumed[0].reason
        paused = [e for e in hist.events if e.action == "pause"]
        assert [e.reason for e in paused] == ["INC-7 look", "INC-7 short"]


async def test_standard_health_and_reflection(topology: Topology) -> None:
    async with running_replica(topology) as run:
        await until(lambda st: st.responder_is_leader, run.stub, {})
        hs = health_pb2_grpc.HealthStub(run.channel)
        resp = await hs.Check(health_pb2.HealthCheckRequest(service="tectonic.v1.ControlPlane"))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(run.channel)
        names: list[str] = []
        async for r in refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        ):
            names = [s.name for s in r.list_services_response.service]
        assert "tectonic.v1.ControlPlane" in names and "grpc.health.v1.Health" in names


async def test_reflection_answers_under_v1_as_current_clients_ask(topology: Topology) -> None:
    """grpcurl and other current clients ask grpc.reflection.v1 first; v1alpha stays."""
    async with running_replica(topology) as run:
        # Same messages on the wire as v1alpha: only the service path differs.
        v1 = run.channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        asks = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="tectonic.v1.ControlPlane"
            ),
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="grpc.reflection.v1.ServerReflection"
            ),
        ]
        answers = [r async for r in v1(iter(asks), timeout=10)]
        assert len(answers) == 3 and not any(a.HasField("error_response") for a in answers)
        names = {s.name for s in answers[0].list_services_response.service}
        assert {
            "tectonic.v1.ControlPlane",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= names
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(b)
            for b in answers[1].file_descriptor_response.file_descriptor_proto
        ]
        assert any(s.name == "ControlPlane" for f in files for s in f.service)
        refl_file = descriptor_pb2.FileDescriptorProto.FromString(
            answers[2].file_descriptor_response.file_descriptor_proto[0]
        )
        assert refl_file.package == "grpc.reflection.v1"
        method = refl_file.service[0].method[0]
        assert method.input_type == ".grpc.reflection.v1.ServerReflectionRequest"
