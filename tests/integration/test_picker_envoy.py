"""The endpoint picker behind a real Envoy: real etcd, real simulators, two regions, each
with its Envoy (the shipped deploy/envoy/envoy.yaml, rendered by the lab) and its
pickers (``python -m regions.picker`` processes).

What the leader writes (``routing/<r>``, ``degradation/<r>``) is written here directly,
as the leader would: these tests are about the data plane; the drills run the same data
plane under a real control plane (tests/integration/test_drills_envoy.py).

The module's tests share one deployment and run in file order: the ones that kill
processes come last and restore what the next one needs. The deployment (``World``) and
its clients are tests/integration/picker_envoy_helpers.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

import grpc
import openai
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chaos.lab.envoy import EnvoySpec, render, start_envoy, stats
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, spawn, start_picker, start_simulator, start_simulators, until
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import DegradationRecord, FeatureFlags
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from regions.pool.processes import free_port
from tests.integration.picker_envoy_helpers import REGION, World, ask, chat, hp, picks, post
from tests.integration.sim_counts import served_count

pytestmark = [pytest.mark.slow, pytest.mark.etcd]

SET_METADATA = "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config"


@pytest.fixture(scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    tmp = tmp_path_factory.mktemp("picker-envoy")
    etcd = EtcdServer()  # its own: one test stops it
    await asyncio.to_thread(etcd.start)
    sims_flat = await asyncio.to_thread(start_simulators, 3)
    sims = {"east": sims_flat[:2], "west": sims_flat[2:]}
    envoy_ports = {r: (free_port(), free_port()) for r in sims}
    picker_ports = {"east": [free_port(), free_port()], "west": [free_port()]}
    keys = Keys(cluster=f"epp-{free_port()}")
    topo = {
        "cluster": keys.cluster,
        "etcd": {"endpoints": [etcd.endpoint]},
        "regions": [
            {
                "name": r,
                "zone": "us",
                "agent": hp(free_port()),
                "capacity_rps": 100,
                "replicas": [s.url for s in sims[r]],
                "entry": hp(envoy_ports[r][0]),
            }
            for r in sims
        ],
        "prefixes": {"export_interval_s": 0.5},
    }
    topology = tmp / "topology.yaml"
    topology.write_text(yaml.safe_dump(topo))
    store = EtcdStore(EtcdConfig(endpoints=(etcd.endpoint,), request_timeout_s=1.0))
    w = World(
        tmp,
        etcd,
        keys,
        store,
        SessionStore(store, keys, regions=tuple(sims), clock=SystemClock(), writer="test"),
        topology,
        sims,
        picker_ports,
        envoy_ports,
    )
    try:
        # Envoys first: their ports were chosen above and are free only until some
        # process's outgoing connection takes one (the pickers' are many); an Envoy is
        # live before its pickers answer.
        for region in sims:
            w.envoys[region] = await asyncio.to_thread(
                start_envoy, w.envoy_spec(region), tmp / f"envoy-{region}"
            )
        for region, ports in picker_ports.items():
            for i in range(len(ports)):
                await asyncio.to_thread(w.start_picker, region, i)
        yield w
    finally:
        procs: list[Proc] = [*w.envoys.values(), *(p for ps in w.pickers.values() for p in ps)]
        procs += [s for ss in w.sims.values() for s in ss]
        for proc in procs:
            proc.kill()
        await store.close()
        await asyncio.to_thread(etcd.stop)


# ---- the tests ---------------------------------------------------------------------------


async def test_the_official_openai_client_streams_through_envoy_and_the_picker(
    world: World,
) -> None:
    client = openai.AsyncOpenAI(
        base_url=world.url("east") + "/v1",
        api_key="unused",
        default_headers={"x-session-id": "oa-1"},
        max_retries=0,
    )
    try:
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "tell me a story"}],
            max_tokens=24,
            stream=True,
        )
        chunks = [c async for c in stream]
        raw = await client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "again"}], max_tokens=4
        )
    finally:
        await client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len({c.id for c in chunks}) == 1
    assert raw.headers[REGION] == "east"
    assert await world.pin("oa-1") == "east"


async def test_the_pickers_count_prompts_for_prewarm_and_say_when_they_are_ready(
    world: World,
) -> None:
    """Prefix exports land in etcd as the gateways' do (the leader merges them all);
    each picker serves the protocol's health services."""
    for i in range(3):
        assert await ask(world.url("east"), f"px-{i}", "a shared system prompt") == (200, "east")

    async def exported() -> bool:
        page = await world.store.get_prefix(world.keys.prefix_exports_prefix())
        return any("picker:east:" in kv.key for kv in page.kvs)

    await until(exported, within=10.0, every=0.1, what="exported")
    async with grpc.aio.insecure_channel(hp(world.picker_ports["east"][1])) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service


async def test_a_picker_that_cannot_read_etcd_is_live_but_not_ready(world: World) -> None:
    topo = yaml.safe_load(world.topology.read_text())
    topo["etcd"]["endpoints"] = [hp(free_port())]  # nobody there
    blind = world.tmp / "blind.yaml"
    blind.write_text(yaml.safe_dump(topo))
    port = free_port()
    args = ["-m", "regions.picker", "--topology", str(blind), "--region", "east"]
    proc = spawn([*args, "--listen", hp(port), "--http-listen", hp(free_port())], "epp-blind")
    try:
        async with grpc.aio.insecure_channel(hp(port)) as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            async def answers() -> bool:
                try:
                    await stub.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=1)
                except grpc.aio.AioRpcError:
                    return False
                return True

            await until(answers, within=10.0, every=0.1, what="answers")
            status = health_pb2.HealthCheckResponse
            for service, expect in (
                ("liveness", status.SERVING),
                ("readiness", status.NOT_SERVING),
            ):
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert answer.status == expect, service
    finally:
        proc.kill()


async def test_a_session_keeps_its_replica(world: World) -> None:
    before = [served_count(s) for s in world.sims["east"]]
    for _ in range(6):
        assert await ask(world.url("east"), "sticky-1", "the same prompt every time") == (
            200,
            "east",
        )
    grown = [served_count(s) - b for s, b in zip(world.sims["east"], before, strict=True)]
    assert sorted(grown) == [0, 6]


async def test_after_a_failover_each_session_moves_once_and_never_bounces_back(
    world: World,
) -> None:
    east, west = world.url("east"), world.url("west")
    sessions = [f"fo-{i}" for i in range(8)]
    for s in sessions:
        assert await ask(east, s) == (200, "east")
    await world.set_routing("east", {"west": 1.0}, epoch=1)

    async def moved() -> bool:
        return (await ask(east, sessions[0]))[1] == "west"

    await until(moved, within=10.0, every=0.1, what="moved")
    for s in sessions:
        for url in (east, west):  # through either region's Envoy: served by west
            assert await ask(url, s) == (200, "west")
        assert await world.pin(s) == "west"
    await world.set_routing("east", {"east": 1.0}, epoch=2)  # east recovers at once

    async def back() -> bool:
        return (await ask(east, "fo-new"))[1] == "east"

    await until(back, within=10.0, every=0.1, what="back")
    for s in sessions:  # a moved session stays where it moved, with either picker
        for _ in range(2):
            assert await ask(east, s) == (200, "west")
        assert await world.pin(s) == "west"


async def test_a_shed_request_is_a_429_with_retry_after(world: World) -> None:
    record = DegradationRecord(
        region="east", flags=FeatureFlags(shed_priority_below=5), reason="test", epoch=1
    )
    await world.store.put(world.keys.degradation("east"), encode(record))
    try:

        async def shedding() -> bool:
            status, _, _ = await asyncio.to_thread(
                post, world.url("east"), chat("hi"), {"x-session-id": "shed-1", "x-priority": "1"}
            )
            return status == 429

        await until(shedding, within=10.0, every=0.1, what="shedding")
        status, headers, body = await asyncio.to_thread(
            post, world.url("east"), chat("hi"), {"x-session-id": "shed-1", "x-priority": "1"}
        )
        assert status == 429 and headers["retry-after"] == "5"
        assert headers["content-type"] == "application/json"
        error = json.loads(body)["error"]
        assert error["code"] == 429 and "shedding requests of priority below 5" in error["message"]
        status, _, _ = await asyncio.to_thread(
            post, world.url("east"), chat("hi"), {"x-session-id": "shed-3", "x-priority": "9"}
        )
        assert status == 200
    finally:
        await world.store.put(
            world.keys.degradation("east"),
            encode(DegradationRecord(region="east", reason="test", epoch=2)),
        )


async def test_a_bad_request_gets_vllms_400_from_the_picker(world: World) -> None:
    status, headers, body = await asyncio.to_thread(
        post, world.url("east"), {"model": "tiny"}, {"x-session-id": "bad-1"}
    )
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["type"] == "BadRequestError"
    assert await world.sessions.get("bad-1") is None


async def test_the_data_planes_subset_hint_is_honoured(world: World) -> None:
    """An Envoy that sets the GIE subset hint (a set_metadata filter before ext_proc):
    every request lands on the one endpoint the hint allows; a hint naming no endpoint
    of the pool is the protocol's 503."""
    only = world.sims["east"][1]

    def with_hint(spec: EnvoySpec, endpoints: Sequence[str]) -> dict[str, Any]:
        config = render(spec)
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        hcm["typed_config"]["http_filters"].insert(
            0,
            {
                "name": "subset_hint",
                "typed_config": {
                    "@type": SET_METADATA,
                    "metadata": [
                        {
                            "metadata_namespace": "envoy.lb.subset_hint",
                            "value": {"x-gateway-destination-endpoint-subset": list(endpoints)},
                        }
                    ],
                },
            },
        )
        return config

    for endpoints, expect in (([hp(only.port)], 200), (["127.0.0.9:1"], 503)):
        spec = world.envoy_spec("east", listen_port=free_port(), admin_port=free_port())
        envoy = await asyncio.to_thread(
            partial(start_envoy, config=with_hint(spec, endpoints)),
            spec,
            world.tmp / f"hint-{expect}",
        )
        try:
            before = served_count(only)
            url = f"http://{hp(envoy.port)}"
            results = [
                await asyncio.to_thread(
                    post, url, chat(f"prompt {i}"), {"x-session-id": f"hint-{expect}-{i}"}
                )
                for i in range(4)
            ]
            assert [r[0] for r in results] == [expect] * 4
            if expect == 200:
                assert served_count(only) - before == 4
            else:
                assert results[0][1]["retry-after"] == "1"
        finally:
            envoy.kill()


async def test_replicas_that_all_refuse_spill_to_the_next_region_and_the_session_moves_once(
    world: World,
) -> None:
    east = world.url("east")
    assert await ask(east, "spill-1") == (200, "east")
    first, second = world.sims["east"]
    first.kill()
    try:
        for i in range(4):  # one replica left: the list's fallback serves in-region
            assert await ask(east, f"half-{i}") == (200, "east")
        second.kill()
        assert await ask(east, "spill-1") == (200, "west")  # the list's last entry
        assert await world.pin("spill-1") == "west"
        assert await ask(east, "spill-1") == (200, "west")  # now sent to west directly
    finally:
        restarted = [
            await asyncio.to_thread(start_simulator, port=s.port, name=f"east-{i}")
            for i, s in enumerate((first, second))
        ]
        world.sims["east"] = restarted
    assert await world.pin("spill-1") == "west"  # and it stays there


async def test_an_etcd_outage_changes_nothing_for_cached_sessions(world: World) -> None:
    east = world.url("east")
    cached = [f"cache-{i}" for i in range(4)]
    for s in cached:
        assert await ask(east, s) == (200, "east")
    await asyncio.to_thread(world.etcd.kill)
    try:
        for s in cached:
            assert await ask(east, s) == (200, "east")
        assert await ask(east, "moved-before") == (200, "east")  # fail-static: home
    finally:
        await asyncio.to_thread(world.etcd.restart)


async def test_a_picker_killed_under_load_fails_no_request_and_its_restart_agrees(
    world: World,
) -> None:
    east = world.url("east")
    sessions = [f"load-{i}" for i in range(6)]
    failures: list[tuple[str, int]] = []
    done = asyncio.Event()

    async def client(s: str) -> int:
        n = 0
        while not done.is_set():
            status, _ = await ask(east, s)
            n += 1
            if status != 200:
                failures.append((s, status))
        return n

    tasks = [asyncio.create_task(client(s)) for s in sessions]
    await asyncio.sleep(1.5)
    victim = world.pickers["east"][0]
    victim.kill()  # SIGKILL
    await asyncio.sleep(3.0)
    done.set()
    counts = await asyncio.gather(*tasks)
    assert sum(counts) > len(sessions) * 4
    assert failures == []
    world.pickers["east"][0] = await asyncio.to_thread(
        lambda: start_picker(
            world.topology, "east", listen=hp(world.picker_ports["east"][0]), name="epp-east-0b"
        )
    )
    pinned = [*sessions, "fo-0", "fo-1", "spill-1", "sticky-1"]  # east's and west's sessions
    a, b = (hp(p) for p in world.picker_ports["east"])
    # They agree on where each session is pinned: the region of every endpoint, in order,
    # and the same endpoints. The order of one region's replicas is each picker's own
    # load balancing (the survivor learned the replicas' costs under the load, the
    # restarted one has not yet), so it may differ.
    where = {hp(sim.port): r for r, sims in world.sims.items() for sim in sims}
    where |= {hp(ports[0]): r for r, ports in world.envoy_ports.items()}
    for s in pinned:
        got_a, got_b = (await picks(a, s)).split(","), (await picks(b, s)).split(",")
        assert [where[e] for e in got_a] == [where[e] for e in got_b], s
        assert sorted(got_a) == sorted(got_b), s
    assert (await picks(a, "fo-0")) == hp(world.envoy_ports["west"][0])


async def test_with_every_picker_down_fail_open_serves_and_fail_closed_answers_500(
    world: World,
) -> None:
    closed = await asyncio.to_thread(
        start_envoy,
        world.envoy_spec("east", listen_port=free_port(), admin_port=free_port(), fail_open=False),
        world.tmp / "closed",
    )
    try:
        for p in world.pickers["east"]:
            p.kill()
        status, _, _ = await asyncio.to_thread(
            post, world.url("east"), chat("hi"), {"x-session-id": "down-1"}
        )
        assert status == 200  # fail open: the region's own pool, round robin
        assert (
            stats(world.envoys["east"].admin_url).get(
                "http.tectonic_inference.ext_proc.failure_mode_allowed", 0
            )
            >= 1
        )
        status, _, _ = await asyncio.to_thread(
            post, f"http://{hp(closed.port)}", chat("hi"), {"x-session-id": "down-2"}
        )
        assert status == 500  # fail closed: Envoy's own 500 (GIE issue #572's symptom)
    finally:
        closed.kill()
