"""When a full prefix owner is worth waiting for (regions.dataplane.replicas), the costs
it is weighed with (regions.dataplane.replica_costs), and the poller that reads them
from a replica's /metrics (regions.dataplane.replica_load)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kernel.vllm.metrics import PREFIX_HITS, PREFIX_QUERIES
from regions.dataplane.replica_cache import MAX_RANKS, SentKeys
from regions.dataplane.replica_costs import E2E, QUEUE, TTFT, CostEstimator, Costs
from regions.dataplane.replica_load import ReplicaLoadPoller
from regions.dataplane.replicas import ReplicaBalancer

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
HOLD, SAVING = 0.3, 0.05  # a request holds its slot 300 ms; a hit saves 50 ms
COSTS = Costs(HOLD, SAVING)


def _owned_by(b: ReplicaBalancer, replica: str) -> int:
    return next(k for k in range(0, 2**64, 2**54) if next(iter(b.ring.walk(k))) == replica)


def _teach_cache(b: ReplicaBalancer, replica: str, key: int) -> None:
    """Eight requests of ``key`` on ``replica``, and a report that 7 of 8 hit: its
    cache holds at least the last prefix sent there (capacity 1)."""
    for _ in range(8):
        b.acquire(replica, key=key)
        b.release(replica)
    b.set_costs(replica, Costs(HOLD, SAVING, hit_share=7 / 8))


def _full_owner(costs: Costs | None = COSTS) -> tuple[ReplicaBalancer, int]:
    """A and B of 2 slots each; A, the key's owner, holds its prefix and runs two
    requests of it, ours, that started at 0.0 and 0.1; B runs nothing."""
    b = ReplicaBalancer([A, B], slots=2)
    key = _owned_by(b, A)
    _teach_cache(b, A, key)
    b.set_costs(A, costs)
    b.acquire(A, now=0.0, key=key)
    b.acquire(A, now=0.1, key=key)
    return b, key


def test_a_full_owner_whose_slot_comes_sooner_than_the_saving_is_waited_for() -> None:
    b, key = _full_owner()
    assert b.wait_s(A, now=0.28) == pytest.approx(0.02)  # the oldest ends at 0.3
    assert b.choose(key, now=0.28) == A  # 20 ms of wait against 50 of prefill
    assert b.choose(key, now=0.27) == B  # 30 ms: over half the saving, the margin
    assert b.choose(key, now=0.2) == B  # 100 ms of wait: spill, cold
    assert b.choose(key, now=0.31) == A  # overdue: its slot is due now


def test_a_full_owner_that_no_longer_holds_the_prefix_is_not_waited_for() -> None:
    b, key = _full_owner()
    assert b.likely_cached(A, key)
    b.acquire(A, now=0.25, key=key + 1)  # another prefix since: capacity 1 evicts it
    b.release(A)
    assert not b.likely_cached(A, key)
    assert b.choose(key, now=0.29) == B  # a short wait, then the whole prefill anyway
    never = _owned_by(b, A) + 2**50  # owned by A too, never sent there
    if next(iter(b.ring.walk(never))) == A:
        assert b.choose(never, now=0.29) == B


def test_the_wait_counts_the_requests_already_queued_there() -> None:
    b, key = _full_owner()
    b.acquire(A, now=0.28)  # waits for the oldest's slot
    assert b.wait_s(A, now=0.38) == pytest.approx(0.02)  # the next slot: the 0.1 one's
    assert b.choose(key, now=0.38) == A
    assert b.choose(key, now=0.3) == B  # 0.1 s until that one


def test_without_its_costs_or_our_start_times_a_full_owner_is_not_waited_for() -> None:
    b, key = _full_owner(costs=None)
    assert b.wait_s(A, now=0.29) is None and b.choose(key, now=0.29) == B
    untimed = ReplicaBalancer([A, B], slots=1)
    key = _owned_by(untimed, A)
    _teach_cache(untimed, A, key)
    untimed.acquire(A, key=key)  # no start time
    assert untimed.likely_cached(A, key) and untimed.choose(key, now=0.29) == B


def test_a_wait_behind_requests_we_did_not_send_is_not_foreseen() -> None:
    b, key = _full_owner()
    b.observe(A, running=2, waiting=2)  # two more queued there, others'
    assert b.wait_s(A, now=0.29) is None
    assert b.choose(key, now=0.29) == B


def test_a_replica_overdue_by_more_than_a_hold_is_not_waited_for() -> None:
    b, key = _full_owner()
    assert b.wait_s(A, now=0.61) is None  # its oldest should have ended at 0.3: stuck?
    assert b.choose(key, now=0.61) == B


def test_ends_take_the_oldest_start_and_a_rebuild_keeps_the_costs() -> None:
    b, _ = _full_owner()
    b.release(A)
    b.acquire(A, now=0.2)
    assert b.wait_s(A, now=0.39) == pytest.approx(0.01)  # the 0.1 one is now the oldest
    assert b.rebuilt([A, B]).wait_s(A, now=0.0) is None  # no request of its own yet
    rebuilt = b.rebuilt([A])
    rebuilt.acquire(A, now=1.0)
    rebuilt.acquire(A, now=1.0)
    assert rebuilt.wait_s(A, now=1.25) == pytest.approx(0.05)
    assert rebuilt.likely_cached(A, _owned_by(b, A))  # what it sent there stays


@settings(max_examples=200)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12),
    st.floats(0.0, 2.0),
    st.floats(0.05, 1.0),
    st.floats(0.0, 0.5),
    st.booleans(),
)
def test_a_request_queues_while_another_replica_has_room_only_for_less_than_it_saves(
    starts: list[float], now: float, hold: float, saving: float, cached: bool
) -> None:
    """Whatever A runs and whatever its costs: the choice is A only while it has room,
    or when it holds the prefix and its expected wait is below half what that saves
    (so below the saving itself)."""
    b = ReplicaBalancer([A, B], slots={A: 4, B: 4})
    key = _owned_by(b, A)
    _teach_cache(b, A, key if cached else key + 1)
    b.set_costs(A, Costs(hold, saving))
    for t in sorted(starts):
        b.acquire(A, now=t, key=key if cached else key + 1)
    now = max(now, max(starts))
    chosen = b.choose(key, now=now)
    if b.load(A) >= 4:
        wait = b.wait_s(A, now)
        worth = wait is not None and wait < saving / 2 and b.likely_cached(A, key)
        assert chosen == (A if worth else B)
        assert chosen == B or (wait is not None and wait < saving)
    else:
        assert chosen == A


# ---- what a replica's cache holds ----------------------------------------------------


def test_a_prefixs_rank_is_how_many_others_were_sent_since() -> None:
    sent = SentKeys(track=3)
    assert sent.rank(1) == math.inf
    for k in (1, 2, 3, 2):
        sent.sent(k)
    assert (sent.rank(2), sent.rank(3), sent.rank(1)) == (0, 1, 2)
    sent.sent(4)  # tracks three: 1 is forgotten
    assert sent.rank(1) == math.inf and sent.rank(4) == 0


def test_the_capacity_is_the_rank_below_which_the_hit_share_of_requests_fell() -> None:
    sent = SentKeys()
    for k in [1, 2, 3, 4] * 3:  # ranks: inf x 4, then 3 x 8
        sent.sent(k)
    assert not sent.likely_cached(4)  # nothing learned yet
    sent.learn(8 / 12)  # the 8 repeats hit: a cache of at least 4 prefixes
    assert sent.capacity == 4.0 and sent.likely_cached(1)
    for k in [1, 5, 6, 7, 8, 1, 9, 10]:
        sent.sent(k)
    sent.learn(0.0)  # nothing hit: no room at all (smoothed: 4 + 0.3 x (0 - 4))
    assert sent.capacity == pytest.approx(2.8)
    assert sent.likely_cached(1) and not sent.likely_cached(8)  # 2 sent since 1, 3 since 8


def test_hits_beyond_ours_teach_nothing() -> None:
    sent = SentKeys()
    for k in range(10, 20):
        sent.sent(k)
    sent.learn(1.0)  # all hit, none sent before: other gateways' prefixes, not ours
    assert sent.capacity is None


def test_reports_of_too_few_requests_add_up_weighted_by_the_requests_they_cover() -> None:
    """A gateway sending four requests between two reports learns at the second (before,
    each report's four were dropped and nothing was ever learned)."""
    sent = SentKeys()
    for k in [1, 2, 1, 2]:  # ranks: inf, inf, 1, 1
        sent.sent(k)
    sent.learn(0.5)  # 4 requests: too few, kept
    assert sent.capacity is None
    for k in [3, 4, 5, 6]:  # ranks: inf x 4
        sent.sent(k)
    sent.learn(0.0)  # (0.5 x 4 + 0 x 4) / 8 = 0.25: the 2 lowest ranks (1, 1) hit
    assert sent.capacity == 2.0


# ---- the costs -------------------------------------------------------------------------


def counters(
    ended: float, e2e: float, firsts: float, ttft: float, queue: float, hits: float, asked: float
) -> dict[str, float]:
    return {
        f"{E2E}_count": ended,
        f"{E2E}_sum": e2e,
        f"{TTFT}_count": firsts,
        f"{TTFT}_sum": ttft,
        f"{QUEUE}_sum": queue,
        PREFIX_HITS: hits,
        PREFIX_QUERIES: asked,
    }


def test_the_costs_come_from_what_ended_between_two_polls() -> None:
    est = CostEstimator()
    assert est.update(counters(0, 0, 0, 0, 0, 0, 0)) is None  # one poll: no deltas
    # 10 requests of 1,100 prompt tokens, 1,000 of them hits: 1,000 tokens computed in
    # 0.05 s of prefill (0.25 s first-token time less 0.2 s queued), 3.4 s from arrival
    # to the end, of them 3.2 in a slot
    costs = est.update(counters(10, 3.4, 10, 0.25, 0.2, 10_000, 11_000))
    assert costs is not None
    assert costs.hold_s == pytest.approx(0.32)
    assert costs.hit_saving_s == pytest.approx(1_000 * 0.05 / 1_000)  # tokens hit x s/token
    assert costs.hit_share == pytest.approx(10 / 11)
    # a quiet poll (too few requests) changes nothing and closes no window; a restart is
    # no delta
    quiet = est.update(counters(11, 3.5, 11, 0.3, 0.2, 10_500, 11_600))
    assert quiet == Costs(costs.hold_s, costs.hit_saving_s, None)
    assert est.update(counters(0, 0, 0, 0, 0, 0, 0)) == Costs(costs.hold_s, costs.hit_saving_s)


def test_quiet_polls_add_up_until_enough_requests_ended() -> None:
    """Two requests a poll (a replica of long generations): every second poll closes a
    window of four. Before, each poll's two were dropped and no cost was ever known."""
    est = CostEstimator()
    est.update(counters(0, 0, 0, 0, 0, 0, 0))
    assert est.update(counters(2, 0.8, 2, 0.1, 0.0, 100, 300)) is None  # 2 ended: open
    costs = est.update(counters(4, 1.6, 4, 0.2, 0.0, 200, 600))  # 4 ended since the first
    assert costs is not None
    assert costs.hold_s == pytest.approx(0.4)
    assert costs.hit_share == pytest.approx(200 / 600)
    assert costs.hit_saving_s == pytest.approx(50 * 0.2 / 400)  # 50 hit a request, 400 computed
    again = est.update(counters(6, 2.4, 6, 0.3, 0.0, 300, 900))  # a new window: 2, open
    assert again == Costs(costs.hold_s, costs.hit_saving_s, None)


def test_the_costs_are_smoothed_over_polls() -> None:
    est = CostEstimator()
    est.update(counters(0, 0, 0, 0, 0, 0, 0))
    est.update(counters(10, 3.0, 10, 0.1, 0.0, 0, 2_000))  # hold 0.3
    costs = est.update(counters(20, 7.0, 20, 0.2, 0.0, 0, 4_000))  # hold 0.4 this time
    assert costs is not None and costs.hold_s == pytest.approx(0.3 + 0.3 * 0.1)
    assert costs.hit_saving_s == 0.0  # nothing hits there: no saving to wait for


def test_a_replica_that_never_computes_enough_tokens_has_no_per_token_cost() -> None:
    est = CostEstimator()
    est.update(counters(0, 0, 0, 0, 0, 0, 0))
    assert est.update(counters(10, 3.0, 10, 0.1, 0.0, 10_000, 10_100)) is None


# ---- the poller ------------------------------------------------------------------------


def page(n: int) -> str:
    """A replica's /metrics after ``n`` x 10 requests like the test's above."""
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        "vllm:num_requests_running 2.0",
        "# TYPE vllm:num_requests_waiting gauge",
        "vllm:num_requests_waiting 0.0",
        "# TYPE vllm:prefix_cache_queries counter",
        f"vllm:prefix_cache_queries_total {11_000 * n}.0",
        "# TYPE vllm:prefix_cache_hits counter",
        f"vllm:prefix_cache_hits_total {10_000 * n}.0",
    ]
    for name, total in ((E2E, 3.4), (TTFT, 0.25), (QUEUE, 0.2)):
        lines += [
            f"# TYPE {name} histogram",
            f'{name}_bucket{{le="+Inf"}} {10 * n}.0',
            f"{name}_count {10 * n}.0",
            f"{name}_sum {total * n}",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
async def replica() -> AsyncIterator[tuple[str, list[int]]]:
    polls = [0]

    async def metrics(_: web.Request) -> web.Response:
        polls[0] += 1
        return web.Response(text=page(polls[0]))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", polls
    await runner.cleanup()


async def test_the_poller_gives_each_replica_its_costs(replica: tuple[str, list[int]]) -> None:
    url, _ = replica
    balancers = {"east": ReplicaBalancer([url, B], slots=2)}
    poller = ReplicaLoadPoller(balancers, timeout_s=0.5)
    async with aiohttp.ClientSession() as http:
        await poller.poll(http)
        balancers["east"].acquire(url, now=0.0)
        balancers["east"].acquire(url, now=0.0)
        assert balancers["east"].wait_s(url, now=0.3) is None  # no costs yet
        await poller.poll(http)
    assert balancers["east"].wait_s(url, now=0.3) == pytest.approx(0.02)


def test_without_reports_the_ranks_kept_stay_bounded() -> None:
    sent = SentKeys(track=4)
    for k in range(MAX_RANKS + 100):
        sent.sent(k % 8)
    assert len(sent._ranks) == MAX_RANKS and len(sent._keys) == 4
