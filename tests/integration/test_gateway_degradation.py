"""The gateway's degradation actuators on a real etcd: a ``DegradationRecord`` written
to ``degradation/<region>`` reaches an in-process gateway through its watch, and the
requests that region serves change accordingly.

* Context cap (step 2) in front of a simulator (``--max-model-len 32768``): a ~20K-token
  chat is served without a record, refused with 400 under a 16K cap in ``reject``
  mode, and answered with fewer prompt tokens than the cap in ``truncate`` mode.
* ``parallel_tool_calls`` off (step 3) in front of a recording upstream: it sees
  ``parallel_tool_calls: false`` while the flag is off, and the client's own bytes
  once the record is gone.
* Shedding: a low ``x-priority`` gets 503 with ``Retry-After``; a high one is served.

No control plane runs: nothing else writes ``degradation/`` here, and with no
``routing/`` key each region serves itself.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager

import aiohttp
import pytest
from aiohttp import web

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators, until
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import DegradationRecord, FeatureFlags
from controlplane.kernel.store.etcd import EtcdStore
from regions.gateway.server import GatewayServer
from tests.integration.cp_harness import fast_topology, running_gateway

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
SIM_REGION, TOOLS_REGION = "east", "west"
CAP = 16384
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


# ---- upstreams and the gateway ----------------------------------------------------------


@pytest.fixture(scope="module")
def simulator() -> Iterator[Proc]:
    # A 32K context, so a 20K prompt is served when the region is not degraded; fast
    # prefill, so 20K tokens cost the test little.
    args = ("--max-model-len", "32768", "--prefill-tokens-per-s", "1000000")
    [sim] = start_simulators(1, extra_args=args)
    try:
        yield sim
    finally:
        sim.kill()


class Recorder:
    """A minimal OpenAI-style upstream that keeps every body it receives."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.url = ""

    async def chat(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        answer = {
            "id": "chatcmpl-rec",
            "object": "chat.completion",
            "model": "tiny",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        return web.json_response(answer)


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    rec = Recorder()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", rec.chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rec.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield rec
    finally:
        await runner.cleanup()


def topology(etcd: EtcdServer, cluster: str, replicas: dict[str, str]) -> Topology:
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    data["regions"] = [
        {**r, "replicas": [replicas[r["name"]]]} for r in data["regions"] if r["name"] in replicas
    ]
    return parse_topology(data)


def gateway(topo: Topology, home: str) -> AbstractAsyncContextManager[GatewayServer]:
    return running_gateway(topo, home, prefix_tracking=False)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


async def degrade(
    store: EtcdStore, keys: Keys, gw: GatewayServer, region: str, flags: FeatureFlags | None
) -> None:
    """Write (or, with None, delete) the region's record and wait until the gateway's
    watch has it."""
    if flags is None:
        await store.delete(keys.degradation(region))
        expected = FeatureFlags()
    else:
        record = DegradationRecord(region=region, flags=flags, reason="test", epoch=1)
        await store.put(keys.degradation(region), encode(record))
        expected = flags

    async def seen() -> bool:
        return gw.degradation.flags(region) == expected

    await until(seen, within=10, what=f"the gateway seeing degradation/{region}")


async def post(
    http: aiohttp.ClientSession,
    gw: GatewayServer,
    body: dict[str, object],
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, object], dict[str, str]]:
    async with http.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
        return r.status, await r.json(), dict(r.headers)


def long_chat(turns: int, tokens_per_turn: int) -> list[dict[str, object]]:
    """A system prompt, ``turns`` long user/assistant turns, a short last question. The
    simulator cuts text into 4-character pieces, so ``abcd`` is one token there and in
    the gateway's estimate alike."""
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"turn {i} " + "abcd" * tokens_per_turn})
        messages.append({"role": "assistant", "content": f"noted {i}"})
    messages.append({"role": "user", "content": "So what now?"})
    return messages


def prompt_tokens(answer: dict[str, object]) -> int:
    usage = answer["usage"]
    assert isinstance(usage, dict)
    return int(usage["prompt_tokens"])


# ---- step 2: the context cap ------------------------------------------------------------


async def test_a_20k_token_chat_is_rejected_or_truncated_while_the_context_is_capped(
    etcd: EtcdServer,
    cluster_name: str,
    etcd_store: EtcdStore,
    keys: Keys,
    simulator: Proc,
    http: aiohttp.ClientSession,
) -> None:
    topo = topology(etcd, cluster_name, {SIM_REGION: simulator.url})
    body: dict[str, object] = {"model": "tiny", "messages": long_chat(4, 5000), "max_tokens": 2}
    async with gateway(topo, SIM_REGION) as gw:
        status, answer, headers = await post(http, gw, body)  # nothing degraded: served
        assert status == 200, answer
        assert headers["x-tectonic-region"] == SIM_REGION
        full = prompt_tokens(answer)
        assert 20_000 < full < 32_768

        await degrade(etcd_store, keys, gw, SIM_REGION, FeatureFlags(max_context_tokens=CAP))
        status, answer, _ = await post(http, gw, body)
        assert status == 400
        error = answer["error"]
        assert isinstance(error, dict)
        assert error["type"] == "BadRequestError" and error["code"] == 400
        assert error["param"] == "messages"
        message = str(error["message"])
        assert f"{SIM_REGION} is degraded" in message and f"{CAP} tokens" in message
        assert "Shorten the conversation" in message

        truncate = FeatureFlags(max_context_tokens=CAP, context_cap_mode="truncate")
        await degrade(etcd_store, keys, gw, SIM_REGION, truncate)
        status, answer, _ = await post(http, gw, body)
        assert status == 200, answer
        assert prompt_tokens(answer) < CAP < full  # the oldest turn was dropped upstream

        await degrade(etcd_store, keys, gw, SIM_REGION, None)  # recovered
        status, answer, _ = await post(http, gw, body)
        assert status == 200 and prompt_tokens(answer) == full

        page = (await (await http.get(gw.url + "/metrics")).read()).decode()
        for action in ("context_rejected", "context_truncated"):
            line = f'tectonic_gateway_degraded_total{{action="{action}",region="{SIM_REGION}"}} 1.0'
            assert line in page


# ---- step 3: parallel tool calls off ----------------------------------------------------


async def test_parallel_tool_calls_is_false_upstream_while_the_flag_is_off(
    etcd: EtcdServer,
    cluster_name: str,
    etcd_store: EtcdStore,
    keys: Keys,
    recorder: Recorder,
    http: aiohttp.ClientSession,
) -> None:
    topo = topology(etcd, cluster_name, {TOOLS_REGION: recorder.url})
    raw = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "weather in Zürich?"}],
            "tools": TOOLS,
            "parallel_tool_calls": True,
        }
    ).encode()
    headers = {"Content-Type": "application/json"}
    async with gateway(topo, TOOLS_REGION) as gw:
        await degrade(etcd_store, keys, gw, TOOLS_REGION, FeatureFlags(parallel_tool_calls=False))
        async with http.post(gw.url + "/v1/chat/completions", data=raw, headers=headers) as r:
            assert r.status == 200, await r.text()
        upstream = json.loads(recorder.bodies[-1])
        assert upstream["parallel_tool_calls"] is False
        assert upstream["tools"] == TOOLS and upstream["messages"] == json.loads(raw)["messages"]

        await degrade(etcd_store, keys, gw, TOOLS_REGION, None)
        async with http.post(gw.url + "/v1/chat/completions", data=raw, headers=headers) as r:
            assert r.status == 200, await r.text()
        assert recorder.bodies[-1] == raw  # the client's bytes, untouched


# ---- shedding ---------------------------------------------------------------------------


async def test_low_priority_requests_are_shed_while_headroom_is_short(
    etcd: EtcdServer,
    cluster_name: str,
    etcd_store: EtcdStore,
    keys: Keys,
    recorder: Recorder,
    http: aiohttp.ClientSession,
) -> None:
    topo = topology(etcd, cluster_name, {TOOLS_REGION: recorder.url})
    body: dict[str, object] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    async with gateway(topo, TOOLS_REGION) as gw:
        await degrade(etcd_store, keys, gw, TOOLS_REGION, FeatureFlags(shed_priority_below=1))
        status, answer, headers = await post(http, gw, body)  # no header: priority 0
        assert status == 503 and "Retry-After" in headers
        error = answer["error"]
        assert isinstance(error, dict) and "shedding" in str(error["message"])
        assert recorder.bodies == []  # never reached the region
        status, _, _ = await post(http, gw, body, {"x-priority": "1"})
        assert status == 200 and len(recorder.bodies) == 1
