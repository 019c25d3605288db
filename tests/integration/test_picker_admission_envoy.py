"""Admission control in the endpoint picker, behind a real Envoy (the shipped
deploy/envoy/envoy.yaml, rendered by the lab), on a real etcd and a real simulator:
the per-replica bound comes from the measured capacity in ``capacity/<region>`` (and
goes when the record is stale or has no in-flight figures); over the limit a request
waits at most --admission-max-wait, then Envoy answers the picker's 429 with
Retry-After; batch is refused before interactive; a slot frees when the stream ends.

The picker runs in this process (``PickerServer`` from ``tectonic-epp``'s own flags) so
that the test can wait on its limiter's counts. The simulator decodes 10 tokens/s: a
streamed answer of N tokens holds its slot about N / 10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from chaos.lab.envoy import EnvoySpec, start_envoy
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulators, until
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import (
    CapacityRecord,
    HitProbe,
    ProbeStep,
    WorkloadProfile,
)
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from regions.dataplane.admission_gate import AdmissionGates, RegionGate
from regions.dataplane.admission_limit import Priority
from regions.picker.__main__ import parse_args
from regions.picker.server import PickerServer
from regions.pool.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.etcd]
REGION = "east"
MAX_WAIT_S = 0.8  # under the shipped Envoy's 1 s ext_proc message_timeout


def hp(port: int) -> str:
    return f"127.0.0.1:{port}"


def capacity(*, inflight: float | None, measured_at: float) -> CapacityRecord:
    """One replica bearing 4 rps, a request holding its slot 0.5 s there: 2 in flight."""
    steps = tuple(
        ProbeStep(
            offered_rps=rps,
            p99_ttft_s=0.1 * rps,
            error_rate=0.0,
            throughput_rps=rps,
            mean_inflight=None if inflight is None else inflight * rps / 4,
        )
        for rps in (1.0, 2.0, 4.0, 8.0)
    )
    return CapacityRecord(
        region=REGION,
        measured_at=measured_at,
        engine_version="",
        replica="http://127.0.0.1:1",
        slo=CapacitySLO(ttft_p99_s=0.5),
        factor_of_safety=2.0,
        probes=(
            HitProbe(
                hit_rate=0.0,
                baseline_p99_s=0.1,
                ultimate_rps=4.0,
                ultimate_bounded=True,
                steps=steps,
            ),
        ),
        r_base_rps=4.0,
        beta=0.0,
        profile=WorkloadProfile(
            prompt_tokens_p50=10, prompt_tokens_p90=20, output_tokens=10, shared_prefix_share=0.0
        ),
    )


@dataclass
class World:
    store: EtcdStore
    keys: Keys
    picker: PickerServer
    envoy_url: str

    @property
    def gate(self) -> RegionGate:
        assert isinstance(self.picker.core.admission, AdmissionGates)
        gate = self.picker.core.admission.gate(REGION)
        assert gate is not None
        return gate

    async def put_capacity(self, record: CapacityRecord) -> None:
        await self.store.put(self.keys.capacity(REGION), encode(record))


@pytest.fixture(scope="module")
def simulator() -> Iterator[Proc]:
    [sim] = start_simulators(1, extra_args=("--decode-tokens-per-s", "10"))
    try:
        yield sim
    finally:
        sim.kill()


@pytest.fixture(scope="module")
async def world(
    etcd: EtcdServer, simulator: Proc, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    tmp = tmp_path_factory.mktemp("picker-admission")
    keys = Keys(cluster=f"epp-adm-{free_port()}")
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
                "slo": {"ttft_p99_s": 20.0},
            }
        ],
    }
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    store = EtcdStore(EtcdConfig(endpoints=etcd.endpoints, request_timeout_s=2.0))
    await store.connect()
    # measured before the picker starts: its first read of capacity/ bounds the limits
    await store.put(keys.capacity(REGION), encode(capacity(inflight=2.0, measured_at=time.time())))
    options, _ = parse_args(
        [
            "--topology", str(path), "--region", REGION, "--listen", hp(picker_port),
            "--no-prefix-tracking", "--admission", "--admission-max-wait", str(MAX_WAIT_S),
            "--admission-max-queue", "1",
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
            servers=[hp(simulator.port)],
        )
        envoy = await asyncio.to_thread(start_envoy, spec, Path(tmp) / "envoy")
        yield World(store, keys, picker, f"http://{hp(listen)}")
    finally:
        if envoy is not None:
            envoy.kill()
        await picker.stop()
        await store.close()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    error: dict[str, object] | None = None
    first_byte_at: float | None = None


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


async def stream(
    http: aiohttp.ClientSession, w: World, priority: str = "interactive", *, tokens: int = 4
) -> Answer:
    """A streamed chat completion through Envoy, read to its end (a refusal: its error)."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": tokens,
        "stream": True,
    }
    headers = {"x-priority": priority, "content-type": "application/json"}
    url = w.envoy_url + "/v1/chat/completions"
    async with http.post(url, data=json.dumps(body), headers=headers) as r:
        if r.status != 200:
            error = json.loads(await r.read())["error"]
            return Answer(r.status, {k.lower(): v for k, v in r.headers.items()}, error)
        answer = Answer(r.status, {k.lower(): v for k, v in r.headers.items()})
        async for _ in r.content.iter_any():
            if answer.first_byte_at is None:
                answer.first_byte_at = time.monotonic()
        return answer


async def holding(gate: RegionGate, n: int) -> None:
    async def held() -> bool:
        return gate.limiter.inflight() == n

    await until(held, within=15, what=f"{n} requests in flight")


async def waiting(gate: RegionGate, n: int, priority: Priority | None = None) -> None:
    async def queued() -> bool:
        return gate.limiter.waiting(priority) == n

    await until(queued, within=15, what=f"{n} requests waiting")


async def bounded(gate: RegionGate, limit: int | None) -> None:
    async def now() -> bool:
        return gate.limiter.config.max_limit == limit

    await until(now, within=15, what=f"the admission bound at {limit}")


# ---- the tests (in file order: each leaves the bound at 2) --------------------------------


async def test_the_bound_follows_the_measured_capacity(world: World) -> None:
    gate = world.gate
    await bounded(gate, 2)  # read at start: 4 rps x 0.5 s
    await world.put_capacity(capacity(inflight=None, measured_at=time.time()))
    await bounded(gate, None)  # probed before in-flight was recorded: no bound
    await world.put_capacity(capacity(inflight=6.0, measured_at=time.time()))
    await bounded(gate, 6)
    stale = time.time() - 30 * 86400  # older than the topology's capacity.max_age_s
    await world.put_capacity(capacity(inflight=6.0, measured_at=stale))
    await bounded(gate, None)
    await world.put_capacity(capacity(inflight=2.0, measured_at=time.time()))
    await bounded(gate, 2)


async def test_over_the_limit_envoy_answers_the_pickers_429_with_retry_after(
    world: World, http: aiohttp.ClientSession
) -> None:
    gate = world.gate
    await bounded(gate, 2)
    holders = [asyncio.create_task(stream(http, world, tokens=20)) for _ in range(2)]
    await holding(gate, 2)  # ~2 s each
    waiter = asyncio.create_task(stream(http, world))
    await waiting(gate, 1)

    full = await stream(http, world)  # the queue is full too: refused at once
    assert full.status == 429 and int(full.headers["retry-after"]) >= 1
    assert full.headers["content-type"] == "application/json"
    assert full.error is not None and full.error["code"] == 429
    assert "admission limit" in str(full.error["message"])
    assert "queue_full" in str(full.error["message"])

    timed_out = await waiter  # waited its MAX_WAIT_S while both slots stayed busy
    assert timed_out.status == 429 and int(timed_out.headers["retry-after"]) >= 1
    assert "timeout" in str(timed_out.error and timed_out.error["message"])
    assert [(await h).status for h in holders] == [200, 200]
    await holding(gate, 0)  # the ext_proc streams ended: their slots are free
    assert (await stream(http, world)).status == 200


async def test_batch_is_refused_before_interactive(
    world: World, http: aiohttp.ClientSession
) -> None:
    gate = world.gate
    await bounded(gate, 2)
    await asyncio.sleep(MAX_WAIT_S)  # the last test's timeout no longer makes it standing
    # both slots held ~3 s; the test frees one itself once the interactive one waits (a
    # stream that ended on its own after a fixed time raced the queueing on a slow CI)
    freed = asyncio.create_task(stream(http, world, tokens=30))
    kept = asyncio.create_task(stream(http, world, tokens=30))
    await holding(gate, 2)
    batch = asyncio.create_task(stream(http, world, "batch"))
    await waiting(gate, 1, Priority.BATCH)

    interactive = asyncio.create_task(stream(http, world, "interactive"))  # queue full
    dropped = await batch  # its batch waiter makes room for the interactive one
    assert dropped.status == 429 and int(dropped.headers["retry-after"]) >= 1
    assert "evicted" in str(dropped.error and dropped.error["message"])
    await waiting(gate, 1, Priority.INTERACTIVE)
    freed.cancel()  # the client hangs up: Envoy ends the picker's stream, the slot frees
    with contextlib.suppress(asyncio.CancelledError):
        await freed
    served = await interactive
    assert served.status == 200
    assert (await kept).status == 200
    await holding(gate, 0)
