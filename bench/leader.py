"""``python -m bench leader``: the control-plane leader SIGKILLed at each step of a
failover, and how long until a new leader acts.

A local lab (chaos/lab/deployment.py: etcd, three regions of simulators with their agents
and gateways, two control-plane processes) runs four rounds, each killing the leading
control-plane process (no resign: its lease must expire) at one point of a failover:

* ``before_prewarm``: a manual failover (which warms the targets first) has just been
  recorded, its pre-warm not started;
* ``during_prewarm``: the same, one second into its pre-warm (the lab's replicas,
  chaos/lab/controlplane.py, keep the step running long enough to be hit);
* ``after_switch``: an automatic failover of a region whose servers were SIGKILLed
  (switch first, then warm) has switched routing, its pre-warm still running;
* ``during_recovery``: that region's servers are back and it recovers in steps; the
  kill lands after the first step.

For each round: ``leader_resume_s`` runs from the kill to the first fenced write of the
new leader (it acts again); ``next_step_s`` to the first write that moves the
interrupted failover or recovery on (it includes what is left of the held pre-warm);
``repeated_steps`` counts completed steps the new leader did again (audit entries
``routing_switch`` / ``prewarm`` twice for one failover, or one recovery step number
twice): it must be 0. The headline: the worst ``leader_resume_s``, the lease TTL, and
``resume_over_ttl`` = resume ÷ (TTL + 2 s), goal ≤ 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from bench._common import BenchError, Reporter, goals_and_met, main
from bench.failover_rounds import Seen, Watcher
from chaos.lab.deployment import LocalDeployment
from chaos.lab.run import running_lab
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.model import (
    AuditAction,
    AuditEntry,
    FailoverStep,
    RegionRecord,
    RegionState,
)
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import EventType, KeyValue
from controlplane.kernel.store.settings import EtcdConfig

HOLD_S = 2.0  # the pre-warm step's minimum length, so that "during" can be hit


@dataclass(frozen=True)
class Goals:
    resume_over_ttl: float = 1.0


@dataclass(frozen=True)
class Round:
    phase: str
    region: str
    killed: str
    new_leader: str
    leader_resume_s: float
    next_step_s: float
    repeated_steps: int


def _record(s: Seen) -> RegionRecord | None:
    if s.type is not EventType.PUT:
        return None
    try:
        return decode(RegionRecord, s.value, s.key)
    except CorruptValue:
        return None


def _entry(kv: KeyValue) -> AuditEntry | None:
    """An audit entry, or None for one that does not decode (another version's action)."""
    try:
        return decode(AuditEntry, kv.value, kv.key)
    except CorruptValue:
        return None


class LeaderBench:
    def __init__(self, dep: LocalDeployment, store: EtcdStore, watcher: Watcher) -> None:
        self.dep, self.store, self.watcher, self.keys = dep, store, watcher, dep.keys
        self.channels = [grpc.aio.insecure_channel(t) for t in dep.cp_targets]
        self.stubs = [pb_grpc.ControlPlaneStub(c) for c in self.channels]  # type: ignore[no-untyped-call]
        self._elected_index = 0

    async def close(self) -> None:
        for c in self.channels:
            await c.close()

    async def call(self, fn: Callable[[pb_grpc.ControlPlaneStub], object]) -> object:
        """Ask any control-plane replica that answers."""
        last: Exception | None = None
        for stub in self.stubs:
            try:
                return await fn(stub)  # type: ignore[misc]
            except grpc.aio.AioRpcError as e:
                last = e
        raise BenchError(f"no control-plane replica answers: {last}")

    async def record(self, region: str) -> RegionRecord | None:
        kv = await self.store.get(self.keys.region_state(region))
        return None if kv is None else decode(RegionRecord, kv.value, kv.key)

    async def wait(self, pred: Callable[[], object], within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while not await pred():  # type: ignore[misc]
            if time.monotonic() > deadline:
                raise BenchError(f"{what}: not reached within {within:g} s")
            await asyncio.sleep(0.05)

    async def steady(self) -> bool:
        st: pb.StatusResponse = await self.call(  # type: ignore[assignment]
            lambda s: s.GetStatus(pb.GetStatusRequest(), timeout=2)
        )
        return bool(st.leader) and all(
            r.state == pb.NORMAL and r.health == pb.HEALTHY for r in st.regions
        )

    async def kill_leader(self, since: int) -> tuple[str, str, float, float]:
        """SIGKILL the leader; (killed, new leader, resume_s, t0). Restarts it after."""
        kv = await self.store.get(self.keys.leader())
        if kv is None:
            raise BenchError("no leader to kill")
        old = kv.value.decode()
        t0 = time.monotonic()
        await asyncio.to_thread(self.dep.kill_controlplane, old)
        within = 3 * self.dep.spec.lease_ttl_s + 15

        def elected(s: Seen) -> bool:
            return s.key == self.keys.leader() and s.type is EventType.PUT and s.value != kv.value

        def acted(s: Seen) -> bool:
            fenced = s.key.startswith(self.keys.regions_prefix()) or s.key.startswith(
                self.keys.routing_prefix()
            )
            return fenced and s.type is EventType.PUT

        i, put = await self.watcher.first(elected, since, within, "a new leader")
        _, act = await self.watcher.first(acted, i + 1, within, "the new leader's first write")
        self._elected_index = i
        return old, put.value.decode(), act.at - t0, t0

    async def next_step(
        self, region: str, moved: Callable[[RegionRecord], bool], t0: float
    ) -> float:
        def step(s: Seen) -> bool:
            rec = _record(s) if s.key == self.keys.region_state(region) else None
            return rec is not None and moved(rec)

        _, seen = await self.watcher.first(step, self._elected_index + 1, 60, f"{region} moves on")
        return seen.at - t0

    async def repeated(self, region: str, since_at: float) -> int:
        """Completed steps done twice for ``region`` since ``since_at`` (Unix time)."""
        page = await self.store.get_prefix(self.keys.audit_prefix())
        entries = [e for kv in page.kvs if (e := _entry(kv)) is not None]
        mine = [e for e in entries if e.region == region and e.at >= since_at]
        twice = 0
        for action in (AuditAction.ROUTING_SWITCH, AuditAction.PREWARM):
            twice += max(0, sum(1 for e in mine if e.action is action) - 1)
        steps = [e.recovery_step for e in mine if e.action is AuditAction.RECOVERY_STEP]
        twice += len(steps) - len(set(steps))
        return twice

    async def manual_round(self, phase: str, region: str) -> Round:
        await self.wait(self.steady, 90, "every region NORMAL and HEALTHY under a leader")
        since, started_at = self.watcher.mark(), time.time()
        await self.call(
            lambda s: s.RequestFailover(
                pb.FailoverRequest(
                    region=region,
                    reason=f"bench leader: {phase}",
                    actor="bench",
                    force=True,
                ),
                timeout=5,
            )
        )

        def recorded(s: Seen) -> bool:
            rec = _record(s) if s.key == self.keys.region_state(region) else None
            return rec is not None and rec.state is RegionState.FAILING_OVER

        await self.watcher.first(recorded, since, 30, f"{region} FAILING_OVER recorded")
        if phase == "during_prewarm":
            await asyncio.sleep(1.0)
        killed, new, resume, t0 = await self.kill_leader(since)
        step = await self.next_step(
            region,
            lambda r: r.failover is not None and FailoverStep.PREWARM in r.failover.done,
            t0,
        )
        await self.wait(self._switched(region), 30, f"{region} switched")
        await asyncio.to_thread(self.dep.start_controlplanes)
        repeated = await self.repeated(region, started_at)
        back = pb.RecoveryRequest(region=region, reason="bench leader: next round", actor="bench")
        await self.call(lambda s: s.RequestRecovery(back, timeout=5))
        return Round(phase, region, killed, new, resume, step, repeated)

    def _switched(self, region: str) -> Callable[[], object]:
        async def done() -> bool:
            rec = await self.record(region)
            return (
                rec is not None
                and rec.failover is not None
                and (
                    FailoverStep.SWITCH in rec.failover.done
                    and FailoverStep.PREWARM in rec.failover.done
                )
            )

        return done

    async def automatic_rounds(self, region: str) -> list[Round]:
        """after_switch, then during_recovery, on one blackout of ``region``."""
        await self.wait(self.steady, 90, "every region NORMAL and HEALTHY under a leader")
        since, started_at = self.watcher.mark(), time.time()
        await asyncio.to_thread(self.dep.stop_servers, region)

        def switched(s: Seen) -> bool:
            rec = _record(s) if s.key == self.keys.region_state(region) else None
            return (
                rec is not None
                and rec.failover is not None
                and (
                    FailoverStep.SWITCH in rec.failover.done
                    and FailoverStep.PREWARM not in rec.failover.done
                )
            )

        await self.watcher.first(switched, since, 40, f"{region} switched (pre-warm pending)")
        killed, new, resume, t0 = await self.kill_leader(since)
        step = await self.next_step(
            region,
            lambda r: r.failover is not None and FailoverStep.PREWARM in r.failover.done,
            t0,
        )
        await asyncio.to_thread(self.dep.start_controlplanes)
        first = Round(
            "after_switch",
            region,
            killed,
            new,
            resume,
            step,
            await self.repeated(region, started_at),
        )

        since = self.watcher.mark()
        await asyncio.to_thread(self.dep.start_servers, region)

        def stepping(s: Seen) -> bool:
            rec = _record(s) if s.key == self.keys.region_state(region) else None
            return rec is not None and rec.recovery is not None and rec.recovery.step >= 1

        await self.watcher.first(stepping, since, 60, f"{region}'s first recovery step")
        at_kill = await self.record(region)
        done_steps = at_kill.recovery.step if at_kill and at_kill.recovery else 0
        killed, new, resume, t0 = await self.kill_leader(since)
        step = await self.next_step(
            region,
            lambda r: (
                r.state is RegionState.NORMAL
                or (r.recovery is not None and r.recovery.step > done_steps)
            ),
            t0,
        )
        await asyncio.to_thread(self.dep.start_controlplanes)
        await self.wait(self.steady, 90, f"{region} NORMAL again")
        second = Round(
            "during_recovery",
            region,
            killed,
            new,
            resume,
            step,
            await self.repeated(region, started_at),
        )
        return [first, second]


async def measure(spec: DeploymentSpec, out: Reporter) -> dict[str, object]:
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-bench-leader-"))
    async with running_lab(spec, workdir, say=out.progress) as dep:
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        watcher = Watcher(store, dep.keys)
        task = asyncio.create_task(watcher.run())
        bench = LeaderBench(dep, store, watcher)
        try:
            rounds = [
                await bench.manual_round("before_prewarm", "us-east"),
                await bench.manual_round("during_prewarm", "us-west"),
                *await bench.automatic_rounds("us-central"),
            ]
        finally:
            await bench.close()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await store.close()
    for r in rounds:
        out.progress(
            f"{r.phase:<16} {r.region:<10} killed {r.killed}, {r.new_leader} acting in "
            f"{r.leader_resume_s:.2f} s, next step after {r.next_step_s:.2f} s, "
            f"{r.repeated_steps} steps repeated"
        )
        out.line({k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r).items()})
    worst = max(r.leader_resume_s for r in rounds)
    over = worst / (spec.lease_ttl_s + 2)
    return {
        "bench": "leader",
        "rounds": len(rounds),
        "phases": [r.phase for r in rounds],
        "leader_resume_s": round(worst, 4),
        "leader_resume_s_by_phase": {r.phase: round(r.leader_resume_s, 4) for r in rounds},
        "next_step_s_by_phase": {r.phase: round(r.next_step_s, 4) for r in rounds},
        "prewarm_hold_s": spec.prewarm_hold_s,
        "repeated_steps": sum(r.repeated_steps for r in rounds),
        "lease_ttl_s": spec.lease_ttl_s,
        "resume_over_ttl": round(over, 4),
        **goals_and_met(Goals(), {"resume_over_ttl": over}),
        "runtime_s": round(time.monotonic() - started, 1),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lease-ttl", type=int, default=3, help="leader lease TTL in s (default 3)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    spec = DeploymentSpec(replicas_per_region=1, lease_ttl_s=args.lease_ttl, prewarm_hold_s=HOLD_S)
    out = Reporter(args.quiet)
    return main(lambda: asyncio.run(measure(spec, out)), (BenchError, TimeoutError))
