"""Scale to zero through a real Envoy (the shipped deploy/envoy/envoy.yaml, rendered by
the lab): a request for a pool at zero is held by the endpoint picker while the pool
wakes, for longer than Envoy's ext_proc ``message_timeout`` (1 s), and then forwarded to
the woken replica. The picker asks Envoy for the time (``override_message_timeout``,
allowed by the filter's ``max_message_timeout``) before it holds; without that, Envoy
gives up on the exchange after 1 s and fails open: the request goes round robin to a
replica that may still be asleep, and the picker's hold is for nothing.

Real parts: etcd, a simulator (put to sleep, woken with vLLM's ``/wake_up``), the picker
(``PickerServer`` from ``tectonic-epp``'s own flags, in this process, to read its
metrics) and Envoy. The test plays the region agent and the leader: it waits for the
picker's ``wake/<region>`` request, takes ``WAKE_S`` (a sleep-mode wake on a GPU takes
seconds; the simulator's is instant), wakes the replica and publishes it ACTIVE in
``pools/<region>``, as the agent does.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from chaos.lab.envoy import EnvoyProc, EnvoySpec, start_envoy, stats
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators, until
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.pool.scale import WakeRequest
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from regions.picker.__main__ import parse_args
from regions.picker.server import PickerServer
from regions.pool.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.etcd, pytest.mark.timeout(120)]
REGION = "east"
WAKE_S = 3.0  # the wake, from the wake request to the replica published ACTIVE: > 1 s
EXT_PROC = "http.tectonic_inference.ext_proc."


def hp(port: int) -> str:
    return f"127.0.0.1:{port}"


def pool(active: tuple[str, ...], p95: float | None = None) -> PoolMembers:
    """What the agent publishes: at zero (asleep, nothing ACTIVE), or woken; ``p95``
    its measured wake time."""
    return PoolMembers(
        region=REGION,
        active=active,
        warm=0 if active else 1,
        at=time.time(),
        agent="agent:east@test",
        activation_p95_s=p95,
        asleep=not active,
    )


@dataclass
class World:
    store: EtcdStore
    keys: Keys
    picker: PickerServer
    envoy: EnvoyProc
    sim: Proc


@pytest.fixture(scope="module")
def simulator() -> Iterator[Proc]:
    [sim] = start_simulators(1)
    try:
        yield sim
    finally:
        sim.kill()


@pytest.fixture(scope="module")
async def world(
    etcd: EtcdServer, simulator: Proc, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    tmp = tmp_path_factory.mktemp("picker-wake")
    keys = Keys(cluster=f"epp-wake-{free_port()}")
    listen, admin, picker_port = free_port(), free_port(), free_port()
    topo = {
        "cluster": keys.cluster,
        "etcd": {"endpoints": list(etcd.endpoints)},
        "regions": [
            {
                "name": REGION,
                "zone": "us",
                "agent": hp(free_port()),
                "capacity_rps": 100,
                "replicas": [simulator.url],
                "entry": hp(listen),
            }
        ],
    }
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    store = EtcdStore(EtcdConfig(endpoints=etcd.endpoints, request_timeout_s=2.0))
    await store.connect()
    options, _ = parse_args(
        [
            "--topology", str(path), "--region", REGION, "--listen", hp(picker_port),
            "--no-prefix-tracking", "--wake-hold", "20", "--wake-hold-max", "20",
        ]
    )  # fmt: skip
    picker = PickerServer(options)
    await picker.start()
    envoy = None
    try:
        spec = EnvoySpec(
            listen_port=listen,
            admin_port=admin,
            pickers=[hp(picker_port)],
            servers=[hp(simulator.port)],  # the fail-open round robin's: the same replica
        )
        envoy = await asyncio.to_thread(start_envoy, spec, Path(tmp) / "envoy")
        yield World(store, keys, picker, envoy, simulator)
    finally:
        if envoy is not None:
            envoy.kill()
        await picker.stop()
        await store.close()


async def to_zero(w: World, p95: float | None = None) -> None:
    """The pool at zero: its replica asleep (vLLM's ``/sleep``), published with nothing
    ACTIVE and ``asleep``, and the picker has read it."""
    async with aiohttp.ClientSession() as http, http.post(f"{w.sim.url}/sleep?level=1") as r:
        assert r.status == 200, await r.text()
    await w.store.put(w.keys.pool(REGION), encode(pool((), p95)))

    async def read() -> bool:
        return w.picker.core.waker.at_zero(REGION) is not None

    await until(read, within=15, what=f"the picker reading pools/{REGION} at zero")


async def wake_slowly(w: World, http: aiohttp.ClientSession) -> tuple[WakeRequest, float]:
    """The agent and the leader: once the picker asked for the wake, take ``WAKE_S``,
    wake the replica and publish it ACTIVE. Returns the wake request and when (monotonic)
    the replica was published."""

    async def asked() -> bool:
        return await w.store.get(w.keys.wake(REGION)) is not None

    await until(asked, within=15, what=f"the picker's wake/{REGION}")
    kv = await w.store.get(w.keys.wake(REGION))
    assert kv is not None
    request = decode(WakeRequest, kv.value, kv.key)
    await asyncio.sleep(WAKE_S)
    async with http.post(f"{w.sim.url}/wake_up") as r:
        assert r.status == 200, await r.text()
    await w.store.put(w.keys.pool(REGION), encode(pool((w.sim.url,))))
    return request, time.monotonic()


async def test_a_request_is_held_through_a_wake_longer_than_the_message_timeout(
    world: World,
) -> None:
    await to_zero(world)  # no wake measured: held up to --wake-hold (20 s)
    before = await asyncio.to_thread(stats, world.envoy.admin_url)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        waking = asyncio.create_task(wake_slowly(world, http))
        sent = time.monotonic()
        status, headers, text = await complete(http, world)
        answered = time.monotonic()
        request, published = await waking
    grew = await counters(world, before)
    seen = {
        "status": status,
        # the picker answers the response headers with the region: its exchange lived on
        "region": headers.get("x-tectonic-region"),
        "failed_open": grew(EXT_PROC + "failure_mode_allowed"),
        "message_timeouts": grew(EXT_PROC + "message_timeouts"),
        "picked": grew("cluster.tectonic_picked.upstream_rq_total"),
        "round_robin": grew("cluster.tectonic_fallback.upstream_rq_total"),
        "extended": grew(EXT_PROC + "override_message_timeout_received"),
        "extension_ignored": grew(EXT_PROC + "override_message_timeout_ignored"),
    }
    expected = {
        "status": 200,
        "region": REGION,
        "failed_open": 0,
        "message_timeouts": 0,
        "picked": 1,
        "round_robin": 0,
        "extended": 1,
        "extension_ignored": 0,
    }
    assert seen == expected, (seen, text[:300], world.envoy.log(3000))
    assert request.by.startswith("picker"), request
    # held until the woken replica was published, well past the 1 s message_timeout
    assert answered > published and answered - sent > WAKE_S, (sent, published, answered)
    woken = f"127.0.0.1:{world.sim.port}"
    line = f"route=picked picked={woken} served={woken} attempts=1"

    async def logged() -> bool:  # Envoy's access log: sent where the picker said
        return line in world.envoy.log(20_000)

    await until(logged, within=10, what=f"Envoy's access log line {line!r}")
    text_metrics = await asyncio.to_thread(_metrics, world.picker.http_url)
    served = f'tectonic_picker_pool_wake_wait_seconds_count{{region="{REGION}",result="served"}}'
    assert f"{served} 1.0" in text_metrics, [
        line for line in text_metrics.splitlines() if "wake_wait_seconds_count" in line
    ]


async def test_a_wake_longer_than_the_hold_is_the_pickers_503_not_a_fail_open(
    world: World,
) -> None:
    # measured wakes of 0.5 s: held 0.5 + 5 s (wake.py's PATH_S), past Envoy's 1 s, and
    # nothing wakes the pool: the picker's refusal, through Envoy
    await to_zero(world, p95=0.5)
    before = await asyncio.to_thread(stats, world.envoy.admin_url)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        sent = time.monotonic()
        status, headers, text = await complete(http, world)
        answered = time.monotonic()
    grew = await counters(world, before)
    seen = {
        "status": status,
        "retry_after": headers.get("Retry-After"),
        "failed_open": grew(EXT_PROC + "failure_mode_allowed"),
        "message_timeouts": grew(EXT_PROC + "message_timeouts"),
        "upstream": grew("cluster.tectonic_picked.upstream_rq_total")
        + grew("cluster.tectonic_fallback.upstream_rq_total"),
        "extended": grew(EXT_PROC + "override_message_timeout_received"),
    }
    expected = {
        "status": 503,
        "retry_after": "1",  # the measured wake p95, rounded up
        "failed_open": 0,
        "message_timeouts": 0,
        "upstream": 0,
        "extended": 1,
    }
    assert seen == expected, (seen, text[:300], world.envoy.log(3000))
    assert "waking from zero" in json.loads(text)["error"]["message"], text
    assert answered - sent > 5.0, (sent, answered)  # the whole hold, not Envoy's 1 s


async def complete(http: aiohttp.ClientSession, w: World) -> tuple[int, dict[str, str], str]:
    """A chat completion through Envoy: its status, headers and body."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    async with http.post(
        f"{w.envoy.url}/v1/chat/completions",
        data=json.dumps(body),
        headers={"content-type": "application/json", "x-session-id": "s-wake"},
    ) as r:
        return r.status, dict(r.headers), await r.text()


async def counters(w: World, before: dict[str, int]) -> Callable[[str], int]:
    """How much each of Envoy's counters grew since ``before``."""
    after = await asyncio.to_thread(stats, w.envoy.admin_url)
    return lambda name: after.get(name, 0) - before.get(name, 0)


def _metrics(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        return str(resp.read().decode())
