"""The warm pool on real simulator processes (and, marked ``realvllm``, one real vLLM):
WARM replicas really sleep, activation wakes them with a reset prefix cache, a killed
replica is seen as COLD and a managed one is relaunched, static endpoints are never
launched or stopped."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from chaos.lab.procs import start_simulators, until
from chaos.lab.vllm_cpu import SETUP_HINT, TINY_MODEL_DIR, VLLM_PYTHON, vllm_available
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.vllm.metrics import parse_gauges
from regions.agent.service import ReplicaSet
from regions.pool.launchers import SimulatorLauncher, StaticEndpoints, VllmLauncher, VllmSpec
from regions.pool.manager import WarmPool
from regions.pool.planner import Plan
from regions.pool.snapshot import PoolSnapshot
from regions.pool.states import Action, PoolConfig, ReplicaState

pytestmark = pytest.mark.slow
COLD, WARM, ACTIVE, IDLE = (
    ReplicaState.COLD,
    ReplicaState.WARM,
    ReplicaState.ACTIVE,
    ReplicaState.IDLE,
)
HITS = "vllm:prefix_cache_hits_total"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        yield s


async def is_sleeping(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.get(url + "/is_sleeping") as r:
        assert r.status == 200
        return bool((await r.json())["is_sleeping"])


async def post(http: aiohttp.ClientSession, url: str, path: str, **params: str) -> None:
    async with http.post(url + path, params=params) as r:
        assert r.status == 200, await r.text()


async def complete(http: aiohttp.ClientSession, url: str, prompt: str, model: str) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": 1}
    async with http.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()


async def hits(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as r:
        return parse_gauges(await r.text(), frozenset({HITS})).get(HITS, 0.0)


def long_prompt() -> str:
    tag = uuid.uuid4().hex
    return " ".join(f"{tag[i % 32]}word{i}" for i in range(300))


def by_state(snap: PoolSnapshot) -> dict[ReplicaState, list[str]]:
    return {s: snap.urls(s) for s in ReplicaState}


async def test_warm_replicas_sleep_and_wake_with_a_reset_prefix_cache(
    http: aiohttp.ClientSession,
) -> None:
    changes: list[PoolSnapshot] = []
    launcher = SimulatorLauncher()
    pool = WarmPool(launcher, PoolConfig(active=1, warm=2), on_change=changes.append)
    await pool.start()
    try:
        states = by_state(pool.snapshot())
        assert len(states[ACTIVE]) == 1 and len(states[WARM]) == 2
        assert pool.active() == states[ACTIVE] == changes[-1].urls(ACTIVE)
        assert not await is_sleeping(http, states[ACTIVE][0])
        for url in states[WARM]:
            assert await is_sleeping(http, url)

        # Fill both WARM replicas' caches behind the pool's back, then sleep them at
        # level 0, which keeps the cache: only /reset_prefix_cache can empty it now.
        prompt = long_prompt()
        for url in states[WARM]:
            await post(http, url, "/wake_up")
            await complete(http, url, prompt, "tiny")
            await post(http, url, "/sleep", level="0")

        active = await pool.activate(2)
        assert len(active) == 2 and set(active) > set(states[ACTIVE])
        [woken] = set(active) - set(states[ACTIVE])
        [other] = set(states[WARM]) - {woken}
        assert not await is_sleeping(http, woken) and await is_sleeping(http, other)
        assert changes[-1].urls(ACTIVE) == active

        before = await hits(http, woken)
        await complete(http, woken, prompt, "tiny")
        assert await hits(http, woken) == before  # its cache was reset on waking
        # Control: woken WITHOUT a reset, the other one still hits its cached prompt.
        await post(http, other, "/wake_up")
        before = await hits(http, other)
        await complete(http, other, prompt, "tiny")
        assert await hits(http, other) > before
        await post(http, other, "/sleep", level="1")

        snap = PoolSnapshot.model_validate_json(pool.snapshot().model_dump_json())
        assert [r.state for r in snap.replicas].count(ACTIVE) == 2
    finally:
        await pool.stop()
    assert all(r.state is COLD and r.url is None for r in pool.snapshot().replicas)
    assert all(launcher.process(url) is None for url in states[WARM] + states[ACTIVE])


async def test_a_killed_replica_is_cold_and_relaunched_on_reconcile() -> None:
    changes: list[PoolSnapshot] = []
    launcher = SimulatorLauncher()
    pool = WarmPool(launcher, PoolConfig(active=1, warm=1), on_change=changes.append, dead_after=1)
    await pool.start()
    try:
        [dead] = pool.active()
        [spare] = pool.snapshot().urls(WARM)
        proc = launcher.process(dead)
        assert proc is not None
        proc.kill()
        snap = await pool.reconcile()
        # The death was published (ACTIVE set emptied, its slot COLD) before the plan
        # woke the spare and relaunched the dead slot to WARM on a new process.
        died = next(c for c in changes if not c.urls(ACTIVE))
        assert len(died.urls(COLD)) == 0 and sum(r.state is COLD for r in died.replicas) == 1
        assert snap.urls(ACTIVE) == [spare]
        [fresh] = snap.urls(WARM)
        assert fresh != dead and launcher.process(fresh) is not None
    finally:
        await pool.stop()


async def test_scaling_down_waits_for_the_dwells_on_a_fake_clock(
    http: aiohttp.ClientSession,
) -> None:
    clock = FakeClock()
    changes: list[PoolSnapshot] = []
    pool = WarmPool(
        SimulatorLauncher(), PoolConfig(active=1, warm=1), clock=clock, on_change=changes.append
    )
    replica_set: ReplicaSet = pool  # what the agent's pre-warm service takes
    await pool.start()
    try:
        assert replica_set.warm_count() == 1
        both = await pool.activate(2)
        assert len(both) == 2 and pool.warm_count() == 0
        assert await pool.activate(1) == both  # "at least": never drains
        clock.advance(60)
        assert await pool.set_active(1) == both  # anti-flap: ACTIVE for 60 s < 120 s
        assert any("ACTIVE dwell 120 s" in n for n in pool.snapshot().notes)
        clock.advance(61)
        snap = await pool.reconcile()
        [idle] = snap.urls(IDLE)
        assert len(snap.urls(ACTIVE)) == 1 and changes[-1].urls(ACTIVE) == snap.urls(ACTIVE)
        assert not await is_sleeping(http, idle)  # drained but kept awake
        clock.advance(1799)
        assert (await pool.reconcile()).urls(IDLE) == [idle]
        clock.advance(1)
        assert (await pool.reconcile()).urls(WARM) == [idle]  # IDLE dwell over: asleep
        assert await is_sleeping(http, idle)
    finally:
        await pool.stop()


async def test_a_scaled_pool_sleeps_what_it_let_go_and_skips_a_refused_move(
    http: aiohttp.ClientSession,
) -> None:
    """Sized by the leader (``set_sizes``), the pool puts a drained replica to sleep
    after ``scaled_idle_min_s`` (10 s), not ``idle_min_s`` (1,800 s). A planned move its
    own rules refuse (a planner defect, made by hand here) is skipped and said: the
    replica is told nothing and the pool carries on (an agent once stopped on it)."""
    clock = FakeClock()
    pool = WarmPool(SimulatorLauncher(), PoolConfig(active=1, warm=1), clock=clock)
    await pool.start()
    try:
        await pool.set_sizes(2, 0)
        clock.advance(121)  # past the ACTIVE dwell
        await pool.set_sizes(1, 1)
        [idle] = pool.snapshot().urls(IDLE)
        name = next(r.name for r in pool.snapshot().replicas if r.url == idle)
        clock.advance(5)
        early = Plan(actions=(Action(kind="sleep", replica=name, to=WARM, reason="a defect"),))
        await pool._apply(early, None, launch=False)  # 5 s < 10 s: refused, skipped
        assert pool.snapshot().urls(IDLE) == [idle] and not await is_sleeping(http, idle)
        clock.advance(6)
        assert (await pool.reconcile()).urls(WARM) == [idle]  # 11 s: asleep
        assert await is_sleeping(http, idle)
    finally:
        await pool.stop()


async def test_static_endpoints_are_adopted_never_launched_or_stopped(
    http: aiohttp.ClientSession,
) -> None:
    sims = start_simulators(2)
    try:
        urls = [p.url for p in sims]
        pool = WarmPool(StaticEndpoints(urls), PoolConfig(active=1, warm=1), dead_after=1)
        await pool.start()
        [active] = pool.active()
        [warm] = pool.snapshot().urls(WARM)
        assert await is_sleeping(http, warm)
        gone = next(p for p in sims if p.url == warm)
        gone.kill()
        snap = await pool.reconcile()
        lost = [r for r in snap.replicas if r.state is COLD]
        assert [r.url for r in lost] == [warm] and not lost[0].managed  # not relaunched
        await pool.stop()
        assert not await is_sleeping(http, active)  # left serving as it was
    finally:
        for p in sims:
            p.kill()


async def test_static_endpoints_found_serving_are_adopted_as_active_with_their_cache(
    http: aiohttp.ClientSession,
) -> None:
    """An agent restart must not sleep (and empty) replicas that serve traffic: awake
    static endpoints fill the ACTIVE target as they are; only the rest go to sleep."""
    sims = start_simulators(2)
    try:
        prompt = long_prompt()
        for p in sims:  # both served before the pool: warm caches
            await complete(http, p.url, prompt, "tiny")
        pool = WarmPool(StaticEndpoints([p.url for p in sims]), PoolConfig(active=1, warm=1))
        await pool.start()
        [active] = pool.active()
        [warm] = pool.snapshot().urls(WARM)
        assert not await is_sleeping(http, active) and await is_sleeping(http, warm)
        before = await hits(http, active)
        await complete(http, active, prompt, "tiny")
        assert await hits(http, active) > before  # its cache survived the adoption
        await pool.stop()
    finally:
        for p in sims:
            p.kill()


class FakeReplica:
    """An admin API that records every call and refuses the first prefix-cache resets
    (as vLLM does while running requests hold blocks)."""

    def __init__(self, refused_resets: int) -> None:
        self.calls: list[str] = []
        self.sleeping = False
        self.refused_resets = refused_resets

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            self.calls.append(request.path)
            if request.path == "/sleep":
                self.sleeping = True
            elif request.path == "/wake_up":
                self.sleeping = False
            elif request.path == "/reset_prefix_cache":
                self.refused_resets -= 1
                return web.json_response({"success": self.refused_resets < 0})
            return web.json_response({"is_sleeping": self.sleeping})

        app = web.Application()
        app.router.add_route("*", "/{name}", handle)
        return app


async def test_waking_is_wake_up_then_a_reset_retried_until_it_succeeds() -> None:
    fake = FakeReplica(refused_resets=2)
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    pool = WarmPool(StaticEndpoints([f"http://127.0.0.1:{port}"]), PoolConfig(active=0, warm=1))
    try:
        await pool.start()
        assert pool.warm_count() == 1 and fake.sleeping
        fake.calls.clear()
        assert len(await pool.activate(1)) == 1
        assert fake.calls == ["/wake_up", *["/reset_prefix_cache"] * 3, "/is_sleeping"]
    finally:
        await pool.stop()
        await runner.cleanup()


@pytest.mark.realvllm
async def test_a_real_cpu_vllm_sleeps_and_wakes(http: aiohttp.ClientSession) -> None:
    if not vllm_available():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real-vLLM tests: {SETUP_HINT}")
        pytest.skip(f"real vLLM is not installed: {SETUP_HINT}")
    spec = VllmSpec(flavour="cpu", model=str(TINY_MODEL_DIR), python=str(VLLM_PYTHON))
    pool = WarmPool(VllmLauncher(spec), PoolConfig(active=0, warm=1))
    await pool.start()
    try:
        [url] = pool.snapshot().urls(WARM)
        assert await is_sleeping(http, url)
        assert await pool.activate(1) == [url]
        assert not await is_sleeping(http, url)
        prompt = long_prompt()
        await complete(http, url, prompt, "tiny")
        before = await hits(http, url)
        await complete(http, url, prompt, "tiny")

        async def hit_again() -> bool:
            return await hits(http, url) > before

        # awake and caching again; vLLM's counters may trail its answer, so waited for
        await until(hit_again, within=10, every=0.1, what="the repeated prompt's cache hits")
    finally:
        await pool.stop()
