"""``python -m bench epp``: what Tectonic's endpoint picker costs behind a real Envoy.

One run starts a real etcd (holding ``routing/`` of one region), two simulators with a
fast latency model (they answer in microseconds plus their HTTP handling), one endpoint
picker (``tectonic-epp``), one Envoy per path from the shipped ``deploy/envoy/envoy.yaml``
and Tectonic's Python gateway, all in front of the same two simulators. The paths:

* ``direct``: Envoy alone, round robin over the two servers (no ext_proc): the baseline;
* ``header``: Envoy + the picker, header-only (request body mode NONE): the session
  header alone decides;
* ``body``: Envoy + the picker, BUFFERED body (the shipped default: prefix-aware
  routing and prefix counting read the prompt);
* ``full_duplex``: Envoy + the picker, FULL_DUPLEX_STREAMED body (an extra figure, not
  in the headline: which body mode is cheaper);
* ``gateway``: Tectonic's Python gateway alone.

One load generator (on uvloop, with the gateway's own lean HTTP/1.1 client, as
``bench gateway``) sends the same chat completions to every path (a session header
from a pool of ``--sessions`` ids; every ``--stream-every``-th request streams), in
alternating blocks (the order flips every round, so drift hits every path alike), in
two phases:

* **latency**: one request at a time: first byte (the first body bytes) and the whole
  request; ``added_ms_*`` = a path's percentile minus Envoy direct's, same run;
* **throughput**: ``--concurrency`` requests in flight: requests per second, and CPU
  per request of each process (from ``/proc/<pid>/stat``: Envoy, picker, gateway,
  simulators, the load generator); ``throughput_ratio_*`` is the median over rounds of
  the path's rate over Envoy direct's in the same round.

Every process shares this machine's cores (``cores`` in the output): Envoy's two
workers, the picker, the simulators and the load generator compete for them, so a
throughput ratio measures the CPU per request of all of them together (Envoy's own
ext_proc client included) more than what a picker on its own cores would allow.
The picker's CPU is also split by thread (``picker_threads_cpu_ms_per_request``: the
asyncio loop vs gRPC's own threads). ``--profile-picker FILE`` samples the picker with
py-spy meanwhile (``bench/epp_profile.py``) and reports where its CPU goes.

Each request the picker should route is checked to have been routed by it: a request
that Envoy sent down the fail-open route (picker slow or failing) fails the bench.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

from bench import epp_profile
from bench._common import (
    BenchError,
    Reporter,
    at_least,
    cpu_seconds,
    goals_and_met,
    kill_all,
    main,
    percentile,
    write_routing,
    write_topology,
)
from bench.gateway import FAST_SIM
from chaos.lab.envoy import BodyMode, EnvoyProc, EnvoySpec, start_envoy, stats
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_gateway, start_picker, start_simulators
from regions.gateway.upstream import UpstreamError, UpstreamPool
from regions.pool.processes import free_port

REGION = "bench"
CLUSTER = "bench-epp"
QUIET = ("--log-level", "WARNING")
# Envoy in front of the picker, by path; "gateway" has no Envoy.
PICKER_MODES: dict[str, BodyMode] = {
    "header": "none",
    "body": "buffered",
    "full_duplex": "full_duplex",
}
# Envoy's counters that say a request was routed by the picker, or went around it.
PICKED = "cluster.tectonic_picked.upstream_rq_total"
UNPICKED = "http.tectonic_inference.ext_proc.failure_mode_allowed"


@dataclass(frozen=True)
class Goals:
    added_ms_p50_header: float = 1.0
    added_ms_p50_body: float = 2.0
    throughput_ratio_header: float = 0.6
    throughput_ratio_body: float = 0.6


GOALS = Goals()


@dataclass(frozen=True)
class Options:
    requests: int = 300  # per block and path, latency phase
    throughput_requests: int = 1500  # per block and path, throughput phase
    blocks: int = 4  # rounds of (one block per path) per phase
    concurrency: int = 8
    sessions: int = 64
    max_tokens: int = 4
    stream_every: int = 2  # every n-th request streams (1: all, 0: none)
    full_duplex: bool = True  # also measure the full-duplex body mode
    profile: str = ""  # py-spy samples of the picker go to this file
    quiet: bool = False


@dataclass
class Side:
    """One path's measurements in one phase (or one block of it)."""

    first_byte: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    errors: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds used
    threads_s: dict[str, float] = field(default_factory=dict)  # picker thread -> CPU s

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed_s if self.elapsed_s else 0.0

    def add(self, other: Side) -> None:
        self.first_byte += other.first_byte
        self.latencies += other.latencies
        self.elapsed_s += other.elapsed_s
        self.errors += other.errors
        for totals, part in ((self.cpu_s, other.cpu_s), (self.threads_s, other.threads_s)):
            for name, seconds in part.items():
                totals[name] = totals.get(name, 0.0) + seconds


def _pct(values: Sequence[float], q: float) -> float:
    p = percentile(values, q)
    return math.nan if p is None else p


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# ---- CPU from /proc ---------------------------------------------------------------------


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of ``pid`` by thread name, summed over
    threads of one name; the first thread (the asyncio loop) is ``main``."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            stat = (task / "stat").read_text()
            name = "main" if task.name == str(pid) else stat.split("(", 1)[1].rsplit(")", 1)[0]
            fields = stat.rsplit(")", 1)[1].split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _used(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {name: s - before.get(name, 0.0) for name, s in after.items()}


# ---- the deployment ---------------------------------------------------------------------


@dataclass
class Deployed:
    urls: dict[str, str]  # path -> base URL
    envoys: dict[str, EnvoyProc]  # path -> its Envoy (every path but "gateway")
    pids: dict[str, int]  # "picker", "gateway", "sim0", "sim1" -> pid
    picker: Proc


def _topology(etcd: str, servers: Sequence[str]) -> dict[str, object]:
    return {
        "cluster": CLUSTER,
        "etcd": {"endpoints": [etcd]},
        "regions": [
            {
                "name": REGION,
                "zone": "z",
                "agent": "127.0.0.1:9",
                "capacity_rps": 100_000,
                "replicas": list(servers),
            }
        ],
    }


def _envoy(path: str, servers: Sequence[str], picker: str, workdir: Path) -> EnvoyProc:
    spec = EnvoySpec(
        listen_port=free_port(),
        admin_port=free_port(),
        pickers=[picker],
        servers=servers,
        body_mode=PICKER_MODES.get(path, "buffered"),
        direct=path == "direct",
    )
    return start_envoy(spec, workdir, name=f"envoy-{path}")


@contextlib.contextmanager
def deployment(tmp: Path, opts: Options, say: Reporter) -> Iterator[Deployed]:
    """etcd, two simulators, a picker, one Envoy per path and a gateway."""
    procs: list[Proc] = []
    with EtcdServer() as etcd:
        try:
            sims = start_simulators(2, extra_args=FAST_SIM)
            procs += sims
            servers = [f"127.0.0.1:{s.port}" for s in sims]
            topo = write_topology(
                tmp / "topology.yaml", _topology(etcd.endpoint, [s.url for s in sims])
            )
            asyncio.run(write_routing(etcd.endpoint, CLUSTER, REGION))
            say.progress("starting the picker, the Envoys and the gateway")
            picker = start_picker(topo, REGION, extra_args=QUIET)
            procs.append(picker)
            paths = ["direct", "header", "body", *(["full_duplex"] if opts.full_duplex else [])]
            envoys: dict[str, EnvoyProc] = {}
            for path in paths:
                envoys[path] = _envoy(path, servers, f"127.0.0.1:{picker.port}", tmp)
                procs.append(envoys[path])
            gateway = start_gateway(topo, REGION, extra_args=QUIET)
            procs.append(gateway)
            urls = {path: e.url for path, e in envoys.items()} | {"gateway": gateway.url}
            pids = {"picker": picker.pid, "gateway": gateway.pid}
            pids |= {f"sim{i}": s.pid for i, s in enumerate(sims)}
            yield Deployed(urls, envoys, pids, picker)
        finally:
            kill_all(procs)


# ---- load -------------------------------------------------------------------------------


def request_for(i: int, opts: Options) -> tuple[bytes, dict[str, str], bool]:
    """The i-th request of the mix (the same on every path): body, headers, streamed."""
    topic = i % 32  # a few shared prefixes, as in real traffic
    stream = opts.stream_every > 0 and i % opts.stream_every == 0
    body = json.dumps(
        {
            "model": "tiny",
            "max_tokens": opts.max_tokens,
            "stream": stream,
            "messages": [
                {"role": "system", "content": f"You answer about topic {topic}."},
                {"role": "user", "content": f"question {i}"},
            ],
        }
    ).encode()
    headers = {"content-type": "application/json", "x-session-id": f"bench-{i % opts.sessions}"}
    return body, headers, stream


async def timed_post(
    pool: UpstreamPool, url: str, body: bytes, headers: dict[str, str], stream: bool
) -> tuple[float, float] | None:
    """POST a chat completion; (first byte, whole response) in seconds, or None when it
    failed (not a 200, or a stream that did not end with ``[DONE]``)."""
    t0 = time.perf_counter()
    try:
        up = await pool.request(url, "POST", "/v1/chat/completions", headers.items(), body)
        try:
            first = await up.next_chunk()
            t_first = time.perf_counter() - t0
            last = first or b""
            while (chunk := await up.next_chunk()) is not None:
                last = chunk
        finally:
            up.release()
    except UpstreamError:
        return None
    if up.status != 200 or (stream and b"[DONE]" not in last):
        return None
    return t_first, time.perf_counter() - t0


async def drive(
    pool: UpstreamPool, url: str, opts: Options, count: int, concurrency: int, offset: int = 0
) -> Side:
    """``count`` requests, ``concurrency`` at a time."""
    side = Side()
    next_i = offset

    async def worker() -> None:
        nonlocal next_i
        while next_i < offset + count:
            i = next_i
            next_i += 1
            timed = await timed_post(pool, url, *request_for(i, opts))
            if timed is None:
                side.errors += 1
            else:
                side.first_byte.append(timed[0])
                side.latencies.append(timed[1])

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    side.elapsed_s = time.perf_counter() - t0
    return side


@dataclass
class Phase:
    total: dict[str, Side]
    rounds: list[dict[str, Side]]

    def round_ratios(self, path: str) -> list[float]:
        """``path``'s rps over Envoy direct's, each round (blocks seconds apart)."""
        return [r[path].rps / r["direct"].rps for r in self.rounds if r["direct"].rps]


def cpu_now(deployed: Deployed, path: str) -> dict[str, float]:
    """CPU seconds so far: the load generator, ``path``'s Envoy (if any), the rest."""
    now = {"load_generator": cpu_seconds()}
    if path in deployed.envoys:
        now["envoy"] = cpu_seconds(deployed.envoys[path].pid)
    return now | {name: cpu_seconds(pid) for name, pid in deployed.pids.items()}


async def phase(
    pool: UpstreamPool,
    deployed: Deployed,
    opts: Options,
    concurrency: int,
    count: int,
    say: Reporter,
) -> Phase:
    """One block of ``count`` requests per path per round; the order flips each round."""
    result = Phase({path: Side() for path in deployed.urls}, [])
    order = list(deployed.urls)
    picker_pid = deployed.pids["picker"]
    for b in range(opts.blocks):
        this_round: dict[str, Side] = {}
        for path in order if b % 2 == 0 else reversed(order):
            before, threads = cpu_now(deployed, path), thread_cpu_seconds(picker_pid)
            side = await drive(pool, deployed.urls[path], opts, count, concurrency, b * count)
            side.cpu_s = _used(cpu_now(deployed, path), before)
            side.threads_s = _used(thread_cpu_seconds(picker_pid), threads)
            this_round[path] = side
            result.total[path].add(side)
        result.rounds.append(this_round)
        say.progress(f"  round {b + 1}/{opts.blocks} done")
    return result


def routed_by_the_picker(deployed: Deployed, before: Mapping[str, dict[str, int]]) -> None:
    """Every request on a picker path went where the picker said: none failed open."""
    for path, envoy in deployed.envoys.items():
        if path == "direct":
            continue
        now = stats(envoy.admin_url)
        unpicked = now.get(UNPICKED, 0) - before[path].get(UNPICKED, 0)
        picked = now.get(PICKED, 0) - before[path].get(PICKED, 0)
        if unpicked or not picked:
            raise BenchError(
                f"{path}: {unpicked} requests failed open around the picker, {picked} "
                f"routed by it; picker log:\n{deployed.picker.log(3000)}"
            )


@contextlib.contextmanager
def sampled(pid: int, out: str) -> Iterator[None]:
    """py-spy samples ``pid`` into ``out`` meanwhile (nothing when ``out`` is '')."""
    if not out:
        yield
        return
    sampler = epp_profile.start(pid, out)
    try:
        yield
    except BaseException:
        sampler.kill()
        sampler.wait()
        raise
    epp_profile.stop(sampler)


async def measure(deployed: Deployed, opts: Options, say: Reporter) -> dict[str, object]:
    pool = UpstreamPool(max_idle=4096)
    try:
        say.progress("warming up (pins, connections)")
        for url in deployed.urls.values():
            await drive(pool, url, opts, max(200, opts.sessions * 2), opts.concurrency)
        before = {path: stats(e.admin_url) for path, e in deployed.envoys.items()}
        with sampled(deployed.pids["picker"], opts.profile):
            say.progress("latency phase (one request at a time)")
            lat = await phase(pool, deployed, opts, 1, opts.requests, say)
            say.progress(f"throughput phase ({opts.concurrency} in flight)")
            thr = await phase(pool, deployed, opts, opts.concurrency, opts.throughput_requests, say)
    finally:
        pool.close()
    errors = sum(s.errors for s in (*lat.total.values(), *thr.total.values()))
    if errors:
        raise BenchError(f"{errors} requests failed; the figures would be meaningless")
    routed_by_the_picker(deployed, before)
    for path in deployed.urls:
        say.line(path_line(path, lat.total[path], thr.total[path], opts))
    return headline(opts, lat, thr)


# ---- figures ----------------------------------------------------------------------------


def _per_request(seconds: Mapping[str, float], n: int) -> dict[str, float]:
    return {name: round(s * 1000 / n, 3) if n else 0.0 for name, s in sorted(seconds.items())}


def cpu_per_request(side: Side) -> dict[str, float]:
    """CPU ms per request by process (the path's own Envoy; 0 where the path has
    none); the two simulators as one figure."""
    cpu = {k: v for k, v in side.cpu_s.items() if not k.startswith("sim")}
    cpu["simulators"] = sum(v for k, v in side.cpu_s.items() if k.startswith("sim"))
    cpu.setdefault("envoy", 0.0)
    return _per_request(cpu, len(side.latencies))


def path_line(path: str, lat: Side, thr: Side, opts: Options) -> dict[str, object]:
    """One path's figures, both phases."""
    line: dict[str, object] = {
        "path": path,
        "latency": {
            "requests": len(lat.latencies),
            "first_byte_p50_ms": _ms(_pct(lat.first_byte, 50)),
            "first_byte_p99_ms": _ms(_pct(lat.first_byte, 99)),
            "p50_ms": _ms(_pct(lat.latencies, 50)),
            "p99_ms": _ms(_pct(lat.latencies, 99)),
        },
        "throughput": {
            "requests": len(thr.latencies),
            "concurrency": opts.concurrency,
            "rps": round(thr.rps, 1),
            "p50_ms": _ms(_pct(thr.latencies, 50)),
            "p99_ms": _ms(_pct(thr.latencies, 99)),
        },
        "cpu_ms_per_request": cpu_per_request(thr),
    }
    if path in PICKER_MODES:
        line["picker_threads_cpu_ms_per_request"] = _per_request(thr.threads_s, len(thr.latencies))
    return line


def _added(lat: Phase, path: str, q: float, *, first_byte: bool = False) -> float:
    """``path``'s q-th latency percentile minus Envoy direct's, in ms."""

    def values(side: Side) -> list[float]:
        return side.first_byte if first_byte else side.latencies

    return (_pct(values(lat.total[path]), q) - _pct(values(lat.total["direct"]), q)) * 1000


def _ratio(thr: Phase, path: str) -> float:
    ratios = thr.round_ratios(path)
    return _pct(ratios, 50) if ratios else 0.0


def _cpu_ms(thr: Phase, path: str, process: str) -> float:
    side = thr.total[path]
    n = len(side.latencies)
    return side.cpu_s.get(process, 0.0) * 1000 / n if n else math.nan


def against_direct(lat: Phase, thr: Phase, path: str) -> dict[str, object]:
    """What one path adds to Envoy direct, and what it keeps of its throughput."""
    return {
        "added_ms_p50": round(_added(lat, path, 50), 3),
        "added_ms_p99": round(_added(lat, path, 99), 3),
        "added_ms_p50_first_byte": round(_added(lat, path, 50, first_byte=True), 3),
        "added_ms_p99_first_byte": round(_added(lat, path, 99, first_byte=True), 3),
        "throughput_ratio": round(_ratio(thr, path), 3),
        "throughput_ratio_rounds": [round(r, 3) for r in thr.round_ratios(path)],
        "cpu_ms_per_request": cpu_per_request(thr.total[path]),
    }


def headline(opts: Options, lat: Phase, thr: Phase) -> dict[str, object]:
    figures = {
        "added_ms_p50_header": _added(lat, "header", 50),
        "added_ms_p99_header": _added(lat, "header", 99),
        "added_ms_p50_body": _added(lat, "body", 50),
        "throughput_ratio_header": _ratio(thr, "header"),
        "throughput_ratio_body": _ratio(thr, "body"),
        "picker_cpu_ms_per_request_header": _cpu_ms(thr, "header", "picker"),
        "picker_cpu_ms_per_request_body": _cpu_ms(thr, "body", "picker"),
        "gateway_cpu_ms_per_request": _cpu_ms(thr, "gateway", "gateway"),
    }
    streaming = f"1 in {opts.stream_every}" if opts.stream_every else "none"
    direct = thr.total["direct"]
    return {
        "bench": "epp",
        "cores": os.cpu_count(),
        "mix": f"chat completions with x-session-id, {streaming} streaming",
        "requests_per_path": {
            "latency": opts.requests * opts.blocks,
            "throughput": opts.throughput_requests * opts.blocks,
        },
        "concurrency": {"latency": 1, "throughput": opts.concurrency},
        **{k: round(v, 3) for k, v in figures.items()},
        "direct": {
            "p50_ms": _ms(_pct(lat.total["direct"].latencies, 50)),
            "p99_ms": _ms(_pct(lat.total["direct"].latencies, 99)),
            "rps": round(direct.rps, 1),
            "cpu_ms_per_request": cpu_per_request(direct),
        },
        "paths": {path: against_direct(lat, thr, path) for path in lat.total if path != "direct"},
        **goals_and_met(
            GOALS,
            figures,
            at_least={"throughput_ratio_header", "throughput_ratio_body"},
        ),
    }


# ---- running ----------------------------------------------------------------------------


def run_bench(opts: Options, say: Reporter) -> dict[str, object]:
    if opts.profile and epp_profile.py_spy() is None:
        raise BenchError("--profile-picker needs py-spy: pip install py-spy")
    say.progress("starting etcd and two fast simulators")
    with (
        tempfile.TemporaryDirectory(prefix="tectonic-bench-epp-") as tmp,
        deployment(Path(tmp), opts, say) as deployed,
    ):
        result = uvloop.run(measure(deployed, opts, say))
    if opts.profile:
        result["picker_profile"] = epp_profile.summary(opts.profile)
    return result


_positive = at_least(1, "_positive")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--requests",
        type=_positive,
        default=300,
        help="requests per block and path in the latency phase (default 300)",
    )
    p.add_argument(
        "--throughput-requests",
        type=_positive,
        default=1500,
        help="requests per block and path in the throughput phase (default 1500)",
    )
    p.add_argument(
        "--blocks", type=_positive, default=4, help="rounds of blocks per phase (default 4)"
    )
    p.add_argument(
        "--concurrency",
        type=_positive,
        default=8,
        help="requests in flight in the throughput phase (default 8: for 2 cores)",
    )
    p.add_argument("--sessions", type=_positive, default=64, help="session ids (default 64)")
    p.add_argument("--max-tokens", type=_positive, default=4, help="tokens per answer")
    p.add_argument(
        "--stream-every",
        type=at_least(0, "_count"),
        default=2,
        help="every n-th request streams (default 2: half; 0: none)",
    )
    p.add_argument(
        "--no-full-duplex",
        action="store_true",
        help="leave out the full-duplex body mode (an extra, not in the headline)",
    )
    p.add_argument(
        "--profile-picker",
        metavar="FILE",
        default="",
        help="sample the picker with py-spy (pip install py-spy) into FILE while measuring "
        "and add where its CPU went to the headline (py-spy slows the picker: the run's "
        "figures are then not comparable with others)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def run(args: argparse.Namespace) -> int:
    opts = Options(
        requests=args.requests,
        throughput_requests=args.throughput_requests,
        blocks=args.blocks,
        concurrency=args.concurrency,
        sessions=args.sessions,
        max_tokens=args.max_tokens,
        stream_every=args.stream_every,
        full_duplex=not args.no_full_duplex,
        profile=str(Path(args.profile_picker).resolve()) if args.profile_picker else "",
        quiet=args.quiet,
    )
    return main(lambda: run_bench(opts, Reporter(opts.quiet)), (BenchError, RuntimeError))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m bench.epp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
