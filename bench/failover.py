"""``python -m bench failover``: the headline figures of a failover, on real processes.

A real etcd, one simulator process per replica of three regions, one region agent
per region and two control-plane replica processes are started; then:

* **failover rounds** (``--rounds``, rotating over the regions): every simulator of
  one region is SIGKILLed. ``detect_s`` runs from that kill to the moment the bench's
  etcd watch sees ``regions/<r>/health`` put with ``verdict == UNHEALTHY``;
  ``switch_ms`` from that event to the watch event of the ``routing/<r>`` put that
  sends the region's traffic away. Then the simulators are restarted on the same
  ports and the bench waits until the region is NORMAL again.
* **leader rounds** (``--leader-rounds``): the leading control-plane process is
  SIGKILLed (no resign: its lease must expire). ``leader_resume_s`` runs from the
  kill to the first fenced write of the new leader: the first ``regions/*/health``
  put after the ``leader`` key's new put. The killed replica is restarted after.

All times are ``time.monotonic()`` of this process, taken when the watch event
arrives. One JSON object per round goes to stdout, then the headline object;
progress goes to stderr. Every process is killed on exit, also on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import NoReturn, TypeVar

import yaml
from pydantic import BaseModel

from chaos.local_etcd import EtcdServer, etcd_available
from chaos.procs import (
    Proc,
    free_port,
    launch_simulator,
    start_agent,
    start_controlplane,
    wait_ready,
)
from controlplane.codec import CorruptValue, decode
from controlplane.config import ConfigError, EtcdConfig, parse_topology
from controlplane.core.model import Health, HealthReport, RegionHealth, RegionRecord, RegionState
from controlplane.core.model import Routing as RoutingValue
from controlplane.keys import Keys
from controlplane.store.etcd import EtcdStore
from controlplane.store.port import EventType, StoreUnavailable

M = TypeVar("M", bound=BaseModel)

REGIONS = ("us-east", "us-west", "us-central")
CONTROL_PLANES = ("cp-1", "cp-2")
CLUSTER = "bench"
PROBE_INTERVAL_S = 1.0
FAILURE_THRESHOLD = 3
LOOP_PERIOD_S = 1.0
AGENT_INTERVAL_S = 1.0
AGENT_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class Goals:
    detect_s_p99: float = 4.0
    switch_ms_p99: float = 100.0
    resume_over_ttl: float = 1.0


GOALS = Goals()


class BenchError(RuntimeError):
    """The deployment did not do what a round needs; the message says what and where."""


@dataclass(frozen=True)
class Options:
    rounds: int = 5
    leader_rounds: int = 3
    lease_ttl_s: int = 5
    replicas: int = 1
    quiet: bool = False
    seed: int | None = None


# ---- topology ---------------------------------------------------------------------------


def topology_data(
    endpoint: str, agents: dict[str, int], replicas: dict[str, list[str]], lease_ttl_s: int
) -> dict[str, object]:
    """The bench topology: detection as in production (1 s x 3), fast recovery."""
    retry_timeout = min(2.0, (lease_ttl_s - LOOP_PERIOD_S) / 2)
    data: dict[str, object] = {
        "cluster": CLUSTER,
        "etcd": {"endpoints": [endpoint]},
        "regions": [
            {
                "name": r,
                "zone": "us",
                "agent": f"127.0.0.1:{agents[r]}",
                "capacity_rps": 100,
                "replicas": replicas[r],
            }
            for r in REGIONS
        ],
        "timing": {
            "probe_interval_s": PROBE_INTERVAL_S,
            "failure_threshold": FAILURE_THRESHOLD,
            "success_threshold": 2,
            "quorum": 2,
            "loop_period_s": LOOP_PERIOD_S,
            "retry_timeout_s": retry_timeout,
            "lease_ttl_s": lease_ttl_s,
            "degraded_dwell_s": 1.0,
            "recovery_dwell_s": 1.0,
            "failover_cooldown_s": 0.0,
        },
        "recovery": {"step_percent": 50, "step_interval_s": 0.5},
    }
    parse_topology(data, "bench topology")  # fail here, not in two child processes
    return data


# ---- processes --------------------------------------------------------------------------


def _start_all(starters: Sequence[Callable[[], Proc]]) -> list[Proc]:
    """Run blocking starters in parallel; if one fails, kill those that started."""
    with ThreadPoolExecutor(max_workers=max(1, len(starters))) as pool:
        futures = [pool.submit(s) for s in starters]
    started = [f.result() for f in futures if f.exception() is None]
    errors = [e for f in futures if (e := f.exception()) is not None]
    if errors:
        for p in started:
            p.kill()
        raise BenchError(f"a process did not start: {errors[0]}") from errors[0]
    return started


def _start_simulators(ports: Sequence[int], region: str) -> list[Proc]:
    procs = [launch_simulator(port=p, name=f"sim-{region}-{i}") for i, p in enumerate(ports)]
    try:
        return [wait_ready(p) for p in procs]
    except BaseException:
        for p in procs:
            p.kill()
        raise


@dataclass
class Deployment:
    """Simulators, agents and control-plane replicas on one etcd; ``close()`` kills all."""

    etcd_endpoint: str
    workdir: Path
    lease_ttl_s: int
    replicas: int = 1
    sims: dict[str, list[Proc]] = field(default_factory=dict)
    sim_ports: dict[str, list[int]] = field(default_factory=dict)
    agents: dict[str, Proc] = field(default_factory=dict)
    cps: dict[str, Proc] = field(default_factory=dict)
    cp_ports: dict[str, int] = field(default_factory=dict)
    topology_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.topology_path = self.workdir / "topology.yaml"

    def start(self) -> None:
        for r in REGIONS:
            self.sims[r] = _start_simulators([0] * self.replicas, r)
            self.sim_ports[r] = [p.port for p in self.sims[r]]
        agent_ports = {r: free_port() for r in REGIONS}
        self.cp_ports = {c: free_port() for c in CONTROL_PLANES}
        urls = {r: [p.url for p in self.sims[r]] for r in REGIONS}
        data = topology_data(self.etcd_endpoint, agent_ports, urls, self.lease_ttl_s)
        self.topology_path.write_text(yaml.safe_dump(data))
        cp_targets = [f"127.0.0.1:{p}" for p in self.cp_ports.values()]
        agents = _start_all([self._agent_starter(r, agent_ports[r], cp_targets) for r in REGIONS])
        self.agents = dict(zip(REGIONS, agents, strict=True))
        cps = _start_all([self._cp_starter(c) for c in CONTROL_PLANES])
        self.cps = dict(zip(CONTROL_PLANES, cps, strict=True))

    def _agent_starter(self, region: str, port: int, cps: list[str]) -> Callable[[], Proc]:
        replicas = [p.url for p in self.sims[region]]
        return lambda: start_agent(
            region=region,
            control_planes=cps,
            replicas=replicas,
            interval=AGENT_INTERVAL_S,
            timeout=AGENT_TIMEOUT_S,
            listen=f"127.0.0.1:{port}",
        )

    def _cp_starter(self, replica_id: str) -> Callable[[], Proc]:
        listen = f"127.0.0.1:{self.cp_ports[replica_id]}"
        return lambda: start_controlplane(self.topology_path, replica_id, listen=listen)

    def kill_region(self, region: str) -> float:
        """SIGKILL every simulator of ``region``; returns when the first signal left."""
        procs = self.sims[region]
        t0 = time.monotonic()
        for p in procs:
            p.popen.send_signal(signal.SIGKILL)
        for p in procs:
            p.kill()  # reap
        return t0

    def restore_region(self, region: str) -> None:
        """Restart the region's simulators on their old ports (its agent probes those)."""
        self.sims[region] = _start_simulators(self.sim_ports[region], region)

    def kill_cp(self, replica_id: str) -> float:
        proc = self.cps[replica_id]
        t0 = time.monotonic()
        proc.popen.send_signal(signal.SIGKILL)
        proc.kill()
        return t0

    def restart_cp(self, replica_id: str) -> None:
        self.cps[replica_id] = self._cp_starter(replica_id)()

    def log_tails(self, tail: int = 1500) -> str:
        procs = [*self.cps.values(), *self.agents.values()]
        return "\n".join(f"--- {p.name} (pid {p.pid})\n{p.log(tail)}" for p in procs)

    def close(self) -> None:
        procs = [*self.cps.values(), *self.agents.values()]
        procs += [p for ps in self.sims.values() for p in ps]
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()


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
    region: str
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
    opts: Options
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
        return all([await self.region_settled(r) for r in REGIONS])

    async def wait(self, pred: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while not await pred():
            if time.monotonic() > deadline:
                raise BenchError(f"{what}: not reached within {within:g} s")
            await asyncio.sleep(0.1)

    async def failover_round(self, n: int) -> FailoverRound:
        region = REGIONS[(n - 1) % len(REGIONS)]
        keys = self.keys
        await self.wait(self.steady, 60, "every region HEALTHY and NORMAL under a leader")
        await asyncio.sleep(self.rng.uniform(0, PROBE_INTERVAL_S))  # any probe/tick phase
        since = self.watcher.mark()
        t0 = self.dep.kill_region(region)

        def verdict(s: Seen) -> bool:
            h = _value(RegionHealth, s) if s.key == keys.region_health(region) else None
            return h is not None and h.verdict is Health.UNHEALTHY

        def routed_away(s: Seen) -> bool:
            r = _value(RoutingValue, s) if s.key == keys.routing(region) else None
            return r is not None and r.targets.get(region, 0.0) < 1.0

        i, seen = await self.watcher.first(verdict, since, 30, f"{region} UNHEALTHY verdict")
        _, switched = await self.watcher.first(routed_away, i + 1, 30, f"routing/{region} switch")
        agent_at, bad_at = self._breakdown(region, since, i + 1)
        t_restart = time.monotonic()
        await asyncio.to_thread(self.dep.restore_region, region)
        await self.wait(lambda: self.region_settled(region), 60, f"{region} NORMAL again")
        return FailoverRound(
            round=n,
            region=region,
            detect_s=seen.at - t0,
            switch_ms=(switched.at - seen.at) * 1000,
            agent_report_s=None if agent_at is None else agent_at - t0,
            first_bad_eval_s=None if bad_at is None else bad_at - t0,
            restore_s=time.monotonic() - t_restart,
        )

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
        await self.wait(self.steady, 60, "every region HEALTHY and NORMAL under a leader")
        kv = await self.store.get(keys.leader())
        if kv is None:
            raise BenchError("no leader to kill")
        old = kv.value.decode()
        if old not in self.dep.cps:
            raise BenchError(f"leader {old!r} is not one of this bench's replicas")
        await asyncio.sleep(self.rng.uniform(0, self.opts.lease_ttl_s / 3))  # keep-alive phase
        since = self.watcher.mark()
        t0 = self.dep.kill_cp(old)
        within = 3 * self.opts.lease_ttl_s + 10

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


# ---- figures ----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _within(value: float | None, goal: float) -> bool:
    return value is not None and value <= goal


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def headline(
    opts: Options, fo: Sequence[FailoverRound], lr: Sequence[LeaderRound], runtime_s: float
) -> dict[str, object]:
    """The final line: percentiles over the rounds, the goals and whether each was met."""
    detect = [r.detect_s for r in fo]
    switch = [r.switch_ms for r in fo]
    detect_p99, switch_p99 = percentile(detect, 99), percentile(switch, 99)
    resume = percentile([r.leader_resume_s for r in lr], 99)
    over_ttl = None if resume is None else resume / (opts.lease_ttl_s + 2)
    return {
        "bench": "failover",
        "rounds": len(fo),
        "detect_s_p50": _r(percentile(detect, 50)),
        "detect_s_p99": _r(detect_p99),
        "switch_ms_p50": _r(percentile(switch, 50)),
        "switch_ms_p99": _r(switch_p99),
        "leader_rounds": len(lr),
        "leader_resume_s": _r(resume),
        "lease_ttl_s": opts.lease_ttl_s,
        "resume_over_ttl": _r(over_ttl),
        "probe_interval_s": PROBE_INTERVAL_S,
        "failure_threshold": FAILURE_THRESHOLD,
        "goals": asdict(GOALS),
        "met": {
            "detect_s_p99": _within(detect_p99, GOALS.detect_s_p99),
            "switch_ms_p99": _within(switch_p99, GOALS.switch_ms_p99),
            "resume_over_ttl": _within(over_ttl, GOALS.resume_over_ttl),
        },
        "runtime_s": round(runtime_s, 1),
    }


# ---- running ----------------------------------------------------------------------------


class Reporter:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def progress(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def round(self, obj: dict[str, object]) -> None:
        if not self.quiet:
            print(json.dumps(obj), flush=True)


async def measure(
    dep: Deployment, opts: Options, out: Reporter, started: float
) -> dict[str, object]:
    store = EtcdStore(EtcdConfig(endpoints=(dep.etcd_endpoint,)))
    await store.connect()
    watcher = Watcher(store, Keys(CLUSTER))
    task = asyncio.create_task(watcher.run(), name="bench-watch")
    try:
        bench = Bench(dep, store, watcher, opts, rng=random.Random(opts.seed))
        await bench.wait(bench.steady, 60, "every region HEALTHY and NORMAL under a leader")
        out.progress(f"deployment steady after {time.monotonic() - started:.1f} s")
        fo: list[FailoverRound] = []
        for n in range(1, opts.rounds + 1):
            r = await bench.failover_round(n)
            fo.append(r)
            out.progress(r.line(opts.rounds))
            out.round({"round": n, **r.as_json()})
        lr: list[LeaderRound] = []
        for n in range(1, opts.leader_rounds + 1):
            lead = await bench.leader_round(n)
            lr.append(lead)
            out.progress(lead.line(opts.leader_rounds))
            out.round({"round": n, **lead.as_json()})
        return headline(opts, fo, lr, time.monotonic() - started)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM cleans up like Ctrl-C does."""

    def handler(signum: int, frame: FrameType | None) -> NoReturn:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_bench(opts: Options, out: Reporter) -> dict[str, object]:
    started = time.monotonic()
    out.progress(
        f"starting etcd, {len(REGIONS)} regions x {opts.replicas} simulator(s), "
        f"{len(REGIONS)} agents, {len(CONTROL_PLANES)} control planes (lease {opts.lease_ttl_s} s)"
    )
    with tempfile.TemporaryDirectory(prefix="tectonic-bench-") as tmp, EtcdServer() as etcd:
        dep = Deployment(etcd.endpoint, Path(tmp), opts.lease_ttl_s, opts.replicas)
        try:
            dep.start()
            return asyncio.run(measure(dep, opts, out, started))
        except BenchError as e:
            raise BenchError(f"{e}\nlogs:\n{dep.log_tails()}") from None
        finally:
            dep.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=_count, default=5, help="failover rounds (default 5)")
    p.add_argument("--leader-rounds", type=_count, default=3, help="leader-kill rounds (default 3)")
    p.add_argument(
        "--lease-ttl",
        type=int,
        default=5,
        choices=range(2, 61),
        metavar="S",
        help="leader lease TTL in whole seconds, 2-60 (default 5)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        choices=range(1, 5),
        metavar="N",
        help="simulator replicas per region, 1-4 (default 1)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the kill-time jitter")
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def _count(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {n}")
    return n


def run(args: argparse.Namespace) -> int:
    opts = Options(
        rounds=args.rounds,
        leader_rounds=args.leader_rounds,
        lease_ttl_s=args.lease_ttl,
        replicas=args.replicas,
        quiet=args.quiet,
        seed=args.seed,
    )
    if not etcd_available():
        print("error: the etcd binary is not installed (scripts/setup.sh)", file=sys.stderr)
        return 2
    out = Reporter(opts.quiet)
    try:
        with _terminate_as_interrupt():
            result = run_bench(opts, out)
    except KeyboardInterrupt:
        print("interrupted; every process was stopped", file=sys.stderr)
        return 130
    except (BenchError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0
