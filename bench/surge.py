"""``python -m bench surge``: a loaded region fails over into a target that needs twice
its ACTIVE replicas; first-token p99 in the first minute over before, with failover-aware
scaling and with scaling off (issue 31).

Two local labs, one after the other (chaos/lab/deployment.py: one etcd member, three
regions, two control-plane processes, a gateway per region), each region's agent running
a simulator **warm pool** (``DeploymentSpec.warm_pool``: ``--active`` ACTIVE, ``--warm``
asleep, ``--size`` slots; the gateways route to what ``pools/<unit>`` lists). The first
lab's topology has the lab's ``scaling:`` section, so the agents follow the leader's
``scale/<unit>``; the second has none (the pools keep their file's sizes).

The load, the same seeded open-loop Poisson arrivals in both labs: ``--rate`` requests/s
of streaming completions into the source's gateway (``us-east``) and ``--rate`` into the
target's (``us-west``), each request of one of ``--sessions`` sessions (its own system
prompt; its id new every ``--session-s``, so that sessions pinned to the target end),
its own never-cached text first, ``--max-tokens`` tokens out. The lab without scaling
has no WARM standby unless ``--without-warm``: a failover wakes its target's WARM
replicas by itself, scaler or not. The simulators are slowed down
(``--max-num-seqs``, ``--decode-tokens-per-s``) so that one replica sustains a few
requests/s: the target's ACTIVE replicas carry its own load at about half their
capacity, and its own plus the moved load at about all of it.

Capacity: the lab runs no capacity probe, so before the load starts the bench writes each
unit's ``capacity/<unit>`` as a probe would (one replica's sustained rate from the
simulator's service model, ``max_num_seqs / (prefill + max_tokens / decode rate)``, with
``--factor-of-safety``): the scaler then sizes per replica, not the typed capacity_rps
over the replicas serving now (which scales a pool in proportion and never back).

Phases: ``--settle-s`` of load (with scaling, then until the target is at ``--active``
ACTIVE and the leader asks for as many, at most ``--settle-limit-s``: the forecast
overshoots the load's start), then ``--before-s`` (the **before** p99); a manual
failover of the source to the target (``RequestFailover``, ``force``, ``--to``, as
``failoverctl failover`` does); ``--after-s`` (the **after** p99, the first minute by
default: requests sent in that window); then ``RequestRecovery`` of the source and, with
scaling, ``scaled_back_s``: from the source NORMAL again until the target's ACTIVE count
(as published in ``pools/us-west``) is back at its count before the failover (at most
``--scale-back-limit-s``). The third region (``us-central``) is in another zone and
idle. Ratios: after p99 ÷ before p99 of the same lab.

The timings are the lab's compressed ones (``chaos/lab/spec.py``: probes every 0.5 s,
``scaling`` horizon 10 s and stable window 30 s, recovery 25 % a second, pool dwell 5 s
ACTIVE); the headline's ``compressed`` says which.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from bench._common import BenchError, Reporter, goals_and_met, main, percentile
from bench._stream import streamed_completion
from chaos.drills.traffic import system_prompt
from chaos.lab.deployment import LocalDeployment
from chaos.lab.run import running_lab
from chaos.lab.spec import LAB_SCALING, SIM_ARGS, DeploymentSpec, WarmPoolSpec
from chaos.lab.surge import capacity_record
from chaos.lab.surge import write_capacity as write_records
from controlplane.kernel.codec import decode
from controlplane.kernel.model import RegionRecord, RegionState
from controlplane.kernel.pool.loans import read_members
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig

SOURCE, TARGET, OTHER = "us-east", "us-west", "us-central"
QUESTION_WORDS = 100  # a request's own words: 4 characters, one token each, never cached


@dataclass(frozen=True)
class Goals:
    p99_ratio_with: float = 1.5


# ---- the load -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Sent:
    at: float  # s since the load started, when it was sent
    region: str  # the gateway it went in by
    ttft_s: float | None  # None: failed


@dataclass
class Load:
    """Open-loop Poisson arrivals into each gateway, seeded: the same in both labs."""

    gateways: dict[str, str]
    rate: float
    sessions: int
    max_tokens: int
    seed: int
    session_s: float  # a session's life: then its id is new (and so is its pin)
    results: list[Sent] = field(default_factory=list)
    t0: float = 0.0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, http: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        self.t0 = time.monotonic()
        await asyncio.gather(
            *(self._arrivals(http, r, i, stop) for i, r in enumerate(self.gateways))
        )
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=30)

    async def _arrivals(
        self, http: aiohttp.ClientSession, region: str, index: int, stop: asyncio.Event
    ) -> None:
        rng = random.Random(self.seed * 1000 + index)
        at = 0.0
        n = 0
        while not stop.is_set():
            at += rng.expovariate(self.rate)
            delay = self.t0 + at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return
            session = rng.randrange(self.sessions)
            n += 1
            task = asyncio.create_task(self._one(http, region, session, n))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _one(self, http: aiohttp.ClientSession, region: str, session: int, n: int) -> None:
        sent = time.monotonic() - self.t0
        body = {
            "model": "tiny",
            "prompt": f"{system_prompt(session)}\n{question(region, n)}",
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        life = int(sent // self.session_s)
        headers = {"x-session-id": f"{region}-s{session}-{life}"}
        try:
            got = await streamed_completion(http, self.gateways[region], body, headers)
            self.results.append(Sent(sent, region, got.ttft_s))
        except (BenchError, aiohttp.ClientError, TimeoutError, ValueError):
            self.results.append(Sent(sent, region, None))

    def window(self, start: float, end: float, region: str | None = None) -> list[Sent]:
        return [
            s
            for s in self.results
            if start <= s.at < end and (region is None or s.region == region)
        ]


def question(region: str, n: int) -> str:
    """A request's own text: unique from its first token, ``QUESTION_WORDS`` tokens long
    (the simulator's tokenizer cuts four characters a token), so it is never cached."""
    words = " ".join(f"{chr(97 + (n * 7 + i) % 26)}{i:03d}" for i in range(QUESTION_WORDS))
    return f"Request {region}-{n}: {words}"


def p99(sent: list[Sent]) -> float | None:
    return percentile([s.ttft_s for s in sent if s.ttft_s is not None], 99)


# ---- the lab ------------------------------------------------------------------------------
def spec_of(args: argparse.Namespace, scaling: bool) -> DeploymentSpec:
    sim_args = (
        *SIM_ARGS,
        *("--max-num-seqs", str(args.max_num_seqs)),
        *("--decode-tokens-per-s", str(args.decode_tokens_per_s)),
        *("--prefill-tokens-per-s", str(args.prefill_tokens_per_s)),
        *("--log-level", "WARNING"),
    )
    return dataclasses.replace(
        DeploymentSpec(),
        sim_args=sim_args,
        zones=((OTHER, "eu"),),  # one target in the source's zone
        warm_pool=pool_of(args, scaling),
        scaling=scaling,
    )


def pool_of(args: argparse.Namespace, scaling: bool) -> WarmPoolSpec:
    """With scaling: ``--active`` + ``--warm`` in ``--size`` slots. Without: no standby
    unless ``--without-warm`` (a failover wakes every WARM replica of its target by
    itself, scaler or not, so a pool with standby grows without any scaler)."""
    if scaling:
        return WarmPoolSpec(active=args.active, warm=args.warm, size=args.size)
    warm = args.without_warm
    return WarmPoolSpec(active=args.active, warm=warm, size=args.active + warm)


def replica_rps(args: argparse.Namespace) -> float:
    """What one simulator sustains: its slots over one request's service time."""
    prefill = QUESTION_WORDS / args.prefill_tokens_per_s
    service = prefill + args.max_tokens / args.decode_tokens_per_s
    return float(args.max_num_seqs / service)


async def write_capacity(store: EtcdStore, dep: LocalDeployment, args: argparse.Namespace) -> None:
    """``capacity/<unit>`` as a capacity probe would write it (the lab runs none)."""
    records = [
        capacity_record(
            unit,
            replica_rps(args),
            active=args.active,
            prompt_tokens=QUESTION_WORDS * 2,
            max_tokens=args.max_tokens,
            factor_of_safety=args.factor_of_safety,
            prober="bench surge (modelled)",
        )
        for unit in dep.spec.units
    ]
    await write_records(store, dep.keys, records)


class Lab:
    def __init__(self, dep: LocalDeployment, store: EtcdStore) -> None:
        self.dep, self.store, self.keys = dep, store, dep.keys
        self.channels = [grpc.aio.insecure_channel(t) for t in dep.cp_targets]
        self.stubs = [pb_grpc.ControlPlaneStub(c) for c in self.channels]  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        for c in self.channels:
            await c.close()

    async def call(self, fn: Callable[[pb_grpc.ControlPlaneStub], object]) -> object:
        last: Exception | None = None
        for stub in self.stubs:
            try:
                return await fn(stub)  # type: ignore[misc]
            except grpc.aio.AioRpcError as e:
                last = e
        raise BenchError(f"no control-plane replica answers: {last}")

    async def record(self, unit: str) -> RegionRecord | None:
        kv = await self.store.get(self.keys.region_state(unit))
        return None if kv is None else decode(RegionRecord, kv.value, kv.key)

    async def active(self, unit: str) -> int | None:
        m = await read_members(self.store, self.keys, unit)
        return None if m is None else len(m.active)

    async def scale(self, unit: str) -> ScaleRecord | None:
        kv = await self.store.get(self.keys.scale(unit))
        return None if kv is None else decode(ScaleRecord, kv.value, kv.key)

    async def desired(self, unit: str) -> int | None:
        rec = await self.scale(unit)
        return None if rec is None else rec.active

    async def reasons(self, unit: str) -> list[str]:
        rec = await self.scale(unit)
        return [] if rec is None else list(rec.reasons)

    async def wait(self, pred: Callable[[], object], within: float, what: str) -> float:
        t0 = time.monotonic()
        while not await pred():  # type: ignore[misc]
            if time.monotonic() - t0 > within:
                raise BenchError(f"{what}: not reached within {within:g} s")
            await asyncio.sleep(0.2)
        return time.monotonic() - t0

    async def steady(self) -> bool:
        st: pb.StatusResponse = await self.call(  # type: ignore[assignment]
            lambda s: s.GetStatus(pb.GetStatusRequest(), timeout=2)
        )
        ok = bool(st.leader) and all(
            r.state == pb.NORMAL and r.health == pb.HEALTHY for r in st.regions
        )
        return ok and all([(await self.active(u) or 0) >= 1 for u in self.dep.spec.units])


# ---- one lab ------------------------------------------------------------------------------
async def one_lab(args: argparse.Namespace, scaling: bool, out: Reporter) -> dict[str, object]:
    name = "with" if scaling else "without"
    workdir = Path(tempfile.mkdtemp(prefix=f"tectonic-bench-surge-{name}-"))
    async with running_lab(spec_of(args, scaling), workdir, say=out.progress) as dep:
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        lab = Lab(dep, store)
        try:
            await write_capacity(store, dep, args)
            await lab.wait(lab.steady, 90, "every region NORMAL and HEALTHY, pools published")
            return await drive(lab, args, scaling, out)
        finally:
            await lab.close()
            await store.close()


async def drive(
    lab: Lab, args: argparse.Namespace, scaling: bool, out: Reporter
) -> dict[str, object]:
    gateways = {r: lab.dep.gateway_urls[r] for r in (SOURCE, TARGET)}
    load = Load(gateways, args.rate, args.sessions, args.max_tokens, args.seed, args.session_s)
    stop = asyncio.Event()
    # [t, source ACTIVE, target ACTIVE, target desired]
    counts: list[tuple[float, int | None, int | None, int | None]] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as http:
        runner = asyncio.create_task(load.run(http, stop))
        await asyncio.sleep(0.1)

        async def sample() -> None:
            while True:
                t = round(time.monotonic() - load.t0, 1)
                source, target = await lab.active(SOURCE), await lab.active(TARGET)
                counts.append((t, source, target, await lab.desired(TARGET)))
                await asyncio.sleep(args.sample_s)

        sampler = asyncio.create_task(sample())
        try:
            out.progress(
                f"[{'scaling on' if scaling else 'scaling off'}] load: {args.rate:g} req/s into "
                f"{SOURCE} and {TARGET} each; settling {args.settle_s:g} s, then "
                f"{args.before_s:g} s before"
            )
            await asyncio.sleep(args.settle_s)
            if scaling:  # the scaler's answer to the load's start settles first
                settled = await settle(lab, args)
                out.progress(f"target at {args.active} ACTIVE after {settled}")
            before_start = time.monotonic() - load.t0
            await asyncio.sleep(args.before_s)
            failover_at = time.monotonic() - load.t0
            pre_active = await lab.active(TARGET)
            reasons = {"source_at_failover": await lab.reasons(SOURCE)}
            out.progress(f"failover {SOURCE} -> {TARGET} (target ACTIVE {pre_active})")
            await lab.call(
                lambda s: s.RequestFailover(
                    pb.FailoverRequest(
                        region=SOURCE,
                        to=[TARGET],
                        reason="bench surge",
                        actor="bench",
                        force=True,
                    ),
                    timeout=5,
                )
            )
            await asyncio.sleep(args.after_s)
            after_end = time.monotonic() - load.t0
            reasons["end_of_after_window"] = await lab.reasons(TARGET)
            out.progress(
                f"after {args.after_s:g} s: target ACTIVE {await lab.active(TARGET)}; recovering"
            )
            back = pb.RecoveryRequest(region=SOURCE, reason="bench surge", actor="bench")
            await lab.call(lambda s: s.RequestRecovery(back, timeout=5))

            async def normal() -> bool:
                rec = await lab.record(SOURCE)
                return rec is not None and rec.state is RegionState.NORMAL

            await lab.wait(normal, 60, f"{SOURCE} NORMAL again")
            recovered_at = time.monotonic() - load.t0
            out.progress(f"{SOURCE} recovered at t+{recovered_at:.0f}s")
            scaled_back_s: float | None = None
            if scaling and pre_active is not None:

                async def back_down() -> bool:
                    n = await lab.active(TARGET)
                    return n is not None and n <= pre_active

                try:
                    await lab.wait(back_down, args.scale_back_limit_s, "the target scaled back")
                    scaled_back_s = round(time.monotonic() - load.t0 - recovered_at, 1)
                    out.progress(f"target back at {pre_active} ACTIVE after {scaled_back_s} s")
                except BenchError as e:
                    out.progress(f"{e}")
                reasons["end"] = await lab.reasons(TARGET)
        finally:
            stop.set()
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await runner
    before = load.window(before_start, failover_at)
    after = load.window(failover_at, after_end)
    b, a = p99(before), p99(after)
    peak = max(
        (n for t, _, n, _ in counts if n is not None and failover_at <= t <= after_end),
        default=None,
    )
    return {
        "scaling": scaling,
        "ttft_p99_before_s": _r(b),
        "ttft_p99_after_s": _r(a),
        "p99_ratio": _r(a / b if a is not None and b else None),
        "ttft_p50_before_s": _r(percentile([s.ttft_s for s in before if s.ttft_s is not None], 50)),
        "ttft_p50_after_s": _r(percentile([s.ttft_s for s in after if s.ttft_s is not None], 50)),
        "requests_before": len(before),
        "requests_after": len(after),
        "failed_before": sum(s.ttft_s is None for s in before),
        "failed_after": sum(s.ttft_s is None for s in after),
        "failed_total": sum(s.ttft_s is None for s in load.results),
        "target_active_before": pre_active,
        "target_active_peak": peak,
        "failover_at_s": round(failover_at, 1),
        "recovered_at_s": round(recovered_at, 1),
        "scaled_back_s": scaled_back_s,
        "ttft_p99_by_gateway_s": {
            r: {
                "before": _r(p99(load.window(before_start, failover_at, r))),
                "after": _r(p99(load.window(failover_at, after_end, r))),
            }
            for r in (SOURCE, TARGET)
        },
        "target_scale_reasons": reasons,
        # every sample: [s since the load started, source ACTIVE, target ACTIVE,
        # target's desired ACTIVE in scale/<unit> (None: no record)]
        "replica_counts": _compact(counts),
    }


async def settle(lab: Lab, args: argparse.Namespace) -> str:
    """Wait (at most ``--settle-limit-s``) until the target runs ``--active`` ACTIVE
    replicas and the leader asks for as many: the forecast overshoots the load's start,
    and the extras go after the stable window. How long it took, in words."""
    t0 = time.monotonic()

    async def at_size() -> bool:
        active, desired = await lab.active(TARGET), await lab.desired(TARGET)
        return bool(active == desired == args.active)

    try:
        await lab.wait(at_size, args.settle_limit_s, "")
    except BenchError:
        return f"{args.settle_limit_s:g} s more: not reached, {await lab.active(TARGET)} ACTIVE"
    return f"{time.monotonic() - t0:.0f} s more"


def _compact(rows: list[tuple[float, int | None, int | None, int | None]]) -> list[list[object]]:
    """The samples where a count changed (and the first and last)."""
    kept: list[list[object]] = []
    for i, row in enumerate(rows):
        if not kept or list(row[1:]) != kept[-1][1:] or i == len(rows) - 1:
            kept.append(list(row))
    return kept


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


async def measure(args: argparse.Namespace, out: Reporter) -> dict[str, object]:
    t0 = time.monotonic()
    with_ = await one_lab(args, True, out)
    out.line({"run": "with_scaling", **with_})
    without = await one_lab(args, False, out)
    out.line({"run": "without_scaling", **without})
    figures = {"p99_ratio_with": _num(with_["p99_ratio"])}
    return {
        "bench": "surge",
        "p99_ratio_with": with_["p99_ratio"],
        "p99_ratio_without": without["p99_ratio"],
        "scaled_back_s": with_["scaled_back_s"],
        "ttft_p99_before_with_s": with_["ttft_p99_before_s"],
        "ttft_p99_after_with_s": with_["ttft_p99_after_s"],
        "ttft_p99_before_without_s": without["ttft_p99_before_s"],
        "ttft_p99_after_without_s": without["ttft_p99_after_s"],
        "target_active_before": with_["target_active_before"],
        "target_active_peak_with": with_["target_active_peak"],
        "target_active_peak_without": without["target_active_peak"],
        "replica_rps_modelled": round(replica_rps(args), 2),
        "rate_rps_per_region": args.rate,
        "with_scaling": with_,
        "without_scaling": without,
        "compressed": {
            "after_window_s": args.after_s,
            "scaling": dict(LAB_SCALING),
            "pool_dwell": {"active_min_s": WarmPoolSpec().active_min_s},
            "probe_interval_s": 0.5,
            "recovery": "25 % a second",
            "capacity": "modelled, written to capacity/<unit> (no probe runs in the lab)",
        },
        **goals_and_met(Goals(), figures),
        "runtime_s": round(time.monotonic() - t0, 1),
    }


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) else None


EPILOG = """figures (last line, JSON):
  p99_ratio_with       first-token p99 of the requests sent in the --after-s after the
                       failover ÷ that of the --before-s before it, scaling on (goal <= 1.5)
  p99_ratio_without    the same with the topology's scaling: section removed
  scaled_back_s        from the source NORMAL again until the target's ACTIVE count is
                       back at its count before the failover (scaling on; null: off)
  replica_counts       [t, source ACTIVE, target ACTIVE, target desired] when one changed

example: python -m bench surge --after-s 30 --quiet"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument(
        "--rate", type=float, default=3.5, help="req/s into each of source and target (3.5)"
    )
    p.add_argument("--settle-s", type=float, default=10.0, help="load before measuring (10)")
    p.add_argument("--before-s", type=float, default=30.0, help="the before window (30)")
    p.add_argument("--after-s", type=float, default=60.0, help="the window after the failover (60)")
    p.add_argument(
        "--scale-back-limit-s",
        type=float,
        default=90.0,
        help="the longest wait for the target to scale back after recovery (90)",
    )
    p.add_argument(
        "--settle-limit-s",
        type=float,
        default=60.0,
        help="with scaling, then wait at most this long for the target at --active "
        "ACTIVE replicas (60)",
    )
    p.add_argument("--sessions", type=int, default=40, help="sessions per gateway (40)")
    p.add_argument(
        "--session-s",
        type=float,
        default=10.0,
        help="a session's life: its id (and its pin to a region) is new after this (10)",
    )
    p.add_argument("--max-tokens", type=int, default=8, help="tokens per answer (8)")
    p.add_argument("--max-num-seqs", type=int, default=2, help="simulator slots (2)")
    p.add_argument(
        "--decode-tokens-per-s", type=float, default=20.0, help="simulator decode rate (20)"
    )
    p.add_argument(
        "--prefill-tokens-per-s", type=float, default=1000.0, help="simulator prefill rate (1000)"
    )
    p.add_argument("--active", type=int, default=2, help="each pool's ACTIVE replicas (2)")
    p.add_argument("--warm", type=int, default=2, help="each pool's WARM replicas (2)")
    p.add_argument("--size", type=int, default=4, help="each pool's slots (4)")
    p.add_argument(
        "--without-warm",
        type=int,
        default=0,
        help="WARM replicas of each pool in the run without scaling (0: none; a failover "
        "wakes its target's WARM replicas by itself)",
    )
    p.add_argument(
        "--factor-of-safety",
        type=float,
        default=1.0,
        help="of the modelled capacity record: allowed = sustained / this (1.0: the "
        "figures of the earlier runs; 1.5 and 2.0 measured in bench/results/surge.md)",
    )
    p.add_argument("--sample-s", type=float, default=1.0, help="s between replica counts (1)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    out = Reporter(args.quiet)
    return main(lambda: asyncio.run(measure(args, out)), (BenchError, TimeoutError))
