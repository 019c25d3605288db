"""How the gateway counts streams, on a real etcd, in front of simulator processes.

* A client that read a stream to its end is an answer, never ``client_gone``. The
  official ``openai`` client closes its connection as soon as it has ``[DONE]``; when
  the end of the chunked body reaches the gateway after that close (a replica under
  load sends them in separate writes), the gateway could no longer write it. A client
  that stops reading at ``finish_reason`` has the whole answer too. One that leaves
  mid-answer is ``client_gone``.
* A stream whose replica dies after the first byte is a failure that the 5xx error
  rates see (``code="502"``), not a 200; ``stream_broken`` counts it too.

The replica's end of a stream is held back by a TCP relay in front of the simulator
(``HoldingRelay``): it widens the window in which a client's close overtakes it, so
that the test shows every time what happens now and then in a lab. The gateway runs
in process (``running_gateway``) so that the test reads its registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator

import openai
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators, until
from controlplane.kernel.config import Topology, parse_topology
from regions.gateway.server import GatewayServer
from tests.integration.cp_harness import fast_topology, running_gateway

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
REGION = "east"
STREAMS = 8
HOLD_S = 0.5  # the relay's pause: far longer than a client takes to close
# The end of an SSE event's chunk in the chunked body (event, blank line, chunk CRLF).
AFTER_DONE = re.compile(rb"data: \[DONE\]\n\n\r\n")
AFTER_FINISH = re.compile(rb'"finish_reason": ?"[^"]+"[^\n]*\n\n\r\n')


class HoldingRelay:
    """A TCP relay to ``port`` that pauses the replica's bytes for ``hold_s`` after each
    match of ``mark`` (what follows arrives later, in order)."""

    def __init__(self, port: int, mark: re.Pattern[bytes], hold_s: float) -> None:
        self.port, self.mark, self.hold_s = port, mark, hold_s
        self.url = ""
        self.holds = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> HoldingRelay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        ways = [self._pump(reader, up_writer, hold=False), self._pump(up_reader, writer, hold=True)]
        tasks = [asyncio.create_task(w) for w in ways]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        for w in (writer, up_writer):
            w.close()

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, hold: bool
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                start = 0
                for m in self.mark.finditer(data) if hold else ():
                    dst.write(data[start : m.end()])
                    await dst.drain()
                    self.holds += 1
                    await asyncio.sleep(self.hold_s)
                    start = m.end()
                dst.write(data[start:])
                await dst.drain()


def topology(etcd: EtcdServer, cluster: str, replica: str) -> Topology:
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [{**r, "replicas": [replica]} for r in data["regions"] if r["name"] == REGION]
    return parse_topology(data)


@pytest.fixture
def simulator() -> Iterator[Proc]:
    [sim] = start_simulators(1)
    try:
        yield sim
    finally:
        sim.kill()


@pytest.fixture
def slow_simulator() -> Iterator[Proc]:
    [sim] = start_simulators(1, extra_args=("--decode-tokens-per-s", "20"))
    try:
        yield sim
    finally:
        sim.kill()


@contextlib.asynccontextmanager
async def gateway_and_client(
    etcd: EtcdServer, cluster: str, replica: str
) -> AsyncIterator[tuple[GatewayServer, openai.AsyncOpenAI]]:
    topo = topology(etcd, cluster, replica)
    async with running_gateway(topo, REGION, prefix_tracking=False) as gw:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        async with client:
            yield gw, client


def sample(gw: GatewayServer, name: str, **labels: str) -> float:
    return gw.metrics.registry.get_sample_value(name, {"region": REGION, **labels}) or 0.0


def client_gone(gw: GatewayServer) -> float:
    return sample(gw, "tectonic_gateway_errors_total", kind="client_gone")


async def answered(gw: GatewayServer) -> None:
    """Wait until the gateway has counted every stream as answered (200), then check it
    counted no more: the relay holds each replica's end HOLD_S after the client had it,
    so the count lands after the client is done. A stream the gateway took for a client
    gone is never counted so, and the wait fails."""

    async def counted() -> bool:
        return sample(gw, "tectonic_gateway_requests_total", code="200") >= STREAMS

    await until(counted, within=10, every=0.05, what=f"{STREAMS} answers counted")
    assert sample(gw, "tectonic_gateway_requests_total", code="200") == STREAMS


async def stream(
    client: openai.AsyncOpenAI, session: str, *, stop_at_finish: bool = False, tokens: int = 4
) -> str | None:
    """One chat streamed to its end (or to its finish_reason, then closed); returns
    the finish_reason."""
    answer = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": f"tell me story {session}"}],
        max_tokens=tokens,
        stream=True,
        stream_options={"include_usage": True},  # a usage chunk follows the finish
        extra_headers={"x-session-id": session},
    )
    finish = None
    async with answer:
        async for chunk in answer:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
                if stop_at_finish:
                    break
    return finish


async def test_streams_read_to_done_are_answers_not_client_gone(
    etcd: EtcdServer, cluster_name: str, simulator: Proc
) -> None:
    async with (
        HoldingRelay(simulator.port, AFTER_DONE, HOLD_S) as relay,
        gateway_and_client(etcd, cluster_name, relay.url) as (gw, client),
    ):
        finishes = await asyncio.gather(*(stream(client, f"done-{i}") for i in range(STREAMS)))
        assert finishes == ["length"] * STREAMS
        assert relay.holds == STREAMS  # each stream's end came after the client had [DONE]
        await answered(gw)  # the held ends reach the gateway
        assert client_gone(gw) == 0


async def test_clients_that_stop_at_finish_reason_are_answers_not_client_gone(
    etcd: EtcdServer, cluster_name: str, simulator: Proc
) -> None:
    async with (
        HoldingRelay(simulator.port, AFTER_FINISH, HOLD_S) as relay,
        gateway_and_client(etcd, cluster_name, relay.url) as (gw, client),
    ):
        finishes = await asyncio.gather(
            *(stream(client, f"finish-{i}", stop_at_finish=True) for i in range(STREAMS))
        )
        assert finishes == ["length"] * STREAMS
        await answered(gw)  # usage, [DONE] and the end reach the gateway
        assert client_gone(gw) == 0


async def test_a_client_that_leaves_mid_answer_is_client_gone(
    etcd: EtcdServer, cluster_name: str, slow_simulator: Proc
) -> None:
    async with gateway_and_client(etcd, cluster_name, slow_simulator.url) as (gw, client):
        answer = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "a long one"}],
            max_tokens=200,  # ten seconds at 20 tokens/s
            stream=True,
            extra_headers={"x-session-id": "leaves"},
        )
        async with answer:
            pieces = 0
            async for chunk in answer:
                pieces += 1 if chunk.choices and chunk.choices[0].delta.content else 0
                if pieces == 2:
                    break

        async def counted() -> bool:
            return sample(gw, "tectonic_gateway_requests_total", code="200") == 1

        # The answer is counted once the next token's write finds the client gone.
        await until(counted, within=30, what="the answer counted")
        assert client_gone(gw) == 1


async def test_a_stream_cut_mid_way_counts_as_a_failure(
    etcd: EtcdServer, cluster_name: str, slow_simulator: Proc
) -> None:
    async with gateway_and_client(etcd, cluster_name, slow_simulator.url) as (gw, client):
        answer = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "go"}],
            max_tokens=200,
            stream=True,
            extra_headers={"x-session-id": "cut"},
        )
        pieces = 0
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            async for chunk in answer:
                pieces += 1 if chunk.choices and chunk.choices[0].delta.content else 0
                if pieces == 3:
                    await asyncio.to_thread(slow_simulator.kill)
        assert sample(gw, "tectonic_gateway_errors_total", kind="stream_broken") == 1
        assert sample(gw, "tectonic_gateway_requests_total", code="502") == 1
        assert sample(gw, "tectonic_gateway_requests_total", code="200") == 0
        assert client_gone(gw) == 0
