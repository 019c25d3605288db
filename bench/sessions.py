"""``python -m bench sessions``: the failover switch with many sessions pinned, on a real etcd.

Two identical single-member etcds are started (``chaos.lab.local_etcd.EtcdServer``:
loopback, fast raft timings, ``--unsafe-no-fsync``; Go's GC at etcd's default unless
``--etcd-gogc``): one holds 1,000 pinned sessions, the other ``--sessions-large``
(default 1,000,000), written in 128-op transactions with ``--concurrency`` in flight.
Then:

* **the failover switch** (``switch_ms_p99_1k``, ``switch_ms_p99_1m``): the
  orchestrator's SWITCH write — ``Orchestrator.write`` of a ``failover_step_write``:
  one fenced transaction on ``regions/<r>/state`` and ``routing/*`` with its audit
  entry — is timed ``--switches`` times on each etcd, alternating between the two
  (ABBA order) so that whatever else runs on the machine weighs on both alike.
  Between switches the region is put back (untimed). ``switch_ratio`` = large ÷
  small: failover costs O(1) writes, so it must not grow with the sessions
  (goal ≤ 1.2). Measured twice: right after the bulk load
  (``switch_after_bulk_load``), then after ``settle`` (the headline). etcd 3.4 copies,
  for every read and transaction, a write buffer as long as the largest batch of
  writes it committed at once since its last commit without a session write; the
  bulk load grows that buffer to ~13,000 entries on the large etcd only (~1,000 on
  the small one), so right after it each switch costs the large etcd 5 MiB of
  garbage instead of 0.5 MiB. ``settle`` gives both etcds that one quiet commit, so
  that they differ in the number of sessions only; both figures are printed, with
  etcd's own allocation, CPU and GC cycles per switch (from its ``/metrics``).

There is no re-pin phase any more: the leader's background re-pin after a switch, whose
rate it measured, was removed (issue 27). A failover writes no session; each one is
re-pinned by the gateway that serves its next request (one CAS on that request's path),
and one that sends nothing during the failover is never written (bench/results/sessions.md).

One JSON object per phase goes to stdout, then the headline object; progress goes
to stderr. Both etcds are stopped on exit, also on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import re
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass

from bench._common import add_pools_flag, at_least, terminate_as_interrupt
from chaos.lab.local_etcd import EtcdServer, etcd_available
from controlplane.cluster import Cluster
from controlplane.core.steps import failover_step_write
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import (
    FailoverPlan,
    FailoverProgress,
    FailoverStep,
    RegionRecord,
    RegionState,
    Routing,
)
from controlplane.kernel.sessions.resolve import SessionPin
from controlplane.kernel.snapshot_reader import read_snapshot
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import MAX_TXN_OPS, Compare, Op, Put, StoreError
from controlplane.kernel.store.settings import EtcdConfig
from controlplane.orchestrator import Orchestrator
from controlplane.prewarm import NoPrefixData

REGIONS = ("us-east", "us-west", "us-central")
SOURCE = "us-east"
CLUSTER = "bench-sessions"
ACTOR = "bench"
SMALL = 1_000
WARMUP_SWITCHES = 5
# Longer than etcd's backend commit interval (100 ms) plus a slow commit of 10,000 writes.
SETTLE_S = 0.3


@dataclass(frozen=True)
class Goals:
    switch_ratio: float = 1.2


GOALS = Goals()


class BenchError(RuntimeError):
    """Something a phase needs did not happen; the message says what."""


@dataclass(frozen=True)
class Options:
    switches: int = 2000
    sessions_large: int = 1_000_000
    concurrency: int = 16
    etcd_gogc: int | None = None  # GOGC for both etcds; None = etcd's default (100)
    pools: int = 1  # model pools per region (docs/models.md); 1: regions without pools
    quiet: bool = False


class Reporter:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def progress(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def phase(self, obj: dict[str, object]) -> None:
        if not self.quiet:
            print(json.dumps(obj), flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _topology(endpoint: str, pools: int = 1) -> Topology:
    """Three regions; with ``pools`` above 1, each holds that many model pools
    (docs/models.md), and a failover is one pool's."""

    def region(r: str) -> dict[str, object]:
        serving = {"agent": "127.0.0.1:9", "capacity_rps": 100}
        if pools <= 1:
            return {"name": r, "zone": "us", **serving}
        return {
            "name": r,
            "zone": "us",
            "pools": [
                {"name": f"p{i}", "models": [f"model-p{i}"], **serving} for i in range(1, pools + 1)
            ],
        }

    return parse_topology(
        {
            "cluster": CLUSTER,
            "etcd": {"endpoints": [endpoint]},
            "regions": [region(r) for r in REGIONS],
        },
        "bench topology",
    )


@dataclass(frozen=True)
class EtcdCounters:
    """Cumulative counters from an etcd's ``/metrics`` (Go runtime and process)."""

    alloc_bytes: float
    cpu_s: float
    gc_cycles: float

    @classmethod
    def read(cls, endpoint: str) -> EtcdCounters:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as resp:
            text = resp.read().decode()

        def value(name: str) -> float:
            m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
            if m is None:
                raise BenchError(f"etcd at {endpoint} reports no {name}")
            return float(m.group(1))

        return cls(
            alloc_bytes=value("go_memstats_alloc_bytes_total"),
            cpu_s=value("process_cpu_seconds_total"),
            gc_cycles=value("go_gc_duration_seconds_count"),
        )

    def __sub__(self, before: EtcdCounters) -> EtcdCounters:
        return EtcdCounters(
            self.alloc_bytes - before.alloc_bytes,
            self.cpu_s - before.cpu_s,
            self.gc_cycles - before.gc_cycles,
        )


async def settle(store: EtcdStore) -> None:
    """Give etcd one backend commit that writes no session, so that it drops the write
    buffer a bulk load grew. etcd 3.4's backend keeps, per bucket, a buffer of the
    writes not yet committed; it keeps its length after each commit (every 100 ms)
    and drops it only at a commit without a write to that bucket, and every read and
    transaction copies the whole length (``bucketBuffer.Copy``). A lease grant writes
    the lease bucket only."""
    await asyncio.sleep(SETTLE_S)  # the load's last writes are committed
    lease = await store.grant_lease(60)
    await asyncio.sleep(SETTLE_S)  # ... and then a commit with nothing but the lease
    await store.revoke_lease(lease)


class Fence:
    """The election's fence without an election: the leader key holds our id, created
    at a known revision. Same compares, so the SWITCH txn has the production shape."""

    def __init__(self, key: str) -> None:
        self.key, self.created = key, 0

    async def take(self, store: EtcdStore) -> None:
        await store.put(self.key, ACTOR.encode())
        kv = await store.get(self.key)
        if kv is None:
            raise BenchError("leader key vanished")
        self.created = kv.create_revision

    def __call__(self) -> list[Compare]:
        return [
            Compare.value_is(self.key, ACTOR.encode()),
            Compare.created_at(self.key, self.created),
        ]


class Deployment:
    """One etcd with a control plane's view of it: the fence, the orchestrator, the
    region put back in FAILING_OVER before each timed switch."""

    def __init__(
        self, store: EtcdStore, endpoint: str, topo: Topology, opts: Options, out: Reporter
    ) -> None:
        self.store, self.endpoint, self.topo, self.opts, self.out = store, endpoint, topo, opts, out
        self.keys = Keys(CLUSTER)
        self.clock = SystemClock()
        self.fence = Fence(self.keys.leader())
        self.orch = Orchestrator(
            Cluster(self.store, self.keys, self.topo, self.clock), self.fence, NoPrefixData(), ACTOR
        )
        self.loaded = 0
        self._epoch = 0
        # the unit failed over: the region, or with model pools its first pool
        self.source = topo.units_of(SOURCE)[0]

    # ---- pinning sessions fast -------------------------------------------------------
    async def load(self, keys: Keys, count: int, regions: Sequence[str]) -> float:
        """Pin ``count`` sessions round-robin over ``regions`` (failover units; home ==
        region, as a CREATE under normal routing writes them; a pool's pins under its
        family's key), attached to one shared lease; 128 puts per txn, ``concurrency``
        txns in flight. Returns the seconds taken."""
        lease = await self.store.grant_lease(3600 + 60)
        now = self.clock.now()
        values = [encode(SessionPin(home=r, region=r, epoch=0, pinned_at=now)) for r in regions]
        families = [self.topo.family(r) for r in regions]
        chunks = iter(range(0, count, MAX_TXN_OPS))

        async def worker() -> None:
            for first in chunks:  # a shared iterator: each chunk goes to one worker
                n = len(values)
                ops: list[Op] = [
                    Put(keys.session(f"s{i:08d}", families[i % n]), values[i % n], lease)
                    for i in range(first, min(first + MAX_TXN_OPS, count))
                ]
                await self.store.txn([], ops)

        t0 = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for _ in range(self.opts.concurrency):
                tg.create_task(worker())
        return time.perf_counter() - t0

    async def pin_sessions(self, count: int) -> None:
        self.out.progress(f"pinning {count:,} sessions ...")
        seconds = await self.load(self.keys, count, self.topo.names)
        self.loaded = count
        self.out.phase(
            {
                "kind": "load",
                "sessions": count,
                "seconds": round(seconds, 3),
                "keys_per_s": round(count / seconds),
            }
        )
        self.out.progress(
            f"pinned {count:,} sessions in {seconds:.1f} s ({count / seconds:,.0f}/s)"
        )

    # ---- the switch ------------------------------------------------------------------
    async def _reset(self) -> None:
        """The source (``SOURCE``, or its first pool) failing over with its SWITCH
        pending; every routing normal."""
        self._epoch += 1
        now = self.clock.now()
        source = self.source
        family = self.topo.family(source)
        sfx = f".{family}" if family else ""
        plan = FailoverPlan(
            source=source,
            targets={f"us-west{sfx}": 0.6, f"us-central{sfx}": 0.4},
            reason="bench",
            actor=ACTOR,
        )
        record = RegionRecord(
            region=source,
            state=RegionState.FAILING_OVER,
            epoch=self._epoch,
            reason="bench",
            since=now,
            failover=FailoverProgress(plan=plan, started_at=now),
        )
        ops: list[Op] = [Put(self.keys.region_state(source), encode(record))]
        ops += [
            Put(self.keys.routing(r), encode(Routing(targets={r: 1.0}, epoch=self._epoch)))
            for r in self.topo.names
        ]
        await self.store.txn([], ops)

    async def switch_once(self) -> float:
        """One SWITCH, as the orchestrator writes it; returns its milliseconds."""
        await self._reset()
        snap = await read_snapshot(self.store, self.keys, self.topo, self.clock.now())
        w = failover_step_write(snap, self.source, FailoverStep.SWITCH, ACTOR)
        t0 = time.perf_counter()
        ok = await self.orch.write(w)
        elapsed = time.perf_counter() - t0
        if not ok:
            raise BenchError("the SWITCH transaction lost its compare (nothing else writes)")
        return elapsed * 1000


def _switch_phase(dep: Deployment, phase: str, times: Sequence[float], etcd: EtcdCounters) -> float:
    p50, p99 = percentile(times, 50), percentile(times, 99)
    # etcd's counters cover each timed switch and its untimed reset and snapshot read
    n = len(times)
    dep.out.phase(
        {
            "kind": "switch",
            "phase": phase,
            "sessions": dep.loaded,
            "switches": n,
            "ms_p50": round(p50, 3),
            "ms_p99": round(p99, 3),
            "ms_max": round(max(times), 3),
            "etcd_alloc_kib_per_switch": round(etcd.alloc_bytes / n / 1024, 1),
            "etcd_cpu_ms_per_switch": round(etcd.cpu_s / n * 1000, 3),
            "etcd_gc_cycles": int(etcd.gc_cycles),
        }
    )
    dep.out.progress(
        f"{phase}: switch with {dep.loaded:,} sessions pinned: p50 {p50:.2f} ms, "
        f"p99 {p99:.2f} ms over {n} switches; etcd allocated "
        f"{etcd.alloc_bytes / n / 1024:,.0f} KiB per switch, {int(etcd.gc_cycles)} GC cycles"
    )
    return p99


async def interleaved_switches(
    small: Deployment, large: Deployment, n: int, phase: str
) -> tuple[float, float]:
    """``n`` timed switches on each, in ABBA order, after a few untimed ones."""
    times: dict[int, list[float]] = {id(small): [], id(large): []}
    before: dict[int, EtcdCounters] = {}
    for i in range(WARMUP_SWITCHES + n):
        if i == WARMUP_SWITCHES:
            before = {id(dep): EtcdCounters.read(dep.endpoint) for dep in (small, large)}
        for dep in (small, large) if i % 2 == 0 else (large, small):
            ms = await dep.switch_once()
            if i >= WARMUP_SWITCHES:
                times[id(dep)].append(ms)
    return (
        _switch_phase(
            small, phase, times[id(small)], EtcdCounters.read(small.endpoint) - before[id(small)]
        ),
        _switch_phase(
            large, phase, times[id(large)], EtcdCounters.read(large.endpoint) - before[id(large)]
        ),
    )


async def _connect(endpoint: str) -> EtcdStore:
    store = EtcdStore(EtcdConfig(endpoints=(endpoint,), request_timeout_s=10.0))
    await store.connect()
    return store


async def measure(endpoints: tuple[str, str], opts: Options, out: Reporter) -> dict[str, object]:
    started = time.monotonic()
    stores = [await _connect(e) for e in endpoints]
    try:
        small, large = (
            Deployment(s, e, _topology(e, opts.pools), opts, out)
            for s, e in zip(stores, endpoints, strict=True)
        )
        for dep in (small, large):
            await dep.fence.take(dep.store)
        await small.pin_sessions(SMALL)
        await large.pin_sessions(opts.sessions_large)
        gc.collect()
        loaded_small, loaded_large = await interleaved_switches(
            small, large, opts.switches, "after_bulk_load"
        )
        out.progress("settling both etcds (one commit without session writes) ...")
        await asyncio.gather(settle(small.store), settle(large.store))
        p99_small, p99_large = await interleaved_switches(small, large, opts.switches, "settled")
    finally:
        for s in stores:
            await s.close()
    ratio = p99_large / p99_small
    return {
        "bench": "sessions",
        "switch_ms_p99_1k": round(p99_small, 3),
        "switch_ms_p99_1m": round(p99_large, 3),
        "switch_ratio": round(ratio, 3),
        "switch_after_bulk_load": {
            "ms_p99_1k": round(loaded_small, 3),
            "ms_p99_1m": round(loaded_large, 3),
            "ratio": round(loaded_large / loaded_small, 3),
        },
        "sessions_small": SMALL,
        "sessions_large": opts.sessions_large,
        "pools": opts.pools,
        "switches": opts.switches,
        "etcd": "2 x 1 member, loopback, --unsafe-no-fsync",
        "etcd_gogc": opts.etcd_gogc,  # null: Go's default (100)
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
        "goals": asdict(GOALS),
        "met": {"switch_ratio": ratio <= GOALS.switch_ratio},
        "runtime_s": round(time.monotonic() - started, 1),
    }


@contextlib.contextmanager
def _go_env(gogc: int | None) -> Iterator[None]:
    """GOGC for the etcds started inside (they inherit our environment): ``gogc``, or
    none at all, so that a GOGC set in the caller's shell does not leak into them."""
    previous = os.environ.pop("GOGC", None)
    if gogc is not None:
        os.environ["GOGC"] = str(gogc)
    try:
        yield
    finally:
        os.environ.pop("GOGC", None)
        if previous is not None:
            os.environ["GOGC"] = previous


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--switches",
        type=_at_least(10),
        default=2000,
        help="timed switches per etcd (default 2,000: enough for a p99 that is not the max)",
    )
    p.add_argument(
        "--sessions-large",
        type=_at_least(SMALL + 1),
        default=1_000_000,
        metavar="N",
        help="sessions pinned for the second switch phase (default 1,000,000)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=16,
        choices=range(1, 65),
        metavar="N",
        help="transactions in flight while pinning, 1-64 (default 16)",
    )
    p.add_argument(
        "--etcd-gogc",
        type=_at_least(1),
        default=None,
        metavar="N",
        help="run both etcds with GOGC=N, Go's GC target (default: unset, Go's 100)",
    )
    add_pools_flag(p, "sessions are pinned per pool and the switch is one pool's")
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def _at_least(low: int) -> Callable[[str], int]:
    return at_least(low, "count")


def run(args: argparse.Namespace) -> int:
    opts = Options(
        switches=args.switches,
        sessions_large=args.sessions_large,
        concurrency=args.concurrency,
        etcd_gogc=args.etcd_gogc,
        pools=args.pools,
        quiet=args.quiet,
    )
    if not etcd_available():
        print("error: the etcd binary is not installed (scripts/setup.sh)", file=sys.stderr)
        return 2
    out = Reporter(opts.quiet)
    try:
        with terminate_as_interrupt(), contextlib.ExitStack() as stack:
            with _go_env(opts.etcd_gogc):
                small = stack.enter_context(EtcdServer())
                large = stack.enter_context(EtcdServer())
            out.progress(f"etcd at {small.endpoint} (1,000 sessions) and {large.endpoint}")
            result = asyncio.run(measure((small.endpoint, large.endpoint), opts, out))
    except KeyboardInterrupt:
        print("interrupted; etcd was stopped", file=sys.stderr)
        return 130
    except (BenchError, StoreError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0
