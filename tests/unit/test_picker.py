"""The endpoint picker's decision (regions.picker.pick) and its ext_proc exchange
(regions.picker.service), over the real session store, routing cache and resolver on a
MemoryStore, with a fake clock. What Envoy does with the answers is tested with a real
Envoy in tests/integration/test_picker_envoy.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import FeatureFlags
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.store.memory import MemoryStore
from regions.dataplane.admission import Admission
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.replicas import ReplicaBalancer
from regions.dataplane.routing_cache import RoutingCache
from regions.dataplane.sessions import SessionResolver
from regions.picker import extproc
from regions.picker.extproc import BODY_BUFFERED, BODY_FULL_DUPLEX, BODY_NONE
from regions.picker.pick import Answer, Pick, Picker, PickerConfig
from regions.picker.service import HOLD_MARGIN_S, ExtProcService

REGIONS = ("east", "west", "eu")
ZONES = {"east": "us", "west": "us", "eu": "eu"}
REPLICAS = {
    "east": ("http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"),
    "west": ("http://10.1.0.1:8000",),
    "eu": ("http://10.2.0.1:8000",),
}
ENTRIES = {"west": "10.1.0.100:10000"}  # eu has none: its replicas are reached directly
NORMAL = {r: Routing(targets={r: 1.0}) for r in REGIONS}


def chat(text: str = "hello there", **extra: object) -> bytes:
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], **extra}
    return json.dumps(body).encode()


def headers(session: str = "", **extra: str) -> dict[str, str]:
    out = {":path": "/v1/chat/completions", ":method": "POST", **extra}
    if session:
        out["x-session-id"] = session
    return out


class World:
    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.clock = FakeClock(60.0 * 20_000)
        self.mono = FakeClock(100.0)
        self.store = MemoryStore(clock=self.clock.now)
        self.sessions = SessionStore(
            self.store, keys, regions=REGIONS, clock=self.clock, writer="picker-test"
        )
        self.routing = RoutingCache(self.store, keys, retry_s=0.01, max_retry_s=0.02)
        self.metrics = DataPlaneMetrics()
        self.resolver = SessionResolver(
            self.sessions,
            self.routing,
            "east",
            self.metrics,
            clock=self.clock,
            monotonic=self.mono.now,
        )
        self.balancers = {r: ReplicaBalancer(REPLICAS[r]) for r in REGIONS}
        self.flags: dict[str, FeatureFlags] = {}
        self.votes: list[tuple[str, bool, int]] = []
        admission = Admission(
            self.resolver,
            self.metrics,
            lambda r: self.flags.get(r, FeatureFlags()),
            chars=256,
        )
        self.picker = Picker(
            PickerConfig(home="east", zones=ZONES, entries=ENTRIES),
            admission,
            self.routing,
            self.resolver,
            self.balancers,
            self.metrics,
            vote=lambda region, ok, status: self.votes.append((region, ok, status)),
            monotonic=self.mono.now,
        )

    async def set_routing(self, routings: dict[str, Routing]) -> None:
        for region, routing in routings.items():
            await self.store.put(self.keys.routing(region), encode(routing))
        await self.routing.load()

    async def pin_of(self, session: str) -> str:
        got = await self.sessions.get(session)
        assert got is not None
        return got[0].region

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def world(keys: Keys) -> World:
    w = World(keys)
    await w.set_routing(NORMAL)
    return w


async def pick(world: World, body: bytes | None = None, **kw: object) -> Pick:
    got = await world.picker.pick(
        kw.pop("hdrs", None) or headers("s1"),  # type: ignore[arg-type]
        chat() if body is None else body,
        kw.pop("subset", None),  # type: ignore[arg-type]
    )
    assert isinstance(got, Pick), got
    return got


# ---- the decision --------------------------------------------------------------------


async def test_a_home_session_gets_its_regions_replicas_in_order_and_is_pinned(
    world: World,
) -> None:
    got = await pick(world)
    assert got.region == "east" and got.session == "s1"
    east = [r.split("://")[1] for r in REPLICAS["east"]]
    assert sorted(got.endpoints[:3]) == sorted(east)  # the choice first, then fallbacks
    # ... and last the entry point of the zone's next region, should every replica refuse
    assert got.endpoints[3:] == (ENTRIES["west"],)
    assert got.regions == ("east", "east", "east", "west")
    assert await world.pin_of("s1") == "east"
    assert world.balancers["east"].inflight[got.replicas[got.endpoints[0]]] == 1


async def test_a_shared_prompt_prefix_keeps_its_replica(world: World) -> None:
    firsts = set()
    for i in range(5):
        got = await pick(world, hdrs=headers(f"s{i}"))
        firsts.add(got.endpoints[0])
        world.picker.release(got)  # one at a time: no in-flight count pushes it on
    assert len(firsts) == 1


async def test_in_flight_requests_bound_a_replicas_share(world: World) -> None:
    held = [await pick(world, hdrs=headers(f"s{i}")) for i in range(3)]
    # the bound is ceil(1.25 x (in flight + 1) / 3): the same prompt spreads out
    assert len({p.endpoints[0] for p in held}) >= 2


async def test_a_session_pinned_elsewhere_goes_to_that_regions_entry_marked_via(
    world: World,
) -> None:
    await world.sessions.pin("s2", "west", home="west", actor="test", reason="a west session")
    got = await pick(world, hdrs=headers("s2"))
    assert got.endpoints == (ENTRIES["west"],)
    assert (extproc.VIA_HEADER, "east") in got.headers


async def test_a_region_without_an_entry_point_gets_its_replicas_directly(world: World) -> None:
    await world.sessions.pin("s3", "eu", home="eu", actor="test", reason="an eu session")
    got = await pick(world, hdrs=headers("s3"))
    assert got.endpoints == ("10.2.0.1:8000",)
    assert not got.headers


async def test_a_request_sent_by_another_picker_is_served_here_without_a_hop(
    world: World,
) -> None:
    await world.sessions.pin("s2", "west", home="west", actor="test", reason="a west session")
    got = await pick(world, hdrs=headers("s2", **{extproc.VIA_HEADER: "west"}))
    assert set(got.regions) == {"east"}  # no entry point, no spill: one hop at most


async def test_the_subset_hint_bounds_the_choice(world: World) -> None:
    got = await pick(world, subset=frozenset({"10.0.0.2:8000"}))
    assert got.endpoints == ("10.0.0.2:8000",)  # the spill entry is outside the hint too


async def test_an_empty_or_foreign_subset_hint_is_a_503(world: World) -> None:
    for subset in (frozenset(), frozenset({"192.168.9.9:1"})):
        got = await world.picker.pick(headers("s1"), chat(), subset)
        assert isinstance(got, Answer) and got.status == 503
        assert ("retry-after", "1") in got.headers


async def test_a_shed_request_is_a_429_with_retry_after_in_both_body_modes(
    world: World,
) -> None:
    world.flags["east"] = FeatureFlags(shed_priority_below=5)
    for body in (chat(), None):
        got = await world.picker.pick(headers("s1", **{"x-priority": "1"}), body, None)
        assert isinstance(got, Answer) and got.status == 429
        assert ("retry-after", "5") in got.headers
        assert "shedding requests of priority below 5" in json.loads(got.body)["error"]["message"]
    kept = await world.picker.pick(headers("s1", **{"x-priority": "7"}), chat(), None)
    assert isinstance(kept, Pick)


async def test_an_over_long_context_is_refused_with_vllms_400(world: World) -> None:
    world.flags["east"] = FeatureFlags(max_context_tokens=4)
    got = await world.picker.pick(headers("s1"), chat("word " * 200), None)
    assert isinstance(got, Answer) and got.status == 400
    assert json.loads(got.body)["error"]["type"] == "BadRequestError"


async def test_bad_requests_get_vllms_error_shape_and_change_nothing(world: World) -> None:
    for body, hdrs in (
        (b"{not json", headers("s9")),
        (json.dumps({"messages": []}).encode(), headers("s9")),
        (chat(), headers("no/slashes\nor newlines")),
    ):
        got = await world.picker.pick(hdrs, body, None)
        assert isinstance(got, Answer) and got.status == 400, got
        assert json.loads(got.body)["error"]["code"] == 400
    assert await world.sessions.get("s9") is None


async def test_header_only_mode_routes_by_the_session_header(world: World) -> None:
    first = await world.picker.pick(headers("s5"), None, None)
    assert isinstance(first, Pick)
    world.picker.release(first)
    again = await world.picker.pick(headers("s5"), None, None)
    assert isinstance(again, Pick)
    assert first.endpoints[0] == again.endpoints[0]
    assert await world.pin_of("s5") == "east"


# ---- what the answer teaches ---------------------------------------------------------


async def test_served_by_the_spill_region_moves_the_session_once(world: World) -> None:
    got = await pick(world)
    region = await world.picker.served(got, ENTRIES["west"], 200)
    assert region == "west"
    assert await world.pin_of("s1") == "west"
    assert world.metric("tectonic_gateway_spills_total", from_region="east", to_region="west") == 1
    # every east replica Envoy went past is ejected: failed votes, and chosen last now
    assert [v for v in world.votes if not v[1]] == [("east", False, 0)] * 3
    assert world.votes[-1] == ("west", True, 200)
    # the session now lives in west: its next request goes to west's entry point
    assert (await pick(world)).endpoints == (ENTRIES["west"],)


async def test_served_in_region_by_a_fallback_ejects_the_first_and_moves_nothing(
    world: World,
) -> None:
    got = await pick(world)
    first, second = (got.replicas[e] for e in got.endpoints[:2])
    assert await world.picker.served(got, got.endpoints[1], 200) == "east"
    assert await world.pin_of("s1") == "east"
    # the in-flight count is the replica's that serves it, until the request ends
    east = world.balancers["east"]
    assert east.inflight[first] == 0 and east.inflight[second] == 1
    world.picker.release(got)
    world.picker.release(got)  # idempotent
    assert east.inflight[second] == 0
    again = await pick(world, hdrs=headers("s7"))  # same prompt: its replica is ejected
    assert again.endpoints[0] != got.endpoints[0]
    world.picker.release(again)
    world.mono.advance(3.0)  # past eject_s: it is chosen again
    assert (await pick(world, hdrs=headers("s8"))).endpoints[0] == got.endpoints[0]


async def test_envoys_own_answer_is_a_failed_vote_for_the_sessions_region(world: World) -> None:
    got = await pick(world)
    assert await world.picker.served(got, "", 503) == "east"
    assert world.votes == [("east", False, 503)]
    assert world.metric("tectonic_gateway_errors_total", region="east", kind="no_replica") == 1


# ---- the ext_proc exchange -----------------------------------------------------------


def _headers_message(
    hdrs: dict[str, str], *, mode: int | None, end: bool = False
) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs.items()]
            ),
            end_of_stream=end,
        )
    )
    if mode is not None:
        msg.protocol_config.request_body_mode = mode  # type: ignore[assignment]
    return msg


def _body_message(data: bytes, end: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=end))


def _response_message(status: int, served: str) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=":status", raw_value=str(status).encode())]
            )
        )
    )
    lb = struct_pb2.Struct()
    lb.fields[extproc.SERVED].string_value = served
    msg.metadata_context.filter_metadata[extproc.LB_NAMESPACE].CopyFrom(lb)
    return msg


async def exchange(
    world: World, messages: Iterable[pb.ProcessingRequest], *, max_body: int = 1 << 20
) -> list[pb.ProcessingResponse]:
    service = ExtProcService(world.picker, max_body_bytes=max_body)

    async def stream() -> AsyncIterator[pb.ProcessingRequest]:
        for m in messages:
            yield m

    return [r async for r in service.Process(stream(), None)]  # type: ignore[arg-type]


def destination(resp: pb.ProcessingResponse, phase: str) -> str:
    common = getattr(resp, phase).response
    (header,) = [
        h for h in common.header_mutation.set_headers if h.header.key == extproc.DESTINATION
    ]
    meta = resp.dynamic_metadata.fields[extproc.LB_NAMESPACE].struct_value
    value = header.header.raw_value.decode()
    assert meta.fields[extproc.DESTINATION].string_value == value  # the protocol: one value
    assert common.clear_route_cache
    return value


async def test_buffered_mode_lets_headers_through_and_routes_on_the_body(world: World) -> None:
    body = chat()
    out = await exchange(
        world,
        [
            _headers_message(headers("s1"), mode=BODY_BUFFERED),
            _body_message(body),
            _response_message(200, "10.0.0.9:1"),
        ],
    )
    assert [r.WhichOneof("response") for r in out] == [
        "request_headers",
        "request_body",
        "response_headers",
    ]
    assert not out[0].request_headers.response.header_mutation.set_headers
    assert destination(out[1], "request_body").split(",")[-1] == ENTRIES["west"]
    assert not out[1].request_body.response.body_mutation.body  # unchanged: not resent
    (region,) = out[2].response_headers.response.header_mutation.set_headers
    assert (region.header.key, region.header.raw_value) == (extproc.REGION_HEADER, b"east")
    assert all(n == 0 for n in world.balancers["east"].inflight.values())


async def test_full_duplex_answers_the_headers_after_the_body_and_streams_it_back(
    world: World,
) -> None:
    body = chat("x" * 100_000)  # more than one piece of BODY_CHUNK
    half = len(body) // 2
    out = await exchange(
        world,
        [
            _headers_message(headers("s1"), mode=BODY_FULL_DUPLEX),
            _body_message(body[:half], end=False),
            _body_message(body[half:]),
        ],
    )
    kinds = [r.WhichOneof("response") for r in out]
    assert kinds == ["request_headers", "request_body", "request_body"]
    destination(out[0], "request_headers")
    pieces = [r.request_body.response.body_mutation.streamed_response for r in out[1:]]
    assert b"".join(p.body for p in pieces) == body
    assert [p.end_of_stream for p in pieces] == [False, True]
    assert all(len(p.body) <= extproc.BODY_CHUNK for p in pieces)


async def test_header_only_mode_routes_on_the_headers(world: World) -> None:
    out = await exchange(world, [_headers_message(headers("s1"), mode=BODY_NONE)])
    assert destination(out[0], "request_headers")


async def test_a_refusal_is_an_immediate_response(world: World) -> None:
    out = await exchange(
        world,
        [_headers_message(headers("s1"), mode=BODY_BUFFERED), _body_message(b"{oops")],
    )
    answer = out[1].immediate_response
    assert answer.status.code == 400
    assert json.loads(answer.body)["error"]["type"] == "BadRequestError"
    assert {h.header.key for h in answer.headers.set_headers} == {"content-type"}


async def test_a_body_over_the_limit_is_a_413(world: World) -> None:
    out = await exchange(
        world,
        [_headers_message(headers("s1"), mode=BODY_FULL_DUPLEX), _body_message(chat("y" * 500))],
        max_body=100,
    )
    assert out[-1].immediate_response.status.code == 413


async def test_an_unreported_mode_uses_the_configured_default(world: World) -> None:
    out = await exchange(world, [_headers_message(headers("s1"), mode=None), _body_message(chat())])
    assert [r.WhichOneof("response") for r in out] == ["request_headers", "request_body"]
    destination(out[1], "request_body")


class HoldingPicker:
    """A picker whose every request finds its pool at zero: it says how long it holds
    (``on_hold``), then waits until ``woken``, then refuses (503)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.woken = asyncio.Event()
        self.cancelled = False

    async def pick(
        self,
        headers: dict[str, str],
        body: bytes | None,
        subset: frozenset[str] | None,
        *,
        on_hold: Callable[[float], None] | None = None,
    ) -> Answer:
        assert on_hold is not None
        on_hold(self.hold_s)
        try:
            await self.woken.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return Answer(503, b"{}", (("retry-after", "3"),))


async def test_before_holding_the_picker_asks_envoy_to_wait_the_hold_and_a_margin() -> None:
    picker = HoldingPicker(hold_s=20.0)
    service = ExtProcService(picker, max_body_bytes=1 << 20)  # type: ignore[arg-type]

    async def stream() -> AsyncIterator[pb.ProcessingRequest]:
        yield _headers_message(headers("s1"), mode=BODY_NONE)

    answers = service.Process(stream(), None)  # type: ignore[arg-type]
    # out while the answer is still held: the extension, alone
    first = await asyncio.wait_for(anext(answers), timeout=5)
    assert first.WhichOneof("response") is None
    wait_ms = first.override_message_timeout.ToMilliseconds()
    assert wait_ms == (20.0 + HOLD_MARGIN_S) * 1000
    picker.woken.set()
    second = await anext(answers)
    assert second.immediate_response.status.code == 503
    assert [r async for r in answers] == []


async def test_the_extension_is_at_most_what_envoy_allows() -> None:
    picker = HoldingPicker(hold_s=200.0)
    service = ExtProcService(  # type: ignore[arg-type]
        picker, max_body_bytes=1 << 20, max_message_timeout_s=90.0
    )

    async def stream() -> AsyncIterator[pb.ProcessingRequest]:
        yield _headers_message(headers("s1"), mode=BODY_NONE)

    answers = service.Process(stream(), None)  # type: ignore[arg-type]
    first = await asyncio.wait_for(anext(answers), timeout=5)
    assert first.override_message_timeout.ToMilliseconds() == 90_000
    await answers.aclose()  # Envoy gave up on the stream: the hold ends with it
    for _ in range(10):
        await asyncio.sleep(0)
    assert picker.cancelled


# ---- the protocol's small parts ------------------------------------------------------


def test_the_extension_asks_whole_milliseconds_and_answers_nothing() -> None:
    msg = extproc.extend(35.0004)
    assert msg.WhichOneof("response") is None
    assert msg.override_message_timeout.ToMilliseconds() == 35_001
    assert extproc.extend(0.0).override_message_timeout.ToMilliseconds() == 1  # Envoy's least


def test_the_subset_hint_is_read_as_a_list_or_a_comma_string() -> None:
    md = base_pb2.Metadata()
    hint = struct_pb2.Struct()
    hint.fields[extproc.SUBSET].list_value.values.add().string_value = "10.0.0.1:8000"
    md.filter_metadata[extproc.SUBSET_NAMESPACE].CopyFrom(hint)
    assert extproc.subset_of(md) == {"10.0.0.1:8000"}
    hint.fields[extproc.SUBSET].string_value = "a:1, b:2"
    md.filter_metadata[extproc.SUBSET_NAMESPACE].CopyFrom(hint)
    assert extproc.subset_of(md) == {"a:1", "b:2"}
    assert extproc.subset_of(base_pb2.Metadata()) is None


def test_endpoints_of_replica_urls() -> None:
    assert extproc.endpoint_of("http://10.0.0.7:8000") == "10.0.0.7:8000"
    assert extproc.endpoint_of("http://[fd00::1]:8000/") == "[fd00::1]:8000"
