"""A region's served load (``load_rps``): inference requests only (first tokens, not the
warm pool's ``/is_sleeping`` probes nor anything else vLLM's http counter sees), the
agent's own pre-warm replays left out, smoothed over a stated window for the planner
and CBU, with this round's raw figure beside it for the live view. Fake clocks only;
the real-simulator check is the last test (an idle simulator probed as the pool does)."""

from __future__ import annotations

import math
import random

import aiohttp
import pytest

from controlplane.kernel.vllm.signals import (
    LOAD_RAW_SIGNAL,
    LOAD_WINDOW_S,
    Histogram,
    LoadWindow,
    ReplicaMetrics,
)
from regions.agent.probe_vllm import ReplicaProbe, probe_replica
from regions.agent.verdict import RegionVerdict, fold_verdict
from regions.simulator.engine import EngineConfig
from regions.simulator.server import SimConfig, serve

BOUNDS = (0.1, 1.0, math.inf)
RATE = 7.5  # requests per second, the constant load


def scrape(at: float, first_tokens: float, http: float) -> ReplicaMetrics:
    ttft = Histogram(bounds=BOUNDS, counts=(first_tokens,) * 3, total=0.05 * first_tokens)
    return ReplicaMetrics(at=at, ttft=ttft, requests=http, server_errors=0.0)


def probe(url: str, m: ReplicaMetrics) -> ReplicaProbe:
    return ReplicaProbe(url=url, up=True, waiting=0, running=0, metrics=m)


def at_of(v: RegionVerdict) -> float:
    m = v.probes[0].metrics
    assert m is not None
    return m.at


def run_agent(
    arrivals: list[float], seconds: float, interval: float = 1.0, probes_per_s: float = 1.0
) -> list[RegionVerdict]:
    """An agent probing one replica every ``interval`` on a fake clock; ``arrivals`` are
    the first-token times of the requests; the pool asks /is_sleeping ``probes_per_s``
    times a second (counted by vLLM's http_requests_total, as on a real server)."""
    views: list[RegionVerdict] = []
    before: RegionVerdict | None = None
    t, previous = 0.0, ()
    served = 0
    while t <= seconds + 1e-9:
        while served < len(arrivals) and arrivals[served] <= t:
            served += 1
        now = (probe("http://a", scrape(t, served, served + probes_per_s * t)),)
        before = fold_verdict("eu", now, previous=previous, before=before)
        views.append(before)
        previous = now
        t = round(t + interval, 9)
    return views


def test_the_window_is_stated_and_between_half_a_minute_and_a_minute() -> None:
    assert 30.0 <= LOAD_WINDOW_S <= 60.0


def test_constant_load_reads_within_ten_percent_smoothed_though_raw_swings() -> None:
    # A constant 7.5 requests/s whose first tokens come in batches: the 1 s windows read
    # 3 to 12 (the figures); the smoothed rate must stay within +-10 % once the
    # window is full.
    rng = random.Random(7)
    arrivals: list[float] = []
    for block in range(50):  # 4 s blocks of 30 requests: constant at the 4 s scale
        bursts = [3, 12, 3, 12]
        rng.shuffle(bursts)
        for i, n in enumerate(bursts):
            t = block * 4 + i
            arrivals += sorted(t + rng.random() for _ in range(n))
    views = run_agent(arrivals, 200)
    raw = [v.signals[LOAD_RAW_SIGNAL] for v in views[1:]]
    assert min(raw) <= 4 and max(raw) >= 11  # the raw view keeps the swings
    settled = [v.signals["load_rps"] for v in views if at_of(v) >= LOAD_WINDOW_S]
    assert settled
    assert all(abs(x - RATE) <= 0.1 * RATE for x in settled), (min(settled), max(settled))


def test_evenly_spaced_load_at_an_uneven_probe_interval() -> None:
    arrivals = [i / RATE for i in range(int(RATE * 120))]
    views = run_agent(arrivals, 119, interval=0.7)
    settled = [v.signals["load_rps"] for v in views if at_of(v) >= 40]
    assert all(abs(x - RATE) <= 0.1 * RATE for x in settled)


def test_an_idle_region_probed_by_its_pool_serves_nothing() -> None:
    # No inference request; the pool's /is_sleeping (2 a second) is in http_requests_total.
    views = run_agent([], 60, probes_per_s=2.0)
    last = views[-1].signals
    assert last["request_rate"] == pytest.approx(2.0)  # what load_rps used to read
    assert last["load_rps"] == 0.0 and last[LOAD_RAW_SIGNAL] == 0.0


def test_a_step_in_load_is_followed_within_the_window() -> None:
    arrivals = [i / 2.0 for i in range(120)] + [60 + i / 10.0 for i in range(1200)]
    views = run_agent(arrivals, 180)
    at = {at_of(v): v.signals.get("load_rps") for v in views}
    assert at[59.0] == pytest.approx(2.0, rel=0.1)
    assert at[60.0 + LOAD_WINDOW_S + 1] == pytest.approx(10.0, rel=0.1)


def test_the_agents_own_replays_are_not_load() -> None:
    a0 = probe("http://a", scrape(0.0, 0, 0))
    first = fold_verdict("eu", [a0], sent=0)
    # 50 first tokens in the second, 40 of them pre-warm replays the agent sent itself
    a1 = probe("http://a", scrape(1.0, 50, 50))
    view = fold_verdict("eu", [a1], previous=[a0], before=first, sent=40)
    assert view.signals["load_rps"] == pytest.approx(10.0)
    assert view.signals[LOAD_RAW_SIGNAL] == pytest.approx(10.0)
    assert view.sent == 40
    # more answered replays than first tokens seen (scrape timing): never below 0
    a2 = probe("http://a", scrape(2.0, 55, 55))
    again = fold_verdict("eu", [a2], previous=[a1], before=view, sent=60)
    assert again.signals[LOAD_RAW_SIGNAL] == 0.0


def test_a_replica_not_probed_before_adds_nothing_until_its_second_probe() -> None:
    # A replica back from a loan (its counters hold the capacity probe's load) or newly
    # ACTIVE: no window from one scrape, so none of what it served out of rotation counts.
    a0, a1 = probe("http://a", scrape(0.0, 0, 0)), probe("http://a", scrape(1.0, 5, 5))
    lent = probe("http://b", scrape(1.0, 90_000, 90_000))
    view = fold_verdict("eu", [a1, lent], previous=[a0])
    assert view.signals["load_rps"] == pytest.approx(5.0)


def test_load_window_keeps_its_last_rate_through_rounds_without_a_window() -> None:
    w = LoadWindow(window_s=10).add(1.0, 1.0, 5).add(2.0, 1.0, 7)
    assert w.rate == pytest.approx(6.0) and w.span_s == 2.0
    assert w.add(3.0, 0.0, 4) is w  # no window: nothing added
    later = w.add(20.0, 1.0, 1)  # the old rounds fell out of the window
    assert later.rate == 1.0 and len(later.samples) == 1
    assert LoadWindow().rate is None
    restarted = later.add(5.0, 1.0, 3)  # a clock that went back: start again
    assert restarted.rate == 3.0


async def test_an_idle_simulator_probed_like_the_pool_serves_zero() -> None:
    """The simulator, as real vLLM, counts ``GET /is_sleeping`` in http_requests_total;
    the served load must not."""
    runner, _, port = await serve(SimConfig(engine=EngineConfig()), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            before: RegionVerdict | None = None
            previous: tuple[ReplicaProbe, ...] = ()
            for _ in range(4):
                for _ in range(3):  # the pool's probes between two agent rounds
                    async with http.get(url + "/is_sleeping") as r:
                        assert r.status == 200
                now = (await probe_replica(http, url, 2.0),)
                before = fold_verdict("eu", now, previous=previous, before=before)
                previous = now
            assert before is not None
            assert before.signals["request_rate"] > 0  # the probes are counted there
            assert before.signals["load_rps"] == 0.0
            assert before.signals[LOAD_RAW_SIGNAL] == 0.0
            body = {"prompt": "hello there", "max_tokens": 2}
            for _ in range(3):
                async with http.post(url + "/v1/completions", json=body) as r:
                    assert r.status == 200
            now = (await probe_replica(http, url, 2.0),)
            view = fold_verdict("eu", now, previous=previous, before=before)
            window = view.load.samples[-1]
            assert window.count == pytest.approx(3)  # the three completions, nothing else
    finally:
        await runner.cleanup()
