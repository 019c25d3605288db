"""Admission control in the endpoint picker (regions.picker.pick, regions.picker.service)
with the gateway's gates on a fake clock: over the limit an immediate 429 with
Retry-After, a slot taken on another replica when the chosen one is full, the slot
freed when the ext_proc stream ends, and the first token taken from the response body
when Envoy sends it, else from the response headers. With a real Envoy:
tests/integration/test_picker_admission_envoy.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from controlplane.kernel.config import parse_topology
from regions.dataplane.admission_gate import AdmissionGates, AdmissionOptions
from regions.picker.extproc import BODY_BUFFERED, BODY_NONE
from regions.picker.pick import Answer, Pick
from regions.picker.service import ExtProcService
from tests.unit.test_picker import (
    REGIONS,
    REPLICAS,
    World,
    _body_message,
    _headers_message,
    _response_message,
    chat,
    exchange,
    headers,
    world,
)

__all__ = ["world"]  # the fixture, shared with test_picker.py
BODY_STREAMED = 1  # ProcessingMode.BodySendMode.STREAMED


def gated(world: World, max_inflight: int) -> AdmissionGates:
    topology = parse_topology(
        {
            "cluster": "picker-admission",
            "etcd": {"endpoints": ["127.0.0.1:2379"]},
            "regions": [
                {
                    "name": r,
                    "zone": "us",
                    "agent": "127.0.0.1:1",
                    "capacity_rps": 10,
                    "replicas": list(REPLICAS[r]),
                }
                for r in REGIONS
            ],
        }
    )
    options = AdmissionOptions(enabled=True, max_inflight=max_inflight, max_queue=0)
    gates = AdmissionGates(options, topology, world.metrics, monotonic=world.mono.now)
    world.picker.gates = gates
    return gates


async def test_over_the_limit_the_picker_answers_429_and_a_freed_slot_admits_again(
    world: World,
) -> None:
    gates = gated(world, max_inflight=1)
    picks = [await world.picker.pick(headers(f"s{i}"), chat(f"p{i}"), None) for i in range(4)]
    admitted = [p for p in picks if isinstance(p, Pick)]
    assert len(admitted) == 3  # one per replica of east, each its first in the list
    assert sorted(p.endpoints[0] for p in admitted) == sorted(
        r.split("://")[1] for r in REPLICAS["east"]
    )
    refused = picks[3]
    assert isinstance(refused, Answer) and refused.status == 429
    assert dict(refused.headers)["retry-after"].isdigit()
    assert "admission limit" in json.loads(refused.body)["error"]["message"]
    gate = gates.gate("east")
    assert gate is not None and gate.limiter.inflight() == 3
    # the refused request holds nothing
    assert sum(world.balancers["east"].inflight.values()) == 3
    world.picker.release(admitted[0])
    world.picker.release(admitted[0])  # idempotent
    assert gate.limiter.inflight() == 2
    again = await world.picker.pick(headers("s9"), chat("p9"), None)
    assert isinstance(again, Pick) and again.endpoints[0] == admitted[0].endpoints[0]


async def test_the_slot_frees_when_the_ext_proc_stream_ends(world: World) -> None:
    gates = gated(world, max_inflight=1)
    await exchange(
        world,
        [_headers_message(headers("s1"), mode=BODY_BUFFERED), _body_message(chat())],
    )
    gate = gates.gate("east")
    assert gate is not None and gate.limiter.inflight() == 0


@pytest.mark.parametrize(
    ("response_mode", "first_token_on"),
    [(BODY_NONE, "response_headers"), (BODY_STREAMED, "response_body")],
)
async def test_the_first_token_is_the_first_body_chunk_when_envoy_sends_bodies(
    world: World, monkeypatch: pytest.MonkeyPatch, response_mode: int, first_token_on: str
) -> None:
    gated(world, max_inflight=4)
    reading: list[str] = []  # the kind of the message the service is handling
    seen: list[str] = []
    monkeypatch.setattr(world.picker, "first_token", lambda pick: seen.append(reading[-1]))
    request = _headers_message(headers("s1"), mode=BODY_BUFFERED)
    request.protocol_config.response_body_mode = response_mode  # type: ignore[assignment]
    chunk = pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: {}\n\n"))
    messages = [request, _body_message(chat()), _response_message(200, "10.0.0.1:8000")]
    if response_mode != BODY_NONE:
        messages += [chunk, chunk]

    async def stream() -> AsyncIterator[pb.ProcessingRequest]:
        for m in messages:
            reading.append(str(m.WhichOneof("request")))
            yield m

    service = ExtProcService(world.picker, max_body_bytes=1 << 20)
    out = [r async for r in service.Process(stream(), None)]  # type: ignore[arg-type]
    assert len(out) == len(messages)
    assert seen == [first_token_on]  # once, on the first chunk when bodies come


async def test_served_by_another_replica_the_slot_of_the_first_is_given_back(
    world: World,
) -> None:
    """Envoy went past the admitted replica (it reset): the request runs on the next,
    so its slot moves there (the first's frees at once) and its first token, the failed
    attempt in it, steers no limit."""
    gates = gated(world, max_inflight=1)
    got = await world.picker.pick(headers("s1"), chat("p1"), None)
    assert isinstance(got, Pick) and got.grant is not None
    gate = gates.gate("east")
    assert gate is not None
    first, second = (got.replicas[e] for e in got.endpoints[:2])
    limits = gate.limiter.limits()
    assert gate.limiter.inflight(first) == 1
    assert await world.picker.served(got, got.endpoints[1], 200) == "east"
    assert gate.limiter.inflight(first) == 0 and gate.limiter.inflight(second) == 1
    assert got.grant is not None and got.grant[1].replica == second
    assert world.balancers["east"].inflight[second] == 1
    world.mono.advance(5.0)  # a first token far past any target: no limit moves
    world.picker.first_token(got)
    assert gate.limiter.limits() == limits
    world.picker.release(got)
    assert gate.limiter.inflight() == 0 and world.balancers["east"].inflight[second] == 0


async def test_served_outside_the_list_the_slot_ends(world: World) -> None:
    """Envoy answered itself, or from an endpoint not in the list: no replica of ours
    is known to run it, so nothing stays held."""
    gates = gated(world, max_inflight=1)
    got = await world.picker.pick(headers("s1"), chat("p1"), None)
    assert isinstance(got, Pick)
    gate = gates.gate("east")
    assert gate is not None and gate.limiter.inflight() == 1
    await world.picker.served(got, "", 503)
    assert gate.limiter.inflight() == 0 and got.grant is None and got.held is None
