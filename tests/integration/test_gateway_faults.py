"""The gateway as a process, on a real etcd, in front of simulator processes: faults.

Failed replicas are retried on another before the first byte (and, with none left, the
session spills to a serving region of the zone for good); a session another gateway
spilled stays moved after the blip; a stream cut after its first byte is visible when
continuation is off; SIGTERM lets a stream in flight finish; an etcd outage costs
nothing (served from the cache, reconciled after).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
import openai
import pytest

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import start_simulator, until
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from tests.integration.gateway_helpers import (
    HALF,
    REGIONS,
    Deployment,
    complete,
    deploy,
    deployment,
    gateway_at,
    health,
    http,
    metric,
    pin_of,
    procs_cleanup,
    set_routing,
)

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

# The harness's fixtures (gateway_helpers.py), imported for pytest to find them by name.
FIXTURES = (deployment, http, procs_cleanup)

SLOW = ("--decode-tokens-per-s", "20")  # a stream long enough to act on while in flight


@pytest.fixture
def slow_deployment(
    etcd: EtcdServer, cluster_name: str, tmp_path: Path, procs_cleanup: list[Deployment]
) -> Deployment:
    """One simulator per region, decoding 20 tokens per second."""
    d = deploy(tmp_path, cluster_name, etcd.endpoints, per_region=1, sim_args=SLOW)
    procs_cleanup.append(d)
    return d


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
