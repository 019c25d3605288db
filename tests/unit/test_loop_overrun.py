"""A tick that takes longer than its period (issue 35 item 3) degrades gracefully.

What happens: the tick completes (it is cut only past period + 2 x retry timeout), its
duration goes into the histogram and a warning; the next tick starts at once, once, and
the periods it missed are dropped, not replayed (``TickSchedule``); ticks never overlap.
No safety rule is skipped and no step is taken twice, because each tick decides on
what etcd holds when it starts: a health streak counts evaluations, not elapsed
periods, so a slow tick brings no failover forward; a transition or a routing switch
written by a slow tick, or by one cut after its write landed, is in the next tick's
snapshot, and the next tick's CAS is against it.

The schedule is driven on a fake clock; the ticks are the real loop's over the unit
world's in-memory store, whose reads move the world's fake clock forward (a slow etcd).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from controlplane.kernel.model import Health
from controlplane.kernel.store.port import Compare, Op, Page, TxnResult
from controlplane.loop import ReconcileLoop
from controlplane.tick_schedule import TickSchedule
from tests.unit.world import World, topology

REGIONS = ("us-east", "us-west", "us-central", "eu-west")


# ---- the schedule ----------------------------------------------------------------------


def starts(durations: Sequence[float], period: float = 1.0) -> list[float]:
    """When each tick starts, the loop waiting as ``run`` does, on a fake clock."""
    now, schedule, out = 0.0, TickSchedule(period, 0.0), []
    for took in durations:
        out.append(now)
        now += took
        now += schedule.ended(now)
    return out


def test_ticks_keep_a_fixed_rate_whatever_each_costs() -> None:
    assert starts([0.1, 0.9, 0.0, 0.5]) == [0.0, 1.0, 2.0, 3.0]


def test_an_overrun_is_followed_by_one_tick_at_once_and_its_missed_periods_are_dropped() -> None:
    # The second tick takes 2.5 periods: the third starts as it ends (3.5), not at 2.0
    # and 3.0 as well (no burst of make-up ticks), and the rate resumes from there.
    assert starts([0.1, 2.5, 0.1, 0.1, 0.1]) == [0.0, 1.0, 3.5, 4.5, 5.5]


def test_a_woken_tick_does_not_push_the_periodic_one_back() -> None:
    schedule = TickSchedule(1.0, 0.0)
    assert schedule.ended(0.1) == pytest.approx(0.9)  # the first tick, then 0.9 to wait
    assert schedule.ended(0.5) == pytest.approx(0.5)  # woken at 0.4, ended at 0.5
    assert schedule.ended(1.1) == pytest.approx(0.9)  # the periodic one, due at 1.0


# ---- the real loop ---------------------------------------------------------------------


class Leader:
    is_leader = True

    def fence(self) -> list[Compare]:
        return []

    async def wait_changed(self) -> bool:
        await asyncio.Event().wait()
        return True


class SlowReads:
    """The world's store, each tick's snapshot reads taking ``delay`` seconds of the
    world's clock (owed by ``tick``, paid by the tick's first read)."""

    def __init__(self, w: World) -> None:
        self.w, self.delay, self.owed = w, 0.0, 0.0
        self._get_prefix = w.store.get_prefix
        w.store.get_prefix = self.get_prefix  # type: ignore[method-assign]

    async def get_prefix(self, prefix: str, *, page_size: int = 10_000, revision: int = 0) -> Page:
        self.w.now += self.owed
        self.owed = 0.0
        return await self._get_prefix(prefix, page_size=page_size, revision=revision)


def loop_over(w: World) -> ReconcileLoop:
    return ReconcileLoop(w.orchestrator, Leader(), monotonic=lambda: w.now)


async def tick(
    w: World, loop: ReconcileLoop, down: str | None = None, slow: SlowReads | None = None
) -> None:
    """One tick of ``run``: the reports of the moment, then ``tick_once`` (bounded,
    timed), its jobs' turns, and the store read back into the world."""
    for r in REGIONS:
        w.all_report(r, Health.UNHEALTHY if r == down else Health.HEALTHY)
    await w._push()
    if slow is not None:
        slow.owed = slow.delay
    await loop.tick_once()
    for _ in range(10):
        await asyncio.sleep(0)
    await w._pull()


def counted(w: World, action: str, region: str) -> int:
    return sum(1 for a in w.audit if a.action == action and a.region == region)


def test_slow_ticks_count_one_evaluation_each_and_take_each_step_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tectonic.loop")
    w = World()
    slow = SlowReads(w)

    async def main() -> None:
        loop = loop_over(w)
        for _ in range(3):
            w.now += 1.0
            await tick(w, loop)
        w.now += 1.0
        await tick(w, loop, down="us-east")
        assert w.health["us-east"].bad_streak == 1
        # From here each tick's snapshot reads take 2.5 periods.
        slow.delay = 2.5
        w.now += 1.0
        await tick(w, loop, "us-east", slow)
        assert w.health["us-east"].bad_streak == 2  # one evaluation, not 2.5 periods' worth
        assert w.state("us-east") == "NORMAL"  # failure_threshold (3) still holds
        await tick(w, loop, "us-east", slow)  # the next starts as the slow one ends
        assert w.health["us-east"].bad_streak == 3
        assert w.state("us-east") == "FAILING_OVER"
        for _ in range(3):  # slow ticks go on: what is done is not done again
            await tick(w, loop, "us-east", slow)
        assert loop.ticks == 9

    asyncio.run(main())
    assert counted(w, "transition", "us-east") == 1
    assert counted(w, "routing_switch", "us-east") == 1
    assert sum("longer than its period" in r.getMessage() for r in caplog.records) == 5


class CommitThenHang:
    """The world's store, whose reply to one transaction touching ``key`` never comes
    after the write landed (a reply lost on the way back): the tick that sent it is
    cut by its bound."""

    def __init__(self, w: World, key: str) -> None:
        self.key, self.armed, self.hung = key, False, 0
        self._txn = w.store.txn
        w.store.txn = self.txn  # type: ignore[method-assign]

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        result = await self._txn(compares, success, failure)
        if self.armed and any(op.key == self.key for op in success):
            self.armed, self.hung = False, self.hung + 1
            await asyncio.Event().wait()
        return result


def test_a_tick_cut_after_its_write_landed_is_not_repeated_by_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tectonic.loop")
    # A short period, so that the bound (period + 2 x retry timeout = 0.15 s) cuts soon.
    w = World(topo=topology(loop_period_s=0.05, retry_timeout_s=0.05))
    hang = CommitThenHang(w, w.keys.region_state("us-east"))

    async def main() -> None:
        loop = loop_over(w)
        for _ in range(3):
            w.now += 1.0
            await tick(w, loop)
        hang.armed = True
        for _ in range(5):
            w.now += 1.0
            await tick(w, loop, down="us-east")

    asyncio.run(main())
    assert hang.hung == 1
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 1  # the cut tick
    assert w.state("us-east") == "FAILING_OVER"
    assert counted(w, "transition", "us-east") == 1  # landed once, not written again
    assert counted(w, "routing_switch", "us-east") == 1
