"""The gateway as a process, on a real etcd, in front of simulator processes.

Sessions stay on one region; two gateways agree on every session; after a real
failover (control plane + agents + simulators, the region's simulator killed) the
failed region's sessions move once and stay, also when it recovers; an etcd outage
costs nothing (served from the cache, reconciled after); the official ``openai``
client streams through it; malformed requests get 4xx and no serving region 503.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import openai
import pytest
import yaml
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import (
    Proc,
    launch_simulator,
    spawn,
    start_agent,
    start_controlplane,
    start_simulator,
    start_simulators,
    until,
    wait_ready,
)
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.resolve import SessionPin
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import Store
from controlplane.kernel.store.settings import EtcdConfig
from regions.pool.processes import free_port, read_ready

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

REGIONS = ("east", "west")
HALF = Routing(targets={"east": 0.5, "west": 0.5}, epoch=1)  # new east sessions split
SLOW = ("--decode-tokens-per-s", "20")  # a stream long enough to act on while in flight


# ---- deployment helpers ----------------------------------------------------------------


@dataclass
class Deployment:
    cluster: str
    topology: Path
    etcd_endpoints: tuple[str, ...]
    sims: dict[str, list[Proc]] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    def gateway(self, region: str, *args: str) -> Proc:
        proc = spawn(
            [
                "-m",
                "regions.gateway",
                "--topology",
                str(self.topology),
                "--region",
                region,
                "--listen",
                "127.0.0.1:0",
                "--etcd-timeout",
                "0.3",
                "--store-timeout",
                "0.5",
                "--retry-deadline",
                "2",
                *args,
            ],
            f"gw-{region}",
            stdout_pipe=True,
        )
        self.procs.append(proc)
        proc.url = read_ready(proc, time.monotonic() + 30)
        return proc


def write_topology(
    path: Path,
    cluster: str,
    endpoints: Sequence[str],
    replicas: dict[str, list[str]],
    agent_ports: dict[str, int] | None = None,
    **extra: object,
) -> Path:
    topo = {
        "cluster": cluster,
        "etcd": {"endpoints": list(endpoints)},
        "regions": [
            {
                "name": r,
                "zone": "us",
                "capacity_rps": 100,
                "replicas": urls,
                "agent": f"127.0.0.1:{(agent_ports or {}).get(r, 9)}",
            }
            for r, urls in replicas.items()
        ],
        **extra,
    }
    path.write_text(yaml.safe_dump(topo))
    return path


def deploy(
    tmp: Path,
    cluster: str,
    endpoints: Sequence[str],
    per_region: int = 2,
    sim_args: Sequence[str] = (),
) -> Deployment:
    sims = start_simulators(per_region * len(REGIONS), extra_args=sim_args)
    by_region = {r: sims[i * per_region : (i + 1) * per_region] for i, r in enumerate(REGIONS)}
    path = write_topology(
        tmp / "topology.yaml",
        cluster,
        endpoints,
        {r: [p.url for p in ps] for r, ps in by_region.items()},
    )
    return Deployment(cluster, path, tuple(endpoints), by_region, list(sims))


@pytest.fixture
def procs_cleanup() -> Iterator[list[Deployment]]:
    made: list[Deployment] = []
    yield made
    for d in made:
        for p in d.procs:
            p.kill()


@pytest.fixture
def deployment(
    etcd: EtcdServer, cluster_name: str, tmp_path: Path, procs_cleanup: list[Deployment]
) -> Deployment:
    d = deploy(tmp_path, cluster_name, etcd.endpoints)
    procs_cleanup.append(d)
    return d


@pytest.fixture
def slow_deployment(
    etcd: EtcdServer, cluster_name: str, tmp_path: Path, procs_cleanup: list[Deployment]
) -> Deployment:
    """One simulator per region, decoding 20 tokens per second."""
    d = deploy(tmp_path, cluster_name, etcd.endpoints, per_region=1, sim_args=SLOW)
    procs_cleanup.append(d)
    return d


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


# ---- request helpers -------------------------------------------------------------------


async def complete(
    http: aiohttp.ClientSession, gw: str, session: str, prompt: str = "hello there"
) -> tuple[int, str]:
    """One small completion for ``session``: (status, serving region)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2}
    async with http.post(
        gw + "/v1/completions", json=body, headers={"x-session-id": session}
    ) as resp:
        await resp.read()
        return resp.status, resp.headers.get("x-tectonic-region", "")


async def health(http: aiohttp.ClientSession, gw: str) -> dict[str, object]:
    async with http.get(gw + "/health") as resp:
        data: dict[str, object] = await resp.json()
        return data


async def metric(http: aiohttp.ClientSession, gw: str, name: str) -> float:
    """Sum of a metric's samples (all label sets) on the gateway's /metrics."""
    async with http.get(gw + "/metrics") as resp:
        text = await resp.text()
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


async def pin_of(store: Store, keys: Keys, session: str) -> SessionPin | None:
    kv = await store.get(keys.session(session))
    return decode(SessionPin, kv.value, kv.key) if kv else None


async def set_routing(store: Store, keys: Keys, region: str, routing: Routing) -> int:
    return await store.put(keys.routing(region), encode(routing))


async def gateway_at(http: aiohttp.ClientSession, gw: str, revision: int) -> None:
    async def seen() -> bool:
        return int(str((await health(http, gw))["routing_revision"])) >= revision

    await until(seen, within=20, what=f"gateway {gw} at routing revision {revision}")


# ---- tests -----------------------------------------------------------------------------


async def test_sessions_stay_on_one_region(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    rev = await set_routing(etcd_store, keys, "east", HALF)
    gw = await asyncio.to_thread(deployment.gateway, "east")
    await gateway_at(http, gw.url, rev)
    sessions = [f"stay-{i}" for i in range(24)]
    seen: dict[str, set[str]] = {s: set() for s in sessions}
    for round_ in range(5):
        results = await asyncio.gather(
            *(complete(http, gw.url, s, f"turn {round_} of {s}") for s in sessions)
        )
        for s, (status, region) in zip(sessions, results, strict=True):
            assert status == 200
            seen[s].add(region)
    assert all(len(regions) == 1 for regions in seen.values()), seen
    assert {r for regions in seen.values() for r in regions} == set(REGIONS)  # both used
    for s in sessions:
        pin = await pin_of(etcd_store, keys, s)
        assert pin is not None and {pin.region} == seen[s] and pin.home == "east"
    assert await metric(http, gw.url, "tectonic_gateway_consistency_violations_total") == 0
    assert await metric(http, gw.url, "tectonic_gateway_session_moves_total") == 0


async def test_session_key_falls_back_to_the_user_field(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    gw = await asyncio.to_thread(deployment.gateway, "west", "--session-header", "X-Conv")
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1, "user": "alice"}
    async with http.post(gw.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200 and resp.headers["x-tectonic-region"] == "west"
    async with http.post(
        gw.url + "/v1/completions", json=body, headers={"x-conv": "conv-7"}
    ) as resp:
        assert resp.status == 200
    assert (await pin_of(etcd_store, keys, "alice")) is not None
    assert (await pin_of(etcd_store, keys, "conv-7")) is not None  # the header wins


async def test_two_gateways_agree_on_every_session(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    rev = await set_routing(etcd_store, keys, "east", HALF)
    gws = await asyncio.gather(
        asyncio.to_thread(deployment.gateway, "east"),
        asyncio.to_thread(deployment.gateway, "west"),
    )
    for g in gws:
        await gateway_at(http, g.url, rev)
    sessions = [f"agree-{i}" for i in range(30)]
    # First requests race: both gateways see each new session at the same moment.
    first = await asyncio.gather(*(complete(http, g.url, s) for s in sessions for g in gws))
    later = await asyncio.gather(
        *(complete(http, gws[i % 2].url, s) for i, s in enumerate(sessions * 3))
    )
    served: dict[str, set[str]] = {s: set() for s in sessions}
    for s, (status, region) in zip([s for s in sessions for _ in gws], first, strict=True):
        assert status == 200
        served[s].add(region)
    for s, (status, region) in zip(sessions * 3, later, strict=True):
        assert status == 200
        served[s].add(region)
    for s in sessions:
        pin = await pin_of(etcd_store, keys, s)
        assert pin is not None and served[s] == {pin.region}, (s, served[s], pin)
    homes = {(await pin_of(etcd_store, keys, s)).home for s in sessions}  # type: ignore[union-attr]
    assert homes <= set(REGIONS)
    for g in gws:
        assert await metric(http, g.url, "tectonic_gateway_consistency_violations_total") == 0


async def test_no_region_serving_gets_503_with_retry_after(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys, http: aiohttp.ClientSession
) -> None:
    gw = await asyncio.to_thread(deployment.gateway, "east")
    assert (await complete(http, gw.url, "pinned-before"))[0] == 200
    await set_routing(etcd_store, keys, "east", Routing(targets={}, epoch=5))
    rev = await set_routing(etcd_store, keys, "west", Routing(targets={}, epoch=5))
    await gateway_at(http, gw.url, rev)
    for session in ("pinned-before", "brand-new"):
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
        async with http.post(
            gw.url + "/v1/completions", json=body, headers={"x-session-id": session}
        ) as resp:
            assert resp.status == 503
            assert int(resp.headers["Retry-After"]) >= 1
            err = (await resp.json())["error"]
            assert err["type"] == "ServiceUnavailableError" and err["message"]


async def test_malformed_requests_get_4xx_with_a_json_error(
    deployment: Deployment, http: aiohttp.ClientSession
) -> None:
    gw = await asyncio.to_thread(deployment.gateway, "east", "--max-body-bytes", "4096")
    chat = "/v1/chat/completions"
    cases: list[tuple[str, bytes, dict[str, str], int, str | None]] = [
        ("/v1/completions", b"{not json", {}, 400, None),
        ("/v1/completions", b"[1, 2]", {}, 400, None),
        ("/v1/completions", json.dumps({"prompt": "x"}).encode(), {}, 400, "model"),
        ("/v1/completions", json.dumps({"model": "tiny"}).encode(), {}, 400, "prompt"),
        ("/v1/completions", json.dumps({"model": "tiny", "prompt": 7}).encode(), {}, 400, "prompt"),
        (chat, json.dumps({"model": "tiny"}).encode(), {}, 400, "messages"),
        (chat, json.dumps({"model": "tiny", "messages": []}).encode(), {}, 400, "messages"),
        (chat, json.dumps({"model": "tiny", "messages": ["hi"]}).encode(), {}, 400, "messages"),
        (
            chat,
            json.dumps(
                {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}
            ).encode(),
            {},
            400,
            "stream",
        ),
        (
            "/v1/completions",
            json.dumps({"model": "tiny", "prompt": "x" * 5000}).encode(),
            {},
            413,
            None,
        ),
        (
            "/v1/completions",
            json.dumps({"model": "tiny", "prompt": "x"}).encode(),
            {"x-session-id": "a/b"},
            400,
            None,
        ),
    ]
    for path, body, headers, status, param in cases:
        async with http.post(
            gw.url + path, data=body, headers={"content-type": "application/json", **headers}
        ) as resp:
            assert resp.status == status, (path, body[:60], await resp.text())
            err = (await resp.json())["error"]
            assert err["message"] and err["code"] == status
            assert param is None or err["param"] == param, err
    # The replica's own 4xx passes through unchanged (here: an unknown model).
    async with http.post(
        gw.url + "/v1/completions",
        json={"model": "nope", "prompt": "x"},
        headers={"x-session-id": "s"},
    ) as resp:
        assert resp.status == 404 and resp.headers["x-tectonic-region"] == "east"
    assert await metric(http, gw.url, "tectonic_gateway_errors_total") >= len(cases)


async def test_routes_methods_expect_and_a_chunked_body_over_the_limit(
    deployment: Deployment, http: aiohttp.ClientSession
) -> None:
    """The gateway's own route table (aiohttp's low-level server, no router): unknown
    paths 404, a known path with another method 405 naming the allowed ones, HEAD on the
    GET routes, ``Expect`` answered, a chunked body bounded like a sized one."""
    gw = await asyncio.to_thread(deployment.gateway, "east", "--max-body-bytes", "4096")
    async with http.get(gw.url + "/v1/nothing") as resp:
        assert resp.status == 404
    async with http.get(gw.url + "/v1/completions") as resp:
        assert resp.status == 405 and resp.headers["Allow"] == "POST"
    async with http.post(gw.url + "/health") as resp:
        assert resp.status == 405 and set(resp.headers["Allow"].split(",")) == {"GET", "HEAD"}
    async with http.head(gw.url + "/health") as resp:
        assert resp.status == 200
    body = {"model": "tiny", "prompt": "expect me", "max_tokens": 1}
    async with http.post(
        gw.url + "/v1/completions", json=body, expect100=True, headers={"x-session-id": "e"}
    ) as resp:
        assert resp.status == 200 and (await resp.json())["choices"]
    async with http.post(
        gw.url + "/v1/completions", json=body, headers={"Expect": "sideways"}
    ) as resp:
        assert resp.status == 417 and "sideways" in (await resp.json())["error"]["message"]

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    async with http.post(gw.url + "/v1/completions", data=chunks()) as resp:
        assert resp.status == 413 and (await resp.json())["error"]["code"] == 413


async def test_failed_replicas_are_retried_on_another_before_the_first_byte(
    deployment: Deployment, http: aiohttp.ClientSession, etcd_store: EtcdStore, keys: Keys
) -> None:
    gw = await asyncio.to_thread(deployment.gateway, "east")
    first, second = deployment.sims["east"]
    async with http.post(first.url + "/_sim/fault", json={"unavailable_rate": 1.0}) as resp:
        assert resp.status == 200
    prompts = [f"prompt number {i} about something else" for i in range(24)]
    results = await asyncio.gather(
        *(complete(http, gw.url, f"retry-{i}", p) for i, p in enumerate(prompts))
    )
    assert results == [(200, "east")] * len(prompts)  # the 503s were retried on `second`
    assert await metric(http, gw.url, "tectonic_gateway_retries_total") >= 1

    async with http.delete(first.url + "/_sim/fault") as resp:
        assert resp.status == 200
    await asyncio.to_thread(second.kill)  # connection refused: retried on `first`
    results = await asyncio.gather(
        *(complete(http, gw.url, f"retry-{i}", p) for i, p in enumerate(prompts))
    )
    assert results == [(200, "east")] * len(prompts)

    # No replica of east answers now, and the control plane has not failed it over yet:
    # the request is not lost but sent to a serving region of the same zone, and its
    # session moves there for good (pinned in etcd, so other gateways agree).
    await asyncio.to_thread(first.kill)
    status, region = await complete(http, gw.url, "retry-0")
    assert status == 200 and region in REGIONS and region != "east"
    pin = await pin_of(etcd_store, keys, "retry-0")
    assert pin is not None and pin.region == region and pin.moves >= 1
    assert await complete(http, gw.url, "retry-0") == (200, region)  # and stays
    assert await metric(http, gw.url, "tectonic_gateway_spills_total") >= 1


async def test_a_session_another_gateway_spilled_stays_moved_after_the_blip(
    deployment: Deployment, http: aiohttp.ClientSession, etcd_store: EtcdStore, keys: Keys
) -> None:
    """Gateway a spills a session off east (no replica answered); east comes back
    before the control plane ever failed it over. Gateway b had the session cached on
    east: a's notice (``session-moves/east``) makes it re-read the pin, so b serves it
    where a moved it, not in east again, and no consistency violation happens."""
    a = await asyncio.to_thread(deployment.gateway, "east")
    b = await asyncio.to_thread(deployment.gateway, "east")
    assert await complete(http, a.url, "blip") == (200, "east")
    assert await complete(http, b.url, "blip") == (200, "east")  # b caches the pin
    east = deployment.sims["east"]
    ports = [p.port for p in east]
    for p in east:
        await asyncio.to_thread(p.kill)
    status, moved_to = await complete(http, a.url, "blip")  # a spills it
    assert status == 200 and moved_to in REGIONS and moved_to != "east"
    pin = await pin_of(etcd_store, keys, "blip")
    assert pin is not None and pin.region == moved_to

    async def notified() -> bool:
        return await metric(http, b.url, "tectonic_gateway_session_move_notices_total") >= 1

    await until(notified, within=10, what="gateway b hearing a's notice")
    back = [await asyncio.to_thread(start_simulator, port=port) for port in ports]
    deployment.procs.extend(back)  # the blip is over: east answers again
    assert await complete(http, b.url, "blip") == (200, moved_to)
    assert await complete(http, a.url, "blip") == (200, moved_to)
    assert await complete(http, b.url, "a-new-one") == (200, "east")  # east serves again
    for gw in (a, b):
        assert await metric(http, gw.url, "tectonic_gateway_consistency_violations_total") == 0


async def test_a_stream_cut_after_the_first_byte_is_visible_when_continuation_is_off(
    slow_deployment: Deployment, http: aiohttp.ClientSession
) -> None:
    """With continuation on (the default) the stream goes on elsewhere
    (test_stream_continuation.py); a request that turns it off sees the cut, and no
    retry repeats what it already has."""
    gw = await asyncio.to_thread(slow_deployment.gateway, "east")
    east = slow_deployment.sims["east"][0]
    pieces: list[str] = []
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "go"}],
            max_tokens=200,
            stream=True,
            extra_headers={"x-session-id": "cut", "x-tectonic-continue": "off"},
        )
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                if len(pieces) == 3:
                    await asyncio.to_thread(east.kill)
    assert len(pieces) >= 3  # what arrived before the cut was delivered, and not repeated
    assert await metric(http, gw.url, "tectonic_gateway_retries_total") == 0
    assert await metric(http, gw.url, "tectonic_gateway_errors_total") == 1  # stream_broken


async def test_sigterm_lets_a_stream_in_flight_finish_then_exits_0(
    slow_deployment: Deployment, http: aiohttp.ClientSession
) -> None:
    gw = await asyncio.to_thread(slow_deployment.gateway, "east")
    body = {
        "model": "tiny",
        "prompt": "a long answer please",
        "max_tokens": 20,  # about a second at 20 tokens/s
        "stream": True,
    }
    events: list[bytes] = []
    async with http.post(
        gw.url + "/v1/completions", json=body, headers={"x-session-id": "term"}
    ) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(line)
                if len(events) == 1:
                    gw.popen.send_signal(signal.SIGTERM)
    assert events[-1].strip() == b"data: [DONE]" and len(events) == 21
    assert await asyncio.to_thread(gw.popen.wait, 10) == 0
    with pytest.raises(aiohttp.ClientConnectionError):
        await complete(http, gw.url, "term")


async def test_streaming_and_not_with_the_official_openai_client(
    deployment: Deployment, etcd_store: EtcdStore, keys: Keys
) -> None:
    gw = await asyncio.to_thread(deployment.gateway, "west")
    headers = {"x-session-id": "openai-1"}
    async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["tiny"]
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "tell me a story"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
        )
        pieces: list[str] = []
        usage = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        assert len(pieces) >= 2 and "".join(pieces).strip()
        assert usage is not None and usage.completion_tokens == 12
        raw = await client.completions.with_raw_response.create(
            model="tiny", prompt="once upon a time", max_tokens=5, extra_headers=headers
        )
        assert raw.headers["x-tectonic-region"] == "west"
        completion = raw.parse()
        assert completion.choices[0].text and completion.usage is not None
        text_stream = await client.completions.create(
            model="tiny", prompt="count:", max_tokens=6, stream=True, extra_headers=headers
        )
        assert "".join([c.choices[0].text async for c in text_stream if c.choices])
    pin = await pin_of(etcd_store, keys, "openai-1")
    assert pin is not None and pin.region == "west"


async def test_gateway_survives_an_etcd_outage_and_reconciles(
    tmp_path: Path,
    cluster_name: str,
    procs_cleanup: list[Deployment],
    http: aiohttp.ClientSession,
) -> None:
    server = EtcdServer()
    await asyncio.to_thread(server.start)
    keys = Keys(cluster_name)
    try:
        d = await asyncio.to_thread(deploy, tmp_path, cluster_name, (server.endpoint,), 1)
        procs_cleanup.append(d)
        async with EtcdStore(EtcdConfig(endpoints=(server.endpoint,))) as store:
            rev = await set_routing(store, keys, "east", HALF)
        gw = await asyncio.to_thread(d.gateway, "east")
        await gateway_at(http, gw.url, rev)
        before = [f"old-{i}" for i in range(12)]
        regions = dict(
            zip(
                before,
                [r for _, r in await asyncio.gather(*(complete(http, gw.url, s) for s in before))],
                strict=True,
            )
        )

        await asyncio.to_thread(server.kill)
        during = [f"new-{i}" for i in range(12)]
        answers: list[tuple[str, tuple[int, str]]] = []
        for round_ in range(3):  # old and new sessions, several times each, all answered
            for s in before + during:
                answers.append((s, await complete(http, gw.url, s, f"round {round_}")))
        assert all(status == 200 for _, (status, _) in answers), answers
        for s, (_, region) in answers:
            regions.setdefault(s, region)
            assert regions[s] == region, (s, region)
        h = await health(http, gw.url)
        assert h["store_up"] is False and h["pending_pins"] == len(during)

        await asyncio.to_thread(server.restart)

        async def reconciled() -> bool:
            h = await health(http, gw.url)
            return h["store_up"] is True and h["pending_pins"] == 0

        await until(reconciled, within=30, every=0.1, what="pending pins written to etcd")
        async with EtcdStore(EtcdConfig(endpoints=(server.endpoint,))) as store:
            for s in before + during:
                pin = await pin_of(store, keys, s)
                assert pin is not None and pin.region == regions[s], (s, pin)
        after = await asyncio.gather(*(complete(http, gw.url, s) for s in before + during))
        assert [r for _, r in after] == [regions[s] for s in before + during]
        assert await metric(http, gw.url, "tectonic_gateway_session_moves_total") == 0
        assert await metric(http, gw.url, "tectonic_gateway_consistency_violations_total") == 0
    finally:
        await asyncio.to_thread(server.stop)


# ---- failover with the real control plane ----------------------------------------------


@dataclass
class Region:
    sim: Proc
    port: int


@pytest.fixture
def failover_deployment(
    etcd: EtcdServer, cluster_name: str, tmp_path: Path, procs_cleanup: list[Deployment]
) -> Iterator[tuple[Deployment, dict[str, Region], str]]:
    """One simulator, one agent per region, one control-plane replica; fast timings and
    fast graduated recovery. Yields the deployment, the regions, the control plane."""
    agent_ports = {r: free_port() for r in REGIONS}
    cp_port = free_port()
    sims = start_simulators(len(REGIONS))
    regions = {r: Region(s, s.port) for r, s in zip(REGIONS, sims, strict=True)}
    path = write_topology(
        tmp_path / "topology.yaml",
        cluster_name,
        etcd.endpoints,
        {r: [regions[r].sim.url] for r in REGIONS},
        agent_ports,
        timing={
            "probe_interval_s": 0.3,
            "failure_threshold": 3,
            "success_threshold": 2,
            "report_stale_s": 1.2,
            "quorum": 2,
            "loop_period_s": 0.3,
            "retry_timeout_s": 0.5,
            "lease_ttl_s": 2,
            "recovery_dwell_s": 1.0,
            "failover_cooldown_s": 600,
        },
        recovery={"step_percent": 50, "step_interval_s": 0.3},
    )
    d = Deployment(
        cluster_name, path, etcd.endpoints, {r: [regions[r].sim] for r in REGIONS}, list(sims)
    )
    procs_cleanup.append(d)
    cp_target = f"127.0.0.1:{cp_port}"
    for r in REGIONS:
        d.procs.append(
            start_agent(
                region=r,
                control_planes=[cp_target],
                replicas=[regions[r].sim.url],
                interval=0.3,
                timeout=0.25,
                listen=f"127.0.0.1:{agent_ports[r]}",
            )
        )
    d.procs.append(start_controlplane(path, "cp-1", listen=cp_target))
    yield d, regions, cp_target


async def _status(target: str) -> pb.StatusResponse:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = pb_grpc.ControlPlaneStub(ch)  # type: ignore[no-untyped-call]
        status: pb.StatusResponse = await stub.GetStatus(pb.GetStatusRequest(), timeout=2)
        return status


async def test_failover_moves_the_failed_regions_sessions_once_and_they_stay(
    failover_deployment: tuple[Deployment, dict[str, Region], str],
    etcd_store: EtcdStore,
    keys: Keys,
    http: aiohttp.ClientSession,
) -> None:
    d, regions, cp = failover_deployment

    async def all_healthy() -> bool:
        st = await _status(cp)
        return bool(st.leader) and all(r.health == pb.HEALTHY for r in st.regions)

    await until(all_healthy, within=30, every=0.1, what="every region HEALTHY under a leader")
    report = ("--control-plane", cp, "--report-interval", "0.2")
    gws = await asyncio.gather(
        asyncio.to_thread(d.gateway, "east", *report), asyncio.to_thread(d.gateway, "west", *report)
    )
    east_gw = gws[0]
    sessions = [f"fo-{i}" for i in range(16)]

    async def gateway_voted() -> bool:  # what its requests saw, as a GATEWAY observer
        for s in sessions:
            assert await complete(http, east_gw.url, s) == (200, "east")
        east = next(r for r in (await _status(cp)).regions if r.name == "east")
        return any(o.startswith("gateway:east:") and v == "HEALTHY" for o, v in east.votes.items())

    await until(gateway_voted, within=20, every=0.1, what="the gateway's vote on east")

    await asyncio.to_thread(regions["east"].sim.kill)  # the region's only vLLM server dies

    async def routed_away() -> bool:
        kv = await etcd_store.get(keys.routing("east"))
        return kv is not None and decode(Routing, kv.value).targets.get("east", 0) == 0

    await until(routed_away, within=30, every=0.1, what="routing/east sends traffic away")
    kv = await etcd_store.get(keys.routing("east"))
    assert kv is not None
    for g in gws:
        await gateway_at(http, g.url, kv.mod_revision)
    for round_ in range(3):  # through both gateways, every answer from west
        results = await asyncio.gather(
            *(complete(http, gws[(i + round_) % 2].url, s) for i, s in enumerate(sessions))
        )
        assert results == [(200, "west")] * len(sessions), results
    for s in sessions:
        pin = await pin_of(etcd_store, keys, s)
        assert pin is not None and (pin.home, pin.region, pin.moves) == ("east", "west", 1)

    # East comes back and recovers in steps; the moved sessions never bounce back.
    sim = launch_simulator(port=regions["east"].port, name="sim-east-again")
    d.procs.append(sim)
    await asyncio.to_thread(wait_ready, sim)

    async def recovered() -> bool:
        kv = await etcd_store.get(keys.routing("east"))
        return kv is None or decode(Routing, kv.value).targets.get("east", 0) >= 1.0

    await until(recovered, within=45, every=0.2, what="east fully recovered")
    kv = await etcd_store.get(keys.routing("east"))
    for g in gws:
        await gateway_at(http, g.url, kv.mod_revision if kv else 0)
    results = await asyncio.gather(*(complete(http, g.url, s) for s in sessions for g in gws))
    assert results == [(200, "west")] * len(results)
    for s in sessions:
        pin = await pin_of(etcd_store, keys, s)
        assert pin is not None and (pin.region, pin.moves) == ("west", 1)
    assert await complete(http, east_gw.url, "fo-new-after-recovery") == (200, "east")
    for g in gws:
        assert await metric(http, g.url, "tectonic_gateway_consistency_violations_total") == 0
