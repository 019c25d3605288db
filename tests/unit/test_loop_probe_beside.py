"""The leader's check of the agents runs beside the ticks, not inside one: in a blackout
the dead agent's check waits out its timeout, and the tick that fails the region over
must not wait with it. A real loop, orchestrator and in-memory store (the unit world's),
and a prober whose check of the dead agent never answers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controlplane.kernel.model import Health, HealthReport
from controlplane.kernel.store.port import Compare, StoreError
from controlplane.loop import ReconcileLoop
from tests.unit.world import World

REGIONS = ("us-east", "us-west", "us-central", "eu-west")


class Leader:
    is_leader = True

    def fence(self) -> list[Compare]:
        return []

    async def wait_changed(self) -> bool:
        await asyncio.Event().wait()
        return True


class DeadAgentProber:
    """Each check hangs, as one of an agent that no longer answers does until its
    deadline; counts the checks started and how many run at once."""

    def __init__(self) -> None:
        self.started = 0
        self.running = 0
        self.most_at_once = 0
        self.answer = asyncio.Event()
        self.refuse: StoreError | None = None

    async def sweep(self, report: Callable[[HealthReport], None]) -> None:
        self.started += 1
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await self.answer.wait()
            if self.refuse is not None:
                raise self.refuse
        finally:
            self.running -= 1


async def turns(n: int = 10) -> None:
    """Turns of the event loop, no time: a sweep ends in a few (its writer's with it)."""
    for _ in range(n):
        await asyncio.sleep(0)


def loop_over(w: World, prober: DeadAgentProber) -> ReconcileLoop:
    return ReconcileLoop(w.orchestrator, Leader(), prober=prober)


async def ticks(w: World, loop: ReconcileLoop, n: int, down: str | None = None) -> None:
    for _ in range(n):
        w.now += 1.0
        for r in REGIONS:
            w.all_report(r, Health.UNHEALTHY if r == down else Health.HEALTHY)
        await w._push()
        async with asyncio.timeout(5.0):  # a tick that waited for the check would hang
            await loop.tick()
        await w._pull()
        await asyncio.sleep(0)  # a turn of the event loop between ticks, as in run()


def test_a_hanging_check_of_a_dead_agent_delays_no_tick_and_the_region_fails_over() -> None:
    w, prober = World(), DeadAgentProber()

    async def main() -> None:
        loop = loop_over(w, prober)
        await ticks(w, loop, 3)
        assert prober.started == 1  # one check, still hanging: no tick waited for it
        await ticks(w, loop, 3, down="us-east")  # the agent's and the probe's votes
        assert w.state("us-east") == "FAILING_OVER"
        assert prober.started == 1 and prober.most_at_once == 1  # never two at once
        prober.answer.set()  # the check times out at last
        await turns()  # the sweep and its writer end
        await ticks(w, loop, 1, down="us-east")
        assert prober.started == 2  # the next tick starts the next check
        await loop.stop_probe()

    asyncio.run(main())


def test_a_check_whose_reports_the_store_refused_counts_as_the_ticks_refusal() -> None:
    w, prober = World(), DeadAgentProber()

    async def main() -> None:
        loop = loop_over(w, prober)
        prober.refuse = StoreError("permission denied")
        prober.answer.set()
        await ticks(w, loop, 1)  # starts the check; it fails right after
        await turns()
        await loop.tick_once()  # the tick completes, its check's refusal counts
        assert not loop.writes.writable
        assert "permission denied" in loop.writes.view().reason
        prober.refuse = None
        w.now += 1.0  # a probe interval later
        await loop.tick_once()  # starts a check that stores its reports
        await turns()
        await loop.tick_once()
        assert loop.writes.writable
        await loop.stop_probe()

    asyncio.run(main())
