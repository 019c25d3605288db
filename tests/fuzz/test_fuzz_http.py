"""Property-based fuzzing of every HTTP endpoint (issue 8, item 5): the gateway's, the
control plane's HTTP API and the simulator's (which speaks vLLM's API).

Three in-process gateways on a real etcd, in front of one simulator process: ``east``
undegraded, ``west`` with every gateway actuator on (context cap in truncate mode,
``parallel_tool_calls`` off, shedding below priority -5) and ``central`` with the cap in
reject mode, so that fuzzed bodies also go through the actuators. Requests are written
byte for byte on a raw socket (``exchange``): bodies from the real request shapes,
mutated, random JSON of every type (huge numbers, NaN, lone surrogates, deep nesting),
invalid UTF-8, oversized ones; random session and priority headers; random methods,
paths and query strings. Properties:

* the server answers (no connection reset, no hang), and never a 5xx of its own: a 5xx
  is only 502/503/504 (an upstream condition), never 500;
* a refused request gets a 4xx with a JSON error body that says what is wrong (vLLM's
  ``{"error": {"message": ...}}`` for the gateway and the simulator, ``{"detail": ...}``
  for the control plane's API);
* the server keeps serving: a good request right after is answered 200.

The raw client and these checks are in ``http_harness.py``, the strategies in
``http_strategies.py``; the deployment is this module's fixture, shared by all its
tests (module scope: one start of the simulator, the control plane and the gateways).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulator, until
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import DegradationRecord, FeatureFlags
from controlplane.kernel.store.etcd import EtcdStore
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayServer
from tests.fuzz.http_harness import (
    UPSTREAM_5XX,
    _error_message,
    clean,
    exchange,
    request_bytes,
    still_serving,
)
from tests.fuzz.http_strategies import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    GOOD_COMPLETION,
    HUGE_INTS,
    MODEL,
    PRINTABLE,
    _dumps,
    gateway_headers,
    json_body,
    query_string,
)
from tests.integration.cp_harness import fast_topology, running_gateway, running_replica

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

MAX_MODEL_LEN = 512  # the simulator's: a long generation is refused, not waited for
# aiohttp's HTTP parser answers a longer request line itself (400, plain text): the
# request never reaches the application, so its error shape is not the API's.
PARSER_LINE_LIMIT = 8190
GATEWAYS = ("east", "west", "central")
FLAGS = {
    "west": FeatureFlags(
        max_context_tokens=64,
        context_cap_mode="truncate",
        parallel_tool_calls=False,
        shed_priority_below=-5,
    ),
    "central": FeatureFlags(max_context_tokens=64, context_cap_mode="reject"),
}


# ---- the deployment -------------------------------------------------------------------------


@dataclass
class Deployment:
    sim: Proc
    gateways: dict[str, GatewayServer]
    cp_http_port: int

    @property
    def sim_port(self) -> int:
        return self.sim.port


@pytest.fixture(scope="module")
def simulator() -> Iterator[Proc]:
    proc = start_simulator(
        extra_args=[
            "--decode-tokens-per-s",
            "100000",
            "--prefill-tokens-per-s",
            "10000000",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--max-num-seqs",
            "64",
        ]
    )
    try:
        yield proc
    finally:
        proc.kill()


def _topology(etcd: EtcdServer, cluster: str, sim_url: str) -> Topology:
    data = fast_topology(etcd.endpoints, cluster).model_dump(mode="json")
    for r in data["regions"]:
        if r["name"] in GATEWAYS:
            r["replicas"] = [sim_url]
    return parse_topology(data)


@pytest.fixture(scope="module")
async def deployment(etcd: EtcdServer, simulator: Proc) -> AsyncIterator[Deployment]:
    cluster = f"fuzz-{secrets.token_hex(4)}"
    topology = _topology(etcd, cluster, simulator.url)
    keys = Keys(cluster)
    store = EtcdStore(topology.etcd)
    await store.connect()
    async with contextlib.AsyncExitStack() as stack:
        cp = await stack.enter_async_context(running_replica(topology, http_listen="127.0.0.1:0"))
        gateways = {
            home: await stack.enter_async_context(running_gateway(topology, home))
            for home in GATEWAYS
        }
        for region, flags in FLAGS.items():
            record = DegradationRecord(region=region, flags=flags, reason="fuzz", epoch=1)
            await store.put(keys.degradation(region), encode(record))

        async def degraded() -> bool:
            return all(gateways[r].degradation.flags(r) == f for r, f in FLAGS.items())

        await until(degraded, within=10, what="the gateways seeing their degradation")
        try:
            yield Deployment(simulator, gateways, cp.replica.http_port)
        finally:
            await store.close()


FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ---- the gateway ----------------------------------------------------------------------------


@FUZZ
@given(
    home=st.sampled_from(GATEWAYS),
    path=st.sampled_from([COMPLETIONS_PATH, CHAT_PATH]),
    headers=gateway_headers(),
    data=st.data(),
)
async def test_gateway_refuses_bad_bodies_and_headers_cleanly(
    deployment: Deployment,
    home: str,
    path: str,
    headers: list[tuple[str, bytes]],
    data: st.DataObject,
) -> None:
    body = data.draw(json_body(path), label="body")
    port = deployment.gateways[home].port
    answer = await exchange(port, request_bytes("POST", path, headers, body))
    clean(answer, f"gateway {home} POST {path}")
    await still_serving(port)


# Requests that once got a 500, pinned (a run of the fuzzing may not draw them).
PINNED = [
    pytest.param(
        b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        (),
        id="deep-nesting",
    ),
    pytest.param(
        b'{"model": "tiny", "prompt": "\\ud800 hi", "max_tokens": 1}', (), id="lone-surrogate"
    ),
    pytest.param(b'{"model": "tiny", "prompt": "\xff\xfe"}', (), id="invalid-utf8"),
    pytest.param(
        _dumps(GOOD_COMPLETION), (("Content-Encoding", b"gzip"),), id="content-encoding-lie"
    ),
]


@pytest.mark.parametrize(("body", "headers"), PINNED)
@pytest.mark.parametrize("target", ["gateway", "simulator"])
async def test_pinned_requests_get_400(
    deployment: Deployment, target: str, body: bytes, headers: tuple[tuple[str, bytes], ...]
) -> None:
    port = deployment.gateways["east"].port if target == "gateway" else deployment.sim_port
    answer = await exchange(port, request_bytes("POST", COMPLETIONS_PATH, headers, body))
    clean(answer, f"{target}: {body[:40]!r}")
    assert answer.status == 400, (answer.status, answer.body[:200])
    await still_serving(port)


@settings(FUZZ, max_examples=40)
@given(
    home=st.sampled_from(GATEWAYS),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
    path=st.sampled_from(
        [
            "/v1/models",
            "/health",
            "/metrics",
            "/v1/completions",
            "/v1/chat/completions",
            "/",
            "/v1",
            "/v1/models/tiny",
            "/admin",
            "/v1/completions/",
            "/%2e%2e/etc/passwd",
            "/v1/%ff",
            "/tokenize",
            "/detokenize",
        ]
    ),
    query=query_string(["model", "stream", "user"]),
)
async def test_gateway_answers_any_method_and_path(
    deployment: Deployment, home: str, method: str, path: str, query: str
) -> None:
    """Known and unknown routes with any method: an answer (2xx, 4xx, or 503 while no
    replica serves), never a 500 or a dropped connection."""
    port = deployment.gateways[home].port
    body = b"" if method in ("GET", "HEAD", "OPTIONS", "DELETE") else _dumps(GOOD_COMPLETION)
    answer = await exchange(port, request_bytes(method, path + query, (), body))
    assert answer.status < 500 or answer.status in UPSTREAM_5XX, (answer.status, answer.body)
    await still_serving(port)


@pytest.mark.parametrize("home", GATEWAYS)
async def test_gateway_refuses_oversized_bodies_with_413(deployment: Deployment, home: str) -> None:
    gw = deployment.gateways[home]
    limit = gw.options.app.max_body_bytes
    assert limit == AppConfig(home=home).max_body_bytes
    # Announced too large: refused before a byte of it is read.
    head = request_bytes("POST", "/v1/completions", [("Content-Length", str(limit + 1).encode())])
    answer = await exchange(gw.port, head + b'{"model": "tiny"')
    assert answer.status == 413, answer
    assert "limit" in _error_message(answer)
    # Chunked, without a length: refused once it is read past the limit.
    chunk = b"x" * 65_536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(limit // len(chunk) + 2))
    raw = request_bytes("POST", "/v1/completions", [("Transfer-Encoding", b"chunked")])
    answer = await exchange(gw.port, raw + chunks + b"0\r\n\r\n")
    assert answer.status == 413, answer
    assert "limit" in _error_message(answer)
    # Just under the limit is read and judged on its content.
    body = b'{"model": "tiny", "max_tokens": 1, "prompt": "' + b"a" * (limit - 100) + b'"}'
    answer = await exchange(gw.port, request_bytes("POST", "/v1/completions", (), body))
    clean(answer, f"gateway {home}: a body just under the limit")
    assert answer.status != 413
    await still_serving(gw.port)


@settings(FUZZ, max_examples=40)
@given(
    home=st.sampled_from(GATEWAYS),
    header=st.sampled_from(
        [
            "x-session-id",
            "x-priority",
            "Content-Type",
            "Content-Encoding",
            "Expect",
            "Accept-Encoding",
            "X-Weird",
        ]
    ),
    value=st.binary(max_size=60).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
    | st.sampled_from([b"gzip", b"deflate", b"br", b"100-continue", b"a" * 9000]),
)
async def test_gateway_survives_protocol_level_garbage_in_headers(
    deployment: Deployment, home: str, header: str, value: bytes
) -> None:
    """Header values with control characters, non-ASCII bytes, a Content-Encoding the
    body does not have, an oversized header: an answer below 500 (the HTTP parser's own
    400 counts: it may not be JSON), never a dropped connection; the gateway serves on."""
    port = deployment.gateways[home].port
    raw = request_bytes("POST", "/v1/completions", [(header, value)], _dumps(GOOD_COMPLETION))
    answer = await exchange(port, raw)
    assert answer.status < 500 or answer.status in UPSTREAM_5XX, (answer.status, answer.body)
    await still_serving(port)


@pytest.mark.parametrize("target", ["gateway", "simulator"])
async def test_a_non_ascii_expect_header_is_refused_with_417(
    deployment: Deployment, target: str
) -> None:
    port = deployment.gateways["east"].port if target == "gateway" else deployment.sim_port
    raw = request_bytes("POST", "/v1/completions", [("Expect", b"\x80")], _dumps(GOOD_COMPLETION))
    answer = await exchange(port, raw)
    await still_serving(port)
    assert answer.status == 417, (answer.status, answer.body)


# ---- the control plane's HTTP API -----------------------------------------------------------

CP_PATHS = [
    "/v1/status",
    "/v1/history",
    "/v1/events",
    "/healthz",
    "/readyz",
    "/metrics",
    "/",
    "/docs",
    "/openapi.json",
    "/v1",
    "/v1/status/",
    "/v1/nope",
    "/%ff",
    "/v1/history/east",
]


@FUZZ
@given(
    method=st.sampled_from(["GET", "GET", "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"]),
    path=st.sampled_from(CP_PATHS),
    query=query_string(["region", "limit", "replay"]),
    last_event_id=st.none() | st.text(PRINTABLE, max_size=40) | st.integers().map(str),
)
async def test_control_plane_http_api_refuses_bad_queries_cleanly(
    deployment: Deployment, method: str, path: str, query: str, last_event_id: str | None
) -> None:
    port = deployment.cp_http_port
    headers = [] if last_event_id is None else [("Last-Event-ID", last_event_id.encode())]
    answer = await exchange(port, request_bytes(method, path + query, headers))
    what = f"control plane {method} {path}{query[:80]}"
    assert answer.status < 500 or answer.status == 503, f"{what}: {answer.status} {answer.body!r}"
    if answer.status >= 400 and method != "HEAD":
        message = _error_message(answer)
        assert len(message.strip()) >= 5, f"{what}: {answer.status} {message!r}"
        if answer.status == 503:  # etcd is up: only a full house of event streams
            assert "event streams" in message, f"{what}: {message}"
    ok = await exchange(port, request_bytes("GET", "/v1/status"))
    assert ok.status == 200, ok


async def test_control_plane_http_api_refuses_bodies_and_long_queries(
    deployment: Deployment,
) -> None:
    port = deployment.cp_http_port
    big = request_bytes("GET", "/v1/status", (), b"x" * (17 * 1024))
    answer = await exchange(port, big)
    assert answer.status == 413 and "at most" in _error_message(answer), answer
    answer = await exchange(port, request_bytes("GET", "/v1/history?region=" + "e" * 3000))
    assert answer.status == 414 and "at most" in _error_message(answer), answer
    chunked = request_bytes("POST", "/v1/status", [("Transfer-Encoding", b"chunked")])
    answer = await exchange(port, chunked + b"1\r\nx\r\n0\r\n\r\n")
    assert answer.status == 411 and _error_message(answer), answer


# ---- the simulator (vLLM's API) -------------------------------------------------------------


TOKEN_IDS = st.lists(st.integers() | HUGE_INTS, max_size=5).map(
    lambda ids: _dumps({"model": MODEL, "tokens": ids})
)


@FUZZ
@given(
    path=st.sampled_from([COMPLETIONS_PATH, CHAT_PATH, "/tokenize", "/detokenize"]),
    data=st.data(),
)
async def test_simulator_refuses_bad_bodies_like_vllm(
    deployment: Deployment, path: str, data: st.DataObject
) -> None:
    body = data.draw(json_body(path) | TOKEN_IDS, label="body")
    port = deployment.sim_port
    headers = [("Content-Type", b"application/json")]
    answer = await exchange(port, request_bytes("POST", path, headers, body))
    assert answer.status in (200, 400, 404, 422), (
        f"simulator {path}: {answer.status} {answer.body!r}"
    )
    if answer.status >= 400:
        assert len(_error_message(answer).strip()) >= 5, answer
    await still_serving(port)


@settings(FUZZ, max_examples=40)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    path=st.sampled_from(
        [
            "/health",
            "/ping",
            "/version",
            "/v1/models",
            "/metrics",
            "/is_sleeping",
            "/reset_prefix_cache",
            "/sleep",
            "/wake_up",
            "/nope",
            "/v1/completions",
            "/_sim/fault",
        ]
    ),
    query=query_string(["level", "mode", "tags", "reset_running_requests", "reset_external"]),
)
async def test_simulator_answers_any_route_and_query(
    deployment: Deployment, method: str, path: str, query: str
) -> None:
    """Admin queries (``/sleep?level=``...) and wrong methods: 2xx or a 4xx with a JSON
    error, never a 500. Sleep is undone after each example (a wake-up), and
    ``/_sim/fault`` only ever gets a GET or DELETE here (a POST would inject faults)."""
    if path == "/_sim/fault" and method in ("POST", "PUT"):
        method = "GET"
    port = deployment.sim_port
    body = b"" if method in ("GET", "DELETE") else b"{}"
    answer = await exchange(port, request_bytes(method, path + query, (), body))
    assert answer.status < 500, f"simulator {method} {path}{query}: {answer.status} {answer.body!r}"
    if answer.status >= 400 and len(path + query) < PARSER_LINE_LIMIT:
        assert len(_error_message(answer).strip()) >= 5, answer
    woke = await exchange(port, request_bytes("POST", "/wake_up", (), b""))
    assert woke.status == 200, woke
    await still_serving(port)
