"""The drill service on a real etcd: one drill at a time across services, history, lock
release on failure, a dead holder's lock expiring, and ``serve()`` running a due entry
once. Only the drill itself is faked (``FakeRunner`` stands in for chaos.drills.runner); the
lock, its lease and the history are real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import pytest

from chaos.drills.result import DrillResult
from chaos.drills.schedule import Schedule, parse_schedule
from chaos.drills.service import (
    DrillBusy,
    DrillLock,
    DrillService,
    LockLost,
    ProbeOutcome,
    history,
)
from chaos.lab.local_etcd import EtcdServer
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import decode
from controlplane.kernel.drills import CAPACITY_PROBE
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import AuditEntry
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import Put
from controlplane.kernel.store.settings import EtcdConfig

pytestmark = pytest.mark.etcd

TUESDAY_0300 = datetime(2026, 3, 3, 3, 0, tzinfo=UTC).timestamp()
SCHEDULE = parse_schedule(
    {
        "windows": [{"days": "tue", "start": "02:00", "end": "05:00"}],
        "entries": [{"scenario": "region-blackout", "cron": "0 3 * * 2"}],
    }
)


class FakeRunner:
    """Stands in for chaos.drills.runner's run_drill: records calls, waits on ``gate`` if
    given, then fails with ``error`` or returns a result stamped by ``clock``."""

    def __init__(
        self, clock: FakeClock, gate: asyncio.Event | None = None, error: Exception | None = None
    ) -> None:
        self.clock, self.gate, self.error = clock, gate, error
        self.calls: list[tuple[str, str | None]] = []
        self.started = asyncio.Event()
        self.cancelled = False

    async def __call__(
        self, name: str, region: str | None, *, dry_run: bool = False
    ) -> DrillResult:
        self.calls.append((name, region))
        self.started.set()
        started = self.clock.now()
        try:
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.error is not None:
            raise self.error
        return DrillResult(
            id=f"drill-{len(self.calls)}",
            scenario=name,
            title=name,
            region=region or "us-east",
            started_at=started,
            ended_at=self.clock.now() + 1.0,
            passed=True,
        )


@pytest.fixture
async def connect(etcd: EtcdServer) -> AsyncIterator[Callable[[], Awaitable[EtcdStore]]]:
    """Opens stores on the session etcd (one per simulated process); closes them after."""
    opened: list[EtcdStore] = []

    async def open_one() -> EtcdStore:
        store = EtcdStore(EtcdConfig(endpoints=etcd.endpoints, request_timeout_s=2.0))
        await store.connect()
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.close()


def service(
    store: EtcdStore,
    keys: Keys,
    runner: FakeRunner,
    holder: str,
    *,
    schedule: Schedule = SCHEDULE,
    ttl: int = 2,
    tick_s: float = 0.05,
) -> DrillService:
    return DrillService(
        store, keys, schedule, runner, runner.clock, holder=holder, tick_s=tick_s, lock_ttl_s=ttl
    )


async def until(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Poll ``check`` (an etcd read) until it holds; fail after ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_one_drill_at_a_time_across_services(
    connect: Callable[[], Awaitable[EtcdStore]], keys: Keys
) -> None:
    store_a, store_b = await connect(), await connect()
    clock = FakeClock(TUESDAY_0300)
    gate = asyncio.Event()
    runner_a, runner_b = FakeRunner(clock, gate), FakeRunner(clock)
    a, b = service(store_a, keys, runner_a, "svc-a"), service(store_b, keys, runner_b, "svc-b")

    running = asyncio.create_task(a.run_once("region-blackout", "eu-west"))
    await asyncio.wait_for(runner_a.started.wait(), 5)
    with pytest.raises(DrillBusy, match="held by svc-a") as busy:
        await b.run_once("auth-503-storm")
    assert busy.value.lock is not None
    assert (busy.value.lock.scenario, busy.value.lock.region) == ("region-blackout", "eu-west")
    assert "drill region-blackout on eu-west (manual) is running" in str(busy.value)
    assert runner_b.calls == []  # nothing started
    lock_kv = await store_b.get(keys.drill_lock())
    assert lock_kv is not None and lock_kv.lease != 0  # on the holder's lease
    assert decode(DrillLock, lock_kv.value).holder == "svc-a"

    gate.set()
    first = await asyncio.wait_for(running, 5)
    assert first.passed and first.trigger == "manual" and first.region == "eu-west"
    assert await store_b.get(keys.drill_lock()) is None  # released with the history write

    second = await b.run_once("auth-503-storm")
    assert await store_a.get(keys.drill_lock()) is None
    rows = await history(store_a, keys, 10)
    assert [r.id for r in rows] == [second.id, first.id]  # newest first
    assert [r.scenario for r in rows] == ["auth-503-storm", "region-blackout"]
    assert len(await history(store_a, keys, 1)) == 1
    audit = await store_a.get_prefix(keys.audit_prefix())
    entries = [decode(AuditEntry, kv.value) for kv in audit.kvs]
    assert [(e.action, e.actor, e.details["drill"]) for e in entries] == [
        ("drill_run", "svc-a", first.id),
        ("drill_run", "svc-b", second.id),
    ]
    # History and audit share one sortable id.
    hist = await store_a.get_prefix(keys.drill_history_prefix())
    ids = [kv.key.removeprefix(keys.drill_history_prefix()) for kv in hist.kvs]
    assert ids == [kv.key.removeprefix(keys.audit_prefix()) for kv in audit.kvs]


async def test_failing_drill_releases_the_lock_and_is_recorded_as_failed(
    connect: Callable[[], Awaitable[EtcdStore]], keys: Keys
) -> None:
    # Decision: a drill that raises is recorded (passed: false, aborted: "error: ...") so
    # that history shows the attempt and the schedule does not retry it all night; the
    # error is re-raised to the caller.
    store = await connect()
    clock = FakeClock(TUESDAY_0300)
    svc = service(store, keys, FakeRunner(clock, error=RuntimeError("vLLM exploded")), "svc-a")
    with pytest.raises(RuntimeError, match="vLLM exploded"):
        await svc.run_once("region-blackout")
    assert await store.get(keys.drill_lock()) is None
    (row,) = await history(store, keys)
    assert (row.passed, row.trigger, row.scenario) == (False, "manual", "region-blackout")
    assert row.aborted == "error: RuntimeError: vLLM exploded"
    # The lock is free for the next drill.
    ok = service(store, keys, FakeRunner(clock), "svc-b")
    assert (await ok.run_once("region-blackout")).passed


async def test_cancelled_run_releases_the_lock_and_records_nothing(
    connect: Callable[[], Awaitable[EtcdStore]], keys: Keys
) -> None:
    store = await connect()
    runner = FakeRunner(FakeClock(TUESDAY_0300), asyncio.Event())
    task = asyncio.create_task(service(store, keys, runner, "svc-a").run_once("region-blackout"))
    await asyncio.wait_for(runner.started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runner.cancelled
    assert await store.get(keys.drill_lock()) is None
    assert await history(store, keys) == []


async def test_dead_holders_lock_frees_after_the_lease_ttl(
    connect: Callable[[], Awaitable[EtcdStore]], keys: Keys
) -> None:
    store_a, store_b = await connect(), await connect()
    clock = FakeClock(TUESDAY_0300)
    runner_a = FakeRunner(clock, asyncio.Event())
    a = service(store_a, keys, runner_a, "svc-a", ttl=2)
    b = service(store_b, keys, FakeRunner(clock), "svc-b", ttl=2)
    running = asyncio.create_task(a.run_once("region-blackout"))
    await asyncio.wait_for(runner_a.started.wait(), 5)

    # "Kill" A: its connection goes away, so no keep-alive and no revoke reach etcd.
    await store_a.close()
    with pytest.raises(DrillBusy, match="svc-a"):
        await b.run_once("region-blackout")

    async def free() -> bool:
        try:
            await b.run_once("region-blackout")
        except DrillBusy:
            return False
        return True

    # freed by the lease's expiry (ttl 2 s, plus etcd's sweep): a ceiling, not a measure
    await until(free, within=15)
    # A noticed it lost the lock and stopped its drill.
    with pytest.raises(LockLost):
        await asyncio.wait_for(running, 5)
    assert runner_a.cancelled
    assert [r.trigger for r in await history(store_b, keys)] == ["manual"]


async def test_holder_stops_its_drill_when_its_lease_is_revoked(
    connect: Callable[[], Awaitable[EtcdStore]], keys: Keys
) -> None:
    store_a, store_b = await connect(), await connect()
    runner = FakeRunner(FakeClock(TUESDAY_0300), asyncio.Event())
    running = asyncio.create_task(
        service(store_a, keys, runner, "svc-a", ttl=3).run_once("region-blackout")
    )
    await asyncio.wait_for(runner.started.wait(), 5)
    kv = await store_b.get(keys.drill_lock())
    assert kv is not None
    await store_b.revoke_lease(kv.lease)  # an operator clears a stuck lock
    with pytest.raises(LockLost, match="lease"):
        await asyncio.wait_for(running, 5)
    assert runner.cancelled
    (row,) = await history(store_a, keys)
    assert not row.passed and row.aborted.startswith("error: LockLost")


async def test_serve_runs_a_due_entry_exactly_once(
    connect: Callable[[], Awaitable[EtcdStore]], keys: Keys
) -> None:
    # Two services serve the same schedule, as two replicas of the runner would.
    store_a, store_b = await connect(), await connect()
    clock = FakeClock(TUESDAY_0300 + 10)
    runner_a, runner_b = FakeRunner(clock), FakeRunner(clock)
    a, b = service(store_a, keys, runner_a, "svc-a"), service(store_b, keys, runner_b, "svc-b")

    async def runs() -> int:
        return len(await history(store_a, keys, None))

    async with asyncio.TaskGroup() as tg:
        serving = [tg.create_task(a.serve()), tg.create_task(b.serve())]
        await until(lambda: _ge(runs(), 1))
        await asyncio.sleep(0.5)  # ~10 more ticks each
        assert len(runner_a.calls) + len(runner_b.calls) == 1

        clock.advance(7 * 86_400)  # next Tuesday
        await until(lambda: _ge(runs(), 2))
        await asyncio.sleep(0.5)
        assert len(runner_a.calls) + len(runner_b.calls) == 2
        for task in serving:
            task.cancel()

    rows = await history(store_a, keys, None)
    assert [r.trigger for r in rows] == ["schedule", "schedule"]
    assert [(r.scenario, r.region) for r in rows] == [("region-blackout", "us-east")] * 2
    assert await store_a.get(keys.drill_lock()) is None


async def _ge(count: Awaitable[int], n: int) -> bool:
    return await count >= n


async def test_tick_waits_for_a_running_drill_then_runs(
    connect: Callable[[], Awaitable[EtcdStore]], keys: Keys
) -> None:
    store = await connect()
    clock = FakeClock(TUESDAY_0300 + 60)
    gate = asyncio.Event()
    manual = service(store, keys, FakeRunner(clock, gate), "svc-manual")
    runner = FakeRunner(clock)
    scheduler = service(store, keys, runner, "svc-sched")

    running = asyncio.create_task(manual.run_once("latency-injection"))
    await asyncio.sleep(0.2)
    report = await scheduler.tick()
    assert report.due == ("region-blackout",)
    assert (report.ran, report.outcome) == ("region-blackout", "busy")
    gate.set()
    await running

    report = await scheduler.tick()
    assert report.outcome == "passed" and runner.calls == [("region-blackout", None)]
    report = await scheduler.tick()
    assert (report.due, report.outcome) == ((), "idle")

    clock.advance(2 * 3600)  # 05:01: past the window, nothing more to do this week
    assert (await scheduler.tick()).outcome == "idle"


class FakeProber:
    """Stands in for chaos.capacity.service.CapacityProber: records calls and returns a
    passing probe whose writes (a stand-in for capacity/<r>) go in with its history."""

    def __init__(self, clock: FakeClock, keys: Keys, lock_seen: list[bool], store: EtcdStore):
        self.clock, self.keys, self.lock_seen, self.store = clock, keys, lock_seen, store
        self.calls: list[tuple[str, str | None]] = []

    async def __call__(self, region: str, replica: str | None, *, dry_run: bool = False):  # type: ignore[no-untyped-def]
        self.calls.append((region, replica))
        self.lock_seen.append(await self.store.get(self.keys.drill_lock()) is not None)
        result = DrillResult(
            id=f"probe-{len(self.calls)}",
            scenario=CAPACITY_PROBE,
            title="probe",
            region=region,
            started_at=self.clock.now(),
            ended_at=self.clock.now() + 1.0,
            passed=True,
        )
        return ProbeOutcome(result=result, writes=(Put(self.keys.capacity(region), b"{}"),))


async def test_a_scheduled_capacity_probe_runs_in_its_window_under_the_drill_lock(
    connect: Callable[[], Awaitable[EtcdStore]], keys: Keys
) -> None:
    store = await connect()
    clock = FakeClock(TUESDAY_0300 + 10)
    schedule = parse_schedule(
        {
            "windows": [{"days": "tue", "start": "02:00", "end": "05:00"}],
            "entries": [{"scenario": CAPACITY_PROBE, "region": "eu-west", "cron": "0 3 * * 2"}],
        }
    )
    lock_seen: list[bool] = []
    prober = FakeProber(clock, keys, lock_seen, store)
    runner = FakeRunner(clock)
    svc = DrillService(
        store, keys, schedule, runner, clock, holder="svc", tick_s=0.05, lock_ttl_s=2, probe=prober
    )
    report = await svc.tick()
    assert report.ran == f"{CAPACITY_PROBE}@eu-west" and report.outcome == "passed"
    assert prober.calls == [("eu-west", None)] and not runner.calls  # not a drill's runner
    assert lock_seen == [True]  # never beside a drill: it held the lock
    # its writes went in with its history row, and the lock is released
    assert await store.get(keys.capacity("eu-west")) is not None
    [row] = await history(store, keys, None)
    assert (row.scenario, row.region, row.trigger) == (CAPACITY_PROBE, "eu-west", "schedule")
    assert await store.get(keys.drill_lock()) is None
    assert (await svc.tick()).outcome == "idle"  # once per occurrence


async def test_a_capacity_probe_without_a_prober_fails_saying_what_to_do(
    connect: Callable[[], Awaitable[EtcdStore]], keys: Keys
) -> None:
    store = await connect()
    clock = FakeClock(TUESDAY_0300 + 10)
    svc = service(store, keys, FakeRunner(clock), "svc")
    with pytest.raises(ValueError, match="start it with --topology"):
        await svc.run_once(CAPACITY_PROBE, "eu-west")
    [row] = await history(store, keys, None)
    assert not row.passed and "--topology" in row.aborted
