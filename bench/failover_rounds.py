"""The failover bench's rounds, timed on one etcd watch of the deployment's prefix.

Every watch event is stamped with this process's ``time.monotonic()`` when it
arrives; kills are stamped on the same clock just before the first SIGKILL.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from pydantic import BaseModel

from bench._common import BenchError
from bench.failover_deploy import CLUSTER, PROBE_INTERVAL_S, REGIONS, Deployment, units_of
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Health, HealthReport, RegionHealth, RegionRecord, RegionState
from controlplane.kernel.model import Routing as RoutingValue
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import EventType, StoreUnavailable

M = TypeVar("M", bound=BaseModel)


# ---- watching etcd ----------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """One watch event, stamped with the bench's clock when it arrived."""

    at: float
    type: EventType
    key: str
    value: bytes
    revision: int


class Watcher:
    """One etcd watch on the deployment's prefix (audit entries left out); events
    are kept in arrival order so that rounds can search them by index."""

    def __init__(self, store: EtcdStore, keys: Keys) -> None:
        self._store = store
        self._prefix = keys.root
        self._skip = keys.audit_prefix()
        self.events: list[Seen] = []
        self._new = asyncio.Event()

    async def run(self) -> None:
        start = 0
        while True:
            try:
                async for ev in self._store.watch_prefix(self._prefix, start_revision=start):
                    start = ev.kv.mod_revision + 1
                    if not ev.kv.key.startswith(self._skip):
                        self._add(
                            Seen(time.monotonic(), ev.type, ev.kv.key, ev.kv.value, start - 1)
                        )
                return  # the store was closed
            except StoreUnavailable:
                await asyncio.sleep(0.1)

    def _add(self, seen: Seen) -> None:
        self.events.append(seen)
        new, self._new = self._new, asyncio.Event()
        new.set()

    def mark(self) -> int:
        return len(self.events)

    async def first(
        self, pred: Callable[[Seen], bool], since: int, within: float, what: str
    ) -> tuple[int, Seen]:
        """The first event at index ``since`` or later for which ``pred`` holds."""
        deadline = time.monotonic() + within
        i = since
        while True:
            while i < len(self.events):
                if pred(self.events[i]):
                    return i, self.events[i]
                i += 1
            new = self._new
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await new.wait()
            except TimeoutError:
                raise BenchError(f"{what}: not seen within {within:g} s") from None


def _value(cls: type[M], seen: Seen) -> M | None:
    if seen.type is not EventType.PUT:
        return None
    try:
        return decode(cls, seen.value, seen.key)
    except CorruptValue:
        return None


# ---- rounds -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FailoverRound:
    round: int
    region: str  # the failover unit: a region, or with pools one pool of the region
    detect_s: float  # simulators killed -> UNHEALTHY verdict seen
    switch_ms: float  # verdict seen -> routing switch seen
    agent_report_s: float | None  # killed -> the agent's UNHEALTHY report stored
    first_bad_eval_s: float | None  # killed -> first health evaluation with raw UNHEALTHY
    restore_s: float  # simulators restarted -> region NORMAL again

    def as_json(self) -> dict[str, object]:
        return {"kind": "failover", **_rounded(asdict(self))}

    def line(self, total: int) -> str:
        return (
            f"round {self.round}/{total}: {self.region} down → UNHEALTHY in "
            f"{self.detect_s:.2f} s, routing switched {self.switch_ms:.0f} ms later "
            f"(agent report {_fmt(self.agent_report_s)}, first bad evaluation "
            f"{_fmt(self.first_bad_eval_s)}); NORMAL again {self.restore_s:.1f} s after restart"
        )


@dataclass(frozen=True)
class LeaderRound:
    round: int
    killed: str
    new_leader: str
    lease_gone_s: float  # leader killed -> leader key deleted (lease expired)
    elected_s: float  # killed -> leader key put by the new holder
    leader_resume_s: float  # killed -> first fenced write of the new leader

    def as_json(self) -> dict[str, object]:
        return {"kind": "leader", **_rounded(asdict(self))}

    def line(self, total: int) -> str:
        return (
            f"leader round {self.round}/{total}: {self.killed} killed → {self.new_leader} "
            f"acting in {self.leader_resume_s:.2f} s (lease gone {self.lease_gone_s:.2f} s, "
            f"elected {self.elected_s:.2f} s)"
        )


def _rounded(d: dict[str, object]) -> dict[str, object]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}


def _fmt(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.2f} s"


@dataclass
class Bench:
    dep: Deployment
    store: EtcdStore
    watcher: Watcher
    keys: Keys = field(default_factory=lambda: Keys(CLUSTER))
    rng: random.Random = field(default_factory=random.Random)

    async def _get(self, cls: type[M], key: str) -> M | None:
        kv = await self.store.get(key)
        return None if kv is None else decode(cls, kv.value, key)

    async def region_settled(self, region: str) -> bool:
        rec = await self._get(RegionRecord, self.keys.region_state(region))
        health = await self._get(RegionHealth, self.keys.region_health(region))
        normal = rec is None or rec.state is RegionState.NORMAL
        return normal and health is not None and health.verdict is Health.HEALTHY

    async def steady(self) -> bool:
        if await self.store.get(self.keys.leader()) is None:
            return False
        return all([await self.region_settled(u) for u in self.dep.units])

    async def wait(self, pred: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while not await pred():
            if time.monotonic() > deadline:
                raise BenchError(f"{what}: not reached within {within:g} s")
            await asyncio.sleep(0.1)

    async def wait_steady(self) -> None:
        await self.wait(self.steady, 60, "every region HEALTHY and NORMAL under a leader")

    async def failover_round(self, n: int) -> list[FailoverRound]:
        """Kill every simulator of a region: with pools, each pool is timed on its own
        (all fail at once); one FailoverRound per failover unit."""
        region = REGIONS[(n - 1) % len(REGIONS)]
        await self.wait_steady()
        await asyncio.sleep(self.rng.uniform(0, PROBE_INTERVAL_S))  # any probe/tick phase
        since = self.watcher.mark()
        t0 = self.dep.kill_region(region)
        units = units_of(region, self.dep.pools)
        seen = [await self._failed_over(u, since) for u in units]
        t_restart = time.monotonic()
        await asyncio.to_thread(self.dep.restore_region, region)

        async def settled() -> bool:
            return all([await self.region_settled(u) for u in units])

        await self.wait(settled, 60, f"{region} NORMAL again")
        restore_s = time.monotonic() - t_restart
        return [
            FailoverRound(
                round=n,
                region=unit,
                detect_s=verdict_at - t0,
                switch_ms=(switched_at - verdict_at) * 1000,
                agent_report_s=None if agent_at is None else agent_at - t0,
                first_bad_eval_s=None if bad_at is None else bad_at - t0,
                restore_s=restore_s,
            )
            for unit, (verdict_at, switched_at, agent_at, bad_at) in zip(units, seen, strict=True)
        ]

    async def _failed_over(
        self, unit: str, since: int
    ) -> tuple[float, float, float | None, float | None]:
        """When ``unit``'s UNHEALTHY verdict and its routing switch were seen, and the
        breakdown before the verdict."""
        keys = self.keys

        def verdict(s: Seen) -> bool:
            h = _value(RegionHealth, s) if s.key == keys.region_health(unit) else None
            return h is not None and h.verdict is Health.UNHEALTHY

        def routed_away(s: Seen) -> bool:
            r = _value(RoutingValue, s) if s.key == keys.routing(unit) else None
            return r is not None and r.targets.get(unit, 0.0) < 1.0

        i, seen = await self.watcher.first(verdict, since, 30, f"{unit} UNHEALTHY verdict")
        _, switched = await self.watcher.first(routed_away, i + 1, 30, f"routing/{unit} switch")
        agent_at, bad_at = self._breakdown(unit, since, i + 1)
        return seen.at, switched.at, agent_at, bad_at

    def _breakdown(self, region: str, start: int, stop: int) -> tuple[float | None, float | None]:
        """When the agent's UNHEALTHY report and the first raw-UNHEALTHY evaluation were seen."""
        agent_key = self.keys.report(region, f"agent:{region}")
        agent_at = bad_at = None
        for s in self.watcher.events[start:stop]:
            if agent_at is None and s.key == agent_key:
                rep = _value(HealthReport, s)
                if rep is not None and rep.health is Health.UNHEALTHY:
                    agent_at = s.at
            if bad_at is None and s.key == self.keys.region_health(region):
                h = _value(RegionHealth, s)
                if h is not None and h.raw is Health.UNHEALTHY:
                    bad_at = s.at
        return agent_at, bad_at

    async def leader_round(self, n: int) -> LeaderRound:
        keys = self.keys
        lease_ttl_s = self.dep.lease_ttl_s
        await self.wait_steady()
        kv = await self.store.get(keys.leader())
        if kv is None:
            raise BenchError("no leader to kill")
        old = kv.value.decode()
        if old not in self.dep.cps:
            raise BenchError(f"leader {old!r} is not one of this bench's replicas")
        await asyncio.sleep(self.rng.uniform(0, lease_ttl_s / 3))  # keep-alive phase
        since = self.watcher.mark()
        t0 = self.dep.kill_cp(old)
        within = 3 * lease_ttl_s + 10

        def gone(s: Seen) -> bool:
            return s.key == keys.leader() and s.type is EventType.DELETE

        def elected(s: Seen) -> bool:
            return s.key == keys.leader() and s.type is EventType.PUT and s.value != kv.value

        def acted(s: Seen) -> bool:
            is_health = s.key.startswith(keys.regions_prefix()) and s.key.endswith("/health")
            return is_health and s.type is EventType.PUT

        i, deleted = await self.watcher.first(gone, since, within, "leader key deleted")
        i, put = await self.watcher.first(elected, i + 1, within, "new leader elected")
        _, act = await self.watcher.first(acted, i + 1, within, "new leader's first health write")
        await asyncio.to_thread(self.dep.restart_cp, old)
        await asyncio.sleep(1.0)  # let the restarted replica's campaign watch come up
        return LeaderRound(
            round=n,
            killed=old,
            new_leader=put.value.decode(),
            lease_gone_s=deleted.at - t0,
            elected_s=put.at - t0,
            leader_resume_s=act.at - t0,
        )
