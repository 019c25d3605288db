"""The leader's check of the agents as a job (issue 35): checks bounded in number,
reports written in fenced batches of at most MAX_TXN_OPS puts as checks end, a partial
batch not held back by a hanging check, one sweep at a time and one per probe interval.

Everything runs on an event loop with a fake clock; nothing here waits on real time
(the linger is 0 where a test needs it to pass) or asserts how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from controlplane.election import NotLeader
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.model import Health, HealthReport, ObserverKind
from controlplane.kernel.store.port import MAX_TXN_OPS, StoreError
from controlplane.probe import AgentProber
from controlplane.probe_job import ProbeJob, ReportBatches
from controlplane.reports import PROBE_OBSERVER
from tests.unit.world import World


def probe_report(region: str, at: float = 0.0) -> HealthReport:
    return HealthReport(
        region=region,
        observer=PROBE_OBSERVER,
        kind=ObserverKind.PROBE,
        health=Health.HEALTHY,
        received_at=at,
    )


def many(n: int) -> Topology:
    return parse_topology(
        {
            "cluster": "t",
            "regions": [
                {
                    "name": f"r{i:03d}",
                    "zone": "z",
                    "agent": f"127.0.0.1:{2000 + i}",
                    "capacity_rps": 10,
                }
                for i in range(n)
            ],
        }
    )


class Recorder:
    """A store's side of the batches: each write recorded; ``gate`` holds writes."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.gate: asyncio.Event | None = None
        self.refuse: Exception | None = None

    async def write(self, reports: Sequence[HealthReport]) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.refuse is not None:
                raise self.refuse
            self.batches.append([r.region for r in reports])
        finally:
            self.in_flight -= 1


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


# ---- batches ---------------------------------------------------------------------------


async def test_a_sweeps_reports_go_in_batches_of_at_most_max_txn_ops() -> None:
    rec = Recorder()
    batches = ReportBatches(rec.write, linger_s=60.0)
    writer = asyncio.create_task(batches.drain())
    for i in range(300):
        batches.add(probe_report(f"r{i}"))
    batches.close()
    await writer
    assert [len(b) for b in rec.batches] == [MAX_TXN_OPS, MAX_TXN_OPS, 300 - 2 * MAX_TXN_OPS]
    assert [r for b in rec.batches for r in b] == [
        f"r{i}" for i in range(300)
    ]  # each once, in order


async def test_a_full_batch_is_written_while_the_sweep_still_runs() -> None:
    rec = Recorder()
    batches = ReportBatches(rec.write, linger_s=60.0)  # no linger: only fullness writes
    writer = asyncio.create_task(batches.drain())
    for i in range(MAX_TXN_OPS + 3):
        batches.add(probe_report(f"r{i}"))
    await turns()
    assert [len(b) for b in rec.batches] == [MAX_TXN_OPS]  # the 3 wait for more, or the end
    batches.close()
    await writer
    assert [len(b) for b in rec.batches] == [MAX_TXN_OPS, 3]


async def test_a_partial_batch_is_written_after_its_linger_not_held_by_a_hanging_check() -> None:
    rec = Recorder()
    batches = ReportBatches(rec.write, linger_s=0.0)
    writer = asyncio.create_task(batches.drain())
    await turns()
    assert rec.batches == []  # nothing to write: an empty batch does not linger
    for r in ("a", "b"):
        batches.add(probe_report(r))
    await turns()  # the sweep is not over (a dead agent's check still runs)
    assert rec.batches == [["a", "b"]]
    batches.close()
    await writer
    assert rec.batches == [["a", "b"]]


async def test_one_write_is_in_flight_at_a_time_and_what_arrives_meanwhile_joins_the_next() -> None:
    rec = Recorder()
    rec.gate = asyncio.Event()
    batches = ReportBatches(rec.write, linger_s=60.0)
    writer = asyncio.create_task(batches.drain())
    for i in range(MAX_TXN_OPS):
        batches.add(probe_report(f"a{i}"))
    await turns()  # the first batch is being written, held at the gate
    for i in range(MAX_TXN_OPS + 1):
        batches.add(probe_report(f"b{i}"))
    batches.close()
    rec.gate.set()
    await writer
    assert rec.most_in_flight == 1
    assert [len(b) for b in rec.batches] == [MAX_TXN_OPS, MAX_TXN_OPS, 1]


# ---- the prober's sweep ----------------------------------------------------------------


class HeldProber(AgentProber):
    """The real sweep over fake checks: each waits until the test lets its region
    answer; the clock moves as checks end."""

    def __init__(self, topology: Topology, clock: FakeClock, concurrency: int) -> None:
        super().__init__(topology, clock, concurrency=concurrency)
        self.released: dict[str, asyncio.Event] = {n: asyncio.Event() for n in topology.names}
        self.running = 0
        self.most_at_once = 0
        self.fake_clock = clock

    async def check(self, region: str) -> tuple[Health, str]:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await self.released[region].wait()
            self.fake_clock.advance(0.5)
            return Health.HEALTHY, "agent SERVING"
        finally:
            self.running -= 1


async def test_the_sweep_checks_every_agent_with_at_most_concurrency_in_flight() -> None:
    topo, clock = many(40), FakeClock(100.0)
    prober = HeldProber(topo, clock, concurrency=8)
    got: list[HealthReport] = []
    sweep = asyncio.create_task(prober.sweep(got.append))
    await turns()
    assert prober.running == 8  # the bound, not all 40
    dead = topo.names[0]  # its check hangs: it holds one slot, not the sweep
    for n in topo.names[1:]:
        prober.released[n].set()
        await turns(3)
    assert prober.most_at_once == 8
    assert sorted(r.region for r in got) == sorted(topo.names[1:])
    assert not sweep.done()
    prober.released[dead].set()
    await sweep
    assert [r.region for r in got][-1] == dead
    assert len({r.received_at for r in got}) == len(got)  # stamped when each check ended
    assert all(r.observer == PROBE_OBSERVER and r.kind is ObserverKind.PROBE for r in got)
    await prober.close()


# ---- the job ---------------------------------------------------------------------------


class ListProber:
    """A sweep of ``regions`` whose reports come at once, or after ``hold`` is set."""

    def __init__(self, regions: Sequence[str]) -> None:
        self.regions = regions
        self.hold: asyncio.Event | None = None
        self.sweeps = 0

    async def sweep(self, report: Callable[[HealthReport], None]) -> None:
        self.sweeps += 1
        if self.hold is not None:
            await self.hold.wait()
        for r in self.regions:
            report(probe_report(r))


async def test_one_sweep_at_a_time_and_none_within_a_quarter_interval_of_the_last() -> None:
    clock, rec, prober = FakeClock(100.0), Recorder(), ListProber(["a", "b"])
    prober.hold = asyncio.Event()
    job = ProbeJob(prober, rec.write, interval_s=1.0, now=clock.now)
    assert job.start()
    clock.advance(5.0)
    assert not job.start()  # one still runs, however long it has taken
    prober.hold.set()
    await turns()
    assert rec.batches == [["a", "b"]]
    assert job.start()  # it ended, and 5 s passed since it started: at once
    await turns()
    clock.advance(0.2)
    assert not job.start()  # ended, but a burst of woken ticks runs no sweep after sweep
    clock.advance(0.05)
    assert job.start()  # a quarter of the interval after the last start: a woken tick's
    await turns()
    clock.advance(-50.0)  # the wall clock went back: due, not stuck for 50 s
    assert job.start()
    await turns()
    assert prober.sweeps == job.sweeps == 4
    await job.stop()


async def test_a_refused_batch_ends_the_sweep_and_is_the_next_ticks_refusal() -> None:
    clock, rec, prober = FakeClock(100.0), Recorder(), ListProber([f"r{i}" for i in range(300)])
    rec.refuse = StoreError("etcdserver: mvcc: database space exceeded")
    job = ProbeJob(prober, rec.write, interval_s=1.0, now=clock.now)
    job.start()
    await turns()
    assert job.refused is not None and "space exceeded" in str(job.refused)
    rec.refuse = None
    clock.advance(1.0)
    job.start()
    await turns()
    assert job.refused is None  # a sweep stored: nothing refused any more
    assert sum(len(b) for b in rec.batches) == 300


async def test_a_deposed_leaders_sweep_stops_quietly() -> None:
    clock, rec, prober = FakeClock(100.0), Recorder(), ListProber(["a"])
    rec.refuse = NotLeader("lost the lease")
    job = ProbeJob(prober, rec.write, interval_s=1.0, now=clock.now)
    job.start()
    await turns()
    assert job.refused is None  # not a store refusal: the next tick stops the checks
    await job.stop()
    assert job.start()  # a new term starts at once


async def test_stop_cancels_a_running_sweep() -> None:
    clock, rec, prober = FakeClock(100.0), Recorder(), ListProber(["a"])
    prober.hold = asyncio.Event()
    job = ProbeJob(prober, rec.write, interval_s=1.0, now=clock.now)
    job.start()
    await turns()
    await job.stop()
    prober.hold.set()
    await turns()
    assert rec.batches == []  # cancelled before it reported anything


@pytest.mark.parametrize("n", [1, MAX_TXN_OPS, 2 * MAX_TXN_OPS + 5])
async def test_the_reports_land_under_the_fence_in_the_stores_transaction_limit(n: int) -> None:
    """Through the real orchestrator into the in-memory store, which refuses a
    transaction of more than MAX_TXN_OPS operations, as etcd does."""
    w = World()
    regions = [f"r{i:03d}" for i in range(n)]
    txns: list[int] = []
    txn = w.store.txn

    async def counting(compares, success, failure=()):  # type: ignore[no-untyped-def]
        txns.append(len(success))
        return await txn(compares, success, failure)

    w.store.txn = counting  # type: ignore[method-assign]
    job = ProbeJob(ListProber(regions), w.orchestrator.write_reports, interval_s=1.0, now=lambda: 0)
    job.start()
    await turns()
    assert job.refused is None
    page = await w.store.get_prefix(w.keys.reports_prefix())
    assert len(page.kvs) == n
    assert all(t <= MAX_TXN_OPS for t in txns) and len(txns) == -(-n // MAX_TXN_OPS)
