"""``python -m bench overload``: twice the allowed load, with and without admission control.

A real etcd, ``--replicas`` simulators and a gateway process in front of them, started
afresh for each of two phases: the gateway with ``--admission`` (regions/gateway/
admission_gate.py: per-replica in-flight limits steered by first-token time, a short
queue, 429 with Retry-After) and without. Each phase offers the same open-loop load for
``--duration`` seconds: Poisson arrivals at ``--load`` x the allowed capacity, streamed
completions without a session, ``--batch-share`` of them ``x-priority: batch`` and the
rest ``interactive``. The client times each first token; a request with none after
``--cutoff`` x the SLO is given up (late).

**Allowed capacity, from a queue model** of the simulators' configuration: a simulator
runs ``--engine-seqs`` requests at once, each for its prefill (prompt tokens / prefill
rate) and ``max_tokens - 1`` decode steps, and queues the rest FIFO (regions/simulator/
scheduler.py). The region is modelled as one M/D/c queue with c = replicas x engine
seqs (the best any balancing can do, so the hardest goal): the ultimate load is the
highest Poisson rate whose simulated first-token p99 (wait + prefill) stays within the
region's SLO (bisection over 50,000 simulated arrivals per rate), and the allowed load
is the ultimate over the region's factor of safety, ``--factor-of-safety`` (1 by
default: the goal is then 0.9 of the most the replicas carry within the SLO at all, and
the offered load twice it, past their throughput, where the model predicts a queue that
only grows).

**Figures** per phase: goodput (requests answered with their first token within the
SLO, per second of the offered window), the first-token p50/p99 of admitted requests
(answered 200), and the share refused (429) and given up, by priority. Headline:
``goodput_ratio`` (with admission: goodput / allowed capacity), ``admitted_p99_over_slo``,
``goodput_ratio_without``, ``interactive_refused_share``, ``batch_refused_share``; goals:
goodput >= 0.9 x allowed, admitted p99 within the SLO, batch refused more than
interactive. Figures and sizing: bench/README.md (latest) and bench/results/overload.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench._common import (
    BenchError,
    Reporter,
    at_least,
    kill_all,
    main,
    percentile,
    write_routing,
    write_topology,
)
from bench.overload_checks import Lag, Pace, completed, cpu_seconds, tick, validity, watch_slots
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, spawn, start_simulators
from regions.pool.processes import read_ready

REGION = "bench"
CLUSTER = "bench-overload"
MODEL = "tiny"
PRIORITIES = ("interactive", "batch")


@dataclass(frozen=True)
class Options:
    duration: float = 60.0
    load: float = 2.0  # offered / allowed
    batch_share: float = 0.3
    replicas: int = 2
    engine_seqs: int = 4
    max_tokens: int = 9
    decode_rate: float = 40.0
    prefill_rate: float = 20_000.0
    slo_s: float = 2.0  # the region's slo.ttft_p99_s
    factor_of_safety: float = 1.0
    max_wait: float = 1.0  # the gateway's --admission-max-wait
    cutoff: float = 3.0  # x the SLO: a request without a first token by then is given up
    seed: int = 1
    quiet: bool = False


# ---- the model: what the replicas carry within the SLO -----------------------------------


@dataclass(frozen=True)
class Model:
    servers: int  # requests running at once in the region
    prefill_s: float
    service_s: float  # one request's time in its slot: prefill + decode steps
    slo_s: float
    factor_of_safety: float

    @property
    def throughput_rps(self) -> float:
        return self.servers / self.service_s

    def ttft_p99(self, rate: float, arrivals: int = 50_000, seed: int = 7) -> float:
        """First-token p99 of an M/D/c queue at ``rate``: FIFO wait for the first free
        of ``servers`` slots, plus the prefill (simulated, exact for the model)."""
        rng = random.Random(seed)
        free = [0.0] * self.servers
        t = 0.0
        waits = []
        for _ in range(arrivals):
            t += rng.expovariate(rate)
            start = max(t, heapq.heappop(free))
            waits.append(start - t)
            heapq.heappush(free, start + self.service_s)
        p99 = percentile(waits, 99)
        assert p99 is not None
        return p99 + self.prefill_s

    def ultimate_rps(self) -> float:
        """The highest rate whose first-token p99 is within the SLO (bisection)."""
        lo, hi = 0.0, self.throughput_rps
        for _ in range(20):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.ttft_p99(mid) <= self.slo_s else (lo, mid)
        return lo

    def summary(self, ultimate: float) -> dict[str, float]:
        return {
            "servers": self.servers,
            "service_s": round(self.service_s, 4),
            "throughput_rps": round(self.throughput_rps, 2),
            "ultimate_rps": round(ultimate, 2),
            "factor_of_safety": self.factor_of_safety,
            "allowed_rps": round(ultimate / self.factor_of_safety, 2),
            "slo_s": self.slo_s,
        }


def model_for(o: Options, prompt_tokens: int) -> Model:
    prefill = prompt_tokens / o.prefill_rate
    return Model(
        servers=o.replicas * o.engine_seqs,
        prefill_s=prefill,
        service_s=prefill + (o.max_tokens - 1) / o.decode_rate,
        slo_s=o.slo_s,
        factor_of_safety=o.factor_of_safety,
    )


# ---- the deployment ---------------------------------------------------------------------


def sim_args(o: Options) -> list[str]:
    return [
        "--max-num-seqs",
        str(o.engine_seqs),
        "--prefill-tokens-per-s",
        str(o.prefill_rate),
        "--decode-tokens-per-s",
        str(o.decode_rate),
        "--no-enable-prefix-caching",  # every request costs the same: the model is exact
        "--log-level",
        "WARNING",
    ]


def admission_args(o: Options) -> list[str]:
    return ["--admission", "--admission-max-wait", str(o.max_wait)]


@dataclass(frozen=True)
class Deployed:
    gateway: str
    replicas: list[str]
    gateway_pid: int = 0


@contextlib.contextmanager
def deployment(o: Options, etcd: EtcdServer, tmp: Path, admission: bool) -> Iterator[Deployed]:
    """Fresh simulators (no queue left from the phase before) and a gateway."""
    procs: list[Proc] = []
    try:
        sims = start_simulators(o.replicas, extra_args=sim_args(o), timeout=60)
        procs += sims
        topo: dict[str, object] = {
            "cluster": CLUSTER,
            "etcd": {"endpoints": [etcd.endpoint]},
            "regions": [
                {
                    "name": REGION,
                    "zone": "z",
                    "agent": "127.0.0.1:9",
                    "capacity_rps": 1000,
                    "replicas": [s.url for s in sims],
                    "slo": {"ttft_p99_s": o.slo_s},
                    "factor_of_safety": o.factor_of_safety,
                }
            ],
        }
        path = write_topology(tmp / "topology.yaml", topo)
        gw = spawn(
            [
                "-m",
                "regions.gateway",
                "--topology",
                str(path),
                "--region",
                REGION,
                "--listen",
                "127.0.0.1:0",
                "--no-prefix-tracking",
                "--log-level",
                "WARNING",
                *(admission_args(o) if admission else ()),
            ],
            "bench-overload-gateway",
            stdout_pipe=True,
        )
        procs.append(gw)
        gw.url = read_ready(gw, time.monotonic() + 30)
        yield Deployed(gw.url, [s.url for s in sims], gw.pid)
    finally:
        kill_all(procs)


# ---- the load ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rec:
    priority: str
    status: int  # 0: given up (no first token by the cutoff) or a transport error
    ttft_s: float | None  # client-side, for answers with a first token
    retry_after: bool = False


def prompt_for(i: int) -> str:
    """Distinct from the first characters (requests spread over the gateway's ring)."""
    return f"{i:07d} please summarise the incident report number {i} in one line"


async def one_request(
    http: aiohttp.ClientSession, url: str, i: int, priority: str, o: Options
) -> Rec:
    body = {
        "model": MODEL,
        "prompt": prompt_for(i),
        "max_tokens": o.max_tokens,
        "stream": True,
    }
    headers = {"x-priority": priority}
    t0 = time.monotonic()
    ttft: float | None = None
    try:
        # the first token within the cutoff, or the request is given up; the rest of
        # the stream is read untimed (it is a few decode steps)
        async with (
            asyncio.timeout(o.cutoff * o.slo_s) as first,
            http.post(url + "/v1/completions", json=body, headers=headers) as r,
        ):
            if r.status != 200:
                await r.read()
                return Rec(priority, r.status, None, "Retry-After" in r.headers)
            async for raw in r.content:
                if ttft is None and raw.startswith(b"data: {"):
                    ttft = time.monotonic() - t0
                    first.reschedule(None)
        return Rec(priority, 200 if ttft is not None else 0, ttft)
    except (aiohttp.ClientError, TimeoutError):
        return Rec(priority, 0, ttft)


@dataclass
class Checks:
    """What the phase says of the machine (bench/overload_checks.py)."""

    send: Lag = field(default_factory=Lag)
    loop: Lag = field(default_factory=Lag)
    pace: Pace = field(default_factory=Pace)


async def offer(
    d: Deployed, o: Options, rate: float, say: Reporter, checks: Checks | None = None
) -> list[Rec]:
    """Open loop: Poisson arrivals at ``rate`` for ``duration`` s, never waiting for
    answers; each request is given up ``cutoff`` x the SLO after it was sent. ``checks``
    gets the generator's lag and the replicas' pace over the window."""
    url = d.gateway
    checks = checks or Checks()
    rng = random.Random(o.seed)
    timeout = aiohttp.ClientTimeout(total=o.cutoff * o.slo_s + 10, sock_read=o.cutoff * o.slo_s)
    connector = aiohttp.TCPConnector(limit=0)
    records: list[Rec] = []
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

        async def send(i: int, priority: str) -> None:
            records.append(await one_request(http, url, i, priority, o))

        await _warm(http, url, o)
        (done0, tokens0), cpu0 = await completed(http, d.replicas), cpu_seconds(d.gateway_pid)
        watchers = [
            asyncio.create_task(tick(checks.loop)),
            asyncio.create_task(watch_slots(http, d.replicas, o.engine_seqs, checks.pace)),
        ]
        loop = asyncio.get_running_loop()
        start = loop.time()
        at, i = 0.0, 0
        while True:
            at += rng.expovariate(rate)
            if at >= o.duration:
                break
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            checks.send.add(loop.time() - (start + at))
            priority = "batch" if rng.random() < o.batch_share else "interactive"
            task = asyncio.create_task(send(i, priority))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
            if i % max(1, int(rate * 10)) == 0:
                say.progress(f"  {at:.0f} s: {i} sent, {len(tasks)} open")
        await asyncio.sleep(max(0.0, start + o.duration - loop.time()))
        for w in watchers:
            w.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        done1, tokens1 = await completed(http, d.replicas)
        checks.pace.completed, checks.pace.generated = done1 - done0, tokens1 - tokens0
        cpu1 = cpu_seconds(d.gateway_pid)
        if cpu0 is not None and cpu1 is not None:
            checks.pace.gateway_cpu_s = cpu1 - cpu0
        if tasks:
            await asyncio.wait(tasks)
    return records


async def _warm(http: aiohttp.ClientSession, url: str, o: Options) -> None:
    """A few requests first: connections, and a gateway that has routed before."""
    for i in range(4):
        got = await one_request(http, url, -1 - i, "interactive", o)
        if got.status != 200:
            raise BenchError(f"{url}: the warm-up request got HTTP {got.status}")


async def prompt_tokens(url: str) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/tokenize", json={"model": MODEL, "prompt": prompt_for(0)}) as r,
    ):
        if r.status != 200:
            raise BenchError(f"{url}/tokenize: HTTP {r.status}")
        return int((await r.json())["count"])


async def gateway_admission(url: str) -> dict[str, object]:
    """The gateway's admission figures from its /metrics: the final limit per replica,
    and admitted / queued / refused by priority."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, object] = {"limits": {}, "admitted": {}, "queued": {}, "refused": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "tectonic_gateway_admission_limit":
                out["limits"][s.labels["endpoint"]] = s.value  # type: ignore[index]
            for kind in ("admitted", "queued", "refused"):
                if s.name == f"tectonic_gateway_admission_{kind}_total":
                    counts = out[kind]
                    assert isinstance(counts, dict)
                    p = s.labels["priority"]
                    counts[p] = counts.get(p, 0) + int(s.value)
    return out


# ---- figures ----------------------------------------------------------------------------


@dataclass
class Phase:
    admission: bool
    records: list[Rec]
    gateway: dict[str, object] = field(default_factory=dict)
    checks: Checks = field(default_factory=Checks)
    model_rps: float = 0.0  # what the replicas run at most, by their configuration

    def machine(self, o: Options) -> dict[str, object]:
        """The generator's lag, the replicas' pace, and why the phase is not valid."""
        send, loop = self.checks.send.summary(), self.checks.loop.summary()
        pace = self.checks.pace.summary(o.duration, self.model_rps, o.max_tokens)
        return {
            "send_lag": send,
            "loop_lag": loop,
            **pace,
            "not_valid_because": validity(send, loop, pace),
        }

    def good(self, slo_s: float) -> int:
        return sum(
            r.status == 200 and r.ttft_s is not None and r.ttft_s <= slo_s for r in self.records
        )

    def admitted_ttfts(self) -> list[float]:
        return [r.ttft_s for r in self.records if r.status == 200 and r.ttft_s is not None]

    def share(self, priority: str, status: int) -> float:
        mine = [r for r in self.records if r.priority == priority]
        return sum(r.status == status for r in mine) / len(mine) if mine else 0.0

    def summary(self, o: Options, allowed: float) -> dict[str, object]:
        ttfts = self.admitted_ttfts()
        p50, p99 = percentile(ttfts, 50), percentile(ttfts, 99)
        good = self.good(o.slo_s)
        refused_429 = [r for r in self.records if r.status == 429]
        return {
            "phase": "admission" if self.admission else "none",
            "sent": len(self.records),
            "admitted": len(ttfts),
            "within_slo": good,
            "goodput_rps": round(good / o.duration, 2),
            "goodput_ratio": round(good / o.duration / allowed, 3),
            "admitted_p50_s": _round(p50),
            "admitted_p99_s": _round(p99),
            "refused": {p: round(self.share(p, 429), 3) for p in PRIORITIES},
            "given_up": {p: round(self.share(p, 0), 3) for p in PRIORITIES},
            "refused_count": len(refused_429),
            "refusals_with_retry_after": sum(r.retry_after for r in refused_429),
            "other_statuses": sorted({r.status for r in self.records} - {0, 200, 429}),
            "machine": self.machine(o),
            **({"gateway": self.gateway} if self.gateway else {}),
        }


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


@dataclass(frozen=True)
class Goals:
    goodput_ratio: float = 0.9  # at least
    admitted_p99_over_slo: float = 1.0


def headline(
    o: Options, model: Model, ultimate: float, with_: Phase, without: Phase
) -> dict[str, object]:
    allowed = ultimate / o.factor_of_safety
    on, off = with_.summary(o, allowed), without.summary(o, allowed)
    p99 = percentile(with_.admitted_ttfts(), 99)
    p99_off = percentile(without.admitted_ttfts(), 99)
    goodput = round(with_.good(o.slo_s) / o.duration / allowed, 3)
    interactive = round(with_.share("interactive", 429), 3)
    batch = round(with_.share("batch", 429), 3)
    figures = {
        "goodput_ratio": goodput,
        "admitted_p99_over_slo": _round(None if p99 is None else p99 / o.slo_s),
        "goodput_ratio_without": round(without.good(o.slo_s) / o.duration / allowed, 3),
        "interactive_refused_share": interactive,
        "batch_refused_share": batch,
    }
    why = {
        "admission" if p.admission else "none": p.machine(o)["not_valid_because"]
        for p in (with_, without)
    }
    goals = Goals()
    met = {
        "goodput_ratio": goodput >= goals.goodput_ratio,
        "admitted_p99_over_slo": p99 is not None and p99 / o.slo_s <= goals.admitted_p99_over_slo,
        "batch_refused_first": batch > interactive,
    }
    return {
        "bench": "overload",
        "cores": os.cpu_count(),
        "duration_s": o.duration,
        "offered_rps": round(o.load * allowed, 2),
        "batch_share": o.batch_share,
        "model": model.summary(ultimate),
        **figures,
        "admitted_p99_over_slo_without": _round(None if p99_off is None else p99_off / o.slo_s),
        "phases": [on, off],
        "goals": {**asdict(goals), "batch_refused_first": True},
        "met": met,
        # a run the machine disturbed says nothing of the gateway, met or not
        "valid": not any(why.values()),
        "not_valid_because": {k: v for k, v in why.items() if v},
    }


# ---- running ----------------------------------------------------------------------------


async def _phase(
    d: Deployed, o: Options, rate: float, admission: bool, model_rps: float, say: Reporter
) -> Phase:
    checks = Checks()
    records = await offer(d, o, rate, say, checks)
    gateway = await gateway_admission(d.gateway) if admission else {}
    return Phase(admission, records, gateway, checks, model_rps)


def run_bench(o: Options, say: Reporter) -> dict[str, object]:
    with (
        tempfile.TemporaryDirectory(prefix="tectonic-bench-overload-") as tmp,
        EtcdServer() as etcd,
    ):
        asyncio.run(write_routing(etcd.endpoint, CLUSTER, REGION))
        phases: dict[bool, Phase] = {}
        model: Model | None = None
        ultimate = rate = 0.0
        for admission in (True, False):
            with deployment(o, etcd, Path(tmp), admission) as deployed:
                if model is None:
                    model = model_for(o, asyncio.run(prompt_tokens(deployed.replicas[0])))
                    say.progress("computing the allowed capacity from the queue model")
                    ultimate = model.ultimate_rps()
                    rate = o.load * ultimate / o.factor_of_safety
                    say.line({"model": model.summary(ultimate), "offered_rps": round(rate, 2)})
                say.progress(
                    f"{'with' if admission else 'without'} admission control: "
                    f"{rate:.1f} requests/s for {o.duration:g} s"
                )
                phase = asyncio.run(_phase(deployed, o, rate, admission, model.throughput_rps, say))
                phases[admission] = phase
                say.line(phase.summary(o, ultimate / o.factor_of_safety))
        assert model is not None
        return headline(o, model, ultimate, phases[True], phases[False])


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


_positive = at_least(1, "_positive")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--duration",
        type=_positive_float,
        default=60.0,
        help="seconds of offered load per phase (default 60)",
    )
    p.add_argument(
        "--load",
        type=_positive_float,
        default=2.0,
        help="offered load over the allowed capacity (default 2)",
    )
    p.add_argument(
        "--batch-share",
        type=_share,
        default=0.3,
        help="share of requests sent as x-priority: batch (default 0.3)",
    )
    p.add_argument("--replicas", type=_positive, default=2, help="simulators (default 2)")
    p.add_argument(
        "--engine-seqs",
        type=_positive,
        default=4,
        help="requests a simulator runs at once (default 4)",
    )
    p.add_argument("--max-tokens", type=_positive, default=9, help="tokens per answer (default 9)")
    p.add_argument(
        "--decode-rate",
        type=_positive_float,
        default=40.0,
        help="simulator decode tokens/s (default 40)",
    )
    p.add_argument(
        "--slo",
        type=_positive_float,
        default=2.0,
        help="the region's first-token p99 SLO in seconds (default 2)",
    )
    p.add_argument(
        "--factor-of-safety",
        type=_positive_float,
        default=1.0,
        help="the region's: allowed = ultimate / this (default 1)",
    )
    p.add_argument(
        "--max-wait",
        type=_positive_float,
        default=1.0,
        help="the gateway's --admission-max-wait (default 1)",
    )
    p.add_argument(
        "--cutoff",
        type=_positive_float,
        default=3.0,
        help="x the SLO: a request without a first token by then is given up (default 3)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def run(args: argparse.Namespace) -> int:
    if args.factor_of_safety < 1:
        print("error: --factor-of-safety must be at least 1", file=sys.stderr)
        return 2
    o = Options(
        duration=args.duration,
        load=args.load,
        batch_share=args.batch_share,
        replicas=args.replicas,
        engine_seqs=args.engine_seqs,
        max_tokens=args.max_tokens,
        decode_rate=args.decode_rate,
        slo_s=args.slo,
        factor_of_safety=args.factor_of_safety,
        max_wait=args.max_wait,
        cutoff=args.cutoff,
        seed=args.seed,
        quiet=args.quiet,
    )
    return main(lambda: run_bench(o, Reporter(o.quiet)), (BenchError, RuntimeError))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m bench.overload",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
