"""A launch the pool's targets no longer want is cancelled (regions/pool/plan_phases.py's
CANCEL phase, ``WarmPool``, the launchers' ``_started``), on real processes: a replica
whose start-up hangs (a process that never prints READY, as a vLLM loading weights for
minutes), the pool's sizes lowered while it loads. The reconcile that launched it
returns, the process is killed rather than left to its ready timeout, and the slot
is COLD and free: the next launch there brings up a real simulator."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence

from chaos.lab.procs import until
from regions.pool.launchers import SimulatorLauncher
from regions.pool.manager import WarmPool
from regions.pool.processes import ServerProcess, start_process
from regions.pool.states import PoolConfig, ReplicaState

COLD, WARM = ReplicaState.COLD, ReplicaState.WARM


class HangingLauncher(SimulatorLauncher):
    """Simulators, but while ``hang`` its processes never get ready (a 600 s sleep that
    prints nothing): a launch then waits for its ready timeout (600 s here)."""

    def __init__(self) -> None:
        super().__init__(ready_timeout_s=600.0, name="cancel-sim")
        self.hang = True
        self.started: list[ServerProcess] = []

    def _spawn(self, args: Sequence[str]) -> ServerProcess:
        if not self.hang:
            return super()._spawn(args)
        argv = [sys.executable, "-c", "import time; time.sleep(600)"]
        proc = start_process(argv, "cancel-hang", stdout_pipe=True)
        self.started.append(proc)
        return proc


def holds(check: Callable[[], object]) -> Callable[[], Awaitable[bool]]:
    """``check`` as the async predicate :func:`chaos.lab.procs.until` polls."""

    async def predicate() -> bool:
        return bool(check())

    return predicate


async def test_a_launch_no_longer_wanted_is_cancelled_and_its_process_killed() -> None:
    launcher = HangingLauncher()
    pool = WarmPool(launcher, PoolConfig(active=0, warm=1))
    try:
        launching = asyncio.ensure_future(pool.reconcile())
        await until(holds(lambda: launcher.started), what="the launch started")
        (slot,) = pool.snapshot().replicas
        assert slot.state is COLD and slot.busy
        proc = launcher.started[0]

        await pool.set_sizes(0, 0)  # the standby is no longer wanted while it loads
        snap = await asyncio.wait_for(launching, 60)
        # killed, where the start would have waited out its ready timeout (600 s)
        await until(holds(lambda: not proc.alive()), what="the cancelled process gone")
        (slot,) = snap.replicas
        assert (slot.state, slot.busy, slot.url) == (COLD, False, None)

        launcher.hang = False  # the slot is free: wanted again, a real simulator comes up
        await pool.set_sizes(0, 1)
        (slot,) = (await asyncio.wait_for(pool.reconcile(), 60)).replicas
        assert slot.state is WARM and slot.url is not None
        assert launcher.process(slot.url) is not None
    finally:
        await pool.stop()
    assert all(not p.alive() for p in launcher.started)


async def test_a_launch_still_wanted_is_not_cancelled_by_a_plan_that_keeps_it() -> None:
    """The same hanging launch, the sizes set again to what they were: nothing is
    cancelled, the launch is still in flight (the process alive, the slot busy)."""
    launcher = HangingLauncher()
    pool = WarmPool(launcher, PoolConfig(active=0, warm=1))
    launching = asyncio.ensure_future(pool.reconcile())
    try:
        await until(holds(lambda: launcher.started), what="the launch started")
        await pool.set_sizes(0, 1)
        await asyncio.sleep(0.5)
        assert not launching.done()
        assert launcher.started[0].alive()
        assert pool.snapshot().replicas[0].busy
    finally:
        launching.cancel()  # as the agent does when it stops: the launch goes with it
        await asyncio.gather(launching, return_exceptions=True)
        await pool.stop()
    await until(holds(lambda: not launcher.started[0].alive()), what="the process gone")
