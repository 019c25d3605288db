"""``python -m bench gateway``: what the gateway adds in latency and costs in throughput.

A real etcd (holding ``routing/`` of one region), one simulator process with a fast
latency model (prefill and decode rates so high that the simulator answers in
microseconds plus its HTTP handling) and one gateway process in front of it are
started. This process then sends the same request mix (small non-streaming
completions, or with ``--stream`` streaming chat) directly to the simulator and
through the gateway, with one aiohttp client, in alternating blocks (the order
flips every round so that drift hits both sides alike), in two phases:

* **latency**: one request at a time; ``added_latency_ms_p50`` / ``_p99`` are the
  gateway's latency percentiles minus the direct ones (whole response read);
* **throughput**: ``--concurrency`` requests in flight; ``throughput_ratio`` is the
  median over the rounds of the gateway's requests per second over the direct ones
  in the same round (robust to load from outside the bench, which the ratio of the
  totals, also reported, is not).

Requests carry ``x-session-id`` from a pool of ``--sessions`` ids, so the gateway
resolves real sessions (pins created in etcd during the warm-up, then cached).
Load generator, gateway and simulator share this machine's cores (``cores`` in the
output): through the gateway, three processes compete for them instead of two, so
the throughput ratio understates what a gateway on its own cores does, and every
microsecond the load generator spends is taken from the gateway side more than from
the direct one (there the simulator is the bottleneck). So the load generator runs
on uvloop with a lean keep-alive HTTP/1.1 client (the gateway's own upstream client,
``regions/gateway/upstream.py``; ~0.05 ms of CPU per request against aiohttp's ~0.17);
``--client aiohttp`` measures with aiohttp's client instead (both sides alike).

One JSON object per phase and side goes to stdout, then the headline with goals
(p50 added latency <= 1 ms, throughput ratio >= 0.6) and whether each was met.
"""

from __future__ import annotations

import abc
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

import aiohttp
import uvloop

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
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, spawn, start_simulator
from regions.gateway.upstream import UpstreamError, UpstreamPool
from regions.pool.processes import read_ready

REGION = "bench"
CLUSTER = "bench-gateway"
FAST_SIM = (
    "--prefill-tokens-per-s",
    "1e9",
    "--decode-tokens-per-s",
    "1e9",
    "--max-num-seqs",
    "1024",
    "--num-blocks",
    "65536",
)


@dataclass(frozen=True)
class Goals:
    added_latency_ms_p50: float = 1.0
    throughput_ratio: float = 0.6


GOALS = Goals()


@dataclass(frozen=True)
class Options:
    requests: int = 500  # per block and side, latency phase
    throughput_requests: int = 3000  # per block and side: ~1 s, longer than scheduling noise
    blocks: int = 10  # rounds of (direct block, gateway block) per phase
    concurrency: int = 16
    sessions: int = 64
    max_tokens: int = 4
    stream: bool = False
    client: str = "lean"  # the load generator's HTTP client: lean | aiohttp
    quiet: bool = False


@dataclass
class Side:
    """One side's measurements in one phase."""

    latencies: list[float]
    elapsed_s: float = 0.0
    errors: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds used

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed_s if self.elapsed_s else 0.0


def _pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile; NaN if there are no values."""
    p = percentile(values, q)
    return math.nan if p is None else p


# ---- the deployment ---------------------------------------------------------------------


@dataclass(frozen=True)
class Deployed:
    direct: str  # the simulator's URL
    gateway: str  # the gateway's URL
    pids: dict[str, int]  # "simulator", "gateway" -> pid (CPU accounting)


@contextlib.contextmanager
def deployment(tmp: Path) -> Iterator[Deployed]:
    """etcd + simulator + gateway."""
    procs: list[Proc] = []
    with EtcdServer() as etcd:
        try:
            sim = start_simulator(extra_args=FAST_SIM, name="bench-sim")
            procs.append(sim)
            topo: dict[str, object] = {
                "cluster": CLUSTER,
                "etcd": {"endpoints": [etcd.endpoint]},
                "regions": [
                    {
                        "name": REGION,
                        "zone": "z",
                        "agent": "127.0.0.1:9",
                        "capacity_rps": 1000,
                        "replicas": [sim.url],
                    }
                ],
            }
            path = write_topology(tmp / "topology.yaml", topo)
            asyncio.run(write_routing(etcd.endpoint, CLUSTER, REGION))
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
                    "--log-level",
                    "WARNING",
                ],
                "bench-gateway",
                stdout_pipe=True,
            )
            procs.append(gw)
            gw.url = read_ready(gw, time.monotonic() + 30)
            yield Deployed(sim.url, gw.url, {"simulator": sim.pid, "gateway": gw.pid})
        finally:
            kill_all(procs)


# ---- load -------------------------------------------------------------------------------


def request_for(i: int, opts: Options) -> tuple[str, bytes, dict[str, str]]:
    """The i-th request of the mix: path, body, headers (identical on both sides)."""
    topic = i % 32  # a few shared prefixes, as in real traffic
    if opts.stream:
        body: dict[str, object] = {
            "model": "tiny",
            "max_tokens": opts.max_tokens,
            "stream": True,
            "messages": [
                {"role": "system", "content": f"You answer about topic {topic}."},
                {"role": "user", "content": f"question {i}"},
            ],
        }
        path = "/v1/chat/completions"
    else:
        body = {
            "model": "tiny",
            "prompt": f"topic {topic}: question {i}",
            "max_tokens": opts.max_tokens,
        }
        path = "/v1/completions"
    headers = {"content-type": "application/json", "x-session-id": f"bench-{i % opts.sessions}"}
    return path, json.dumps(body).encode(), headers


class Client(abc.ABC):
    """The load generator's HTTP client: POST, read the whole answer, say if it was 200."""

    @abc.abstractmethod
    async def post(self, url: str, path: str, body: bytes, headers: dict[str, str]) -> bool: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


class LeanClient(Client):
    """Keep-alive HTTP/1.1 over the gateway's upstream pool (one connection per request
    in flight, reused)."""

    def __init__(self) -> None:
        self._pool = UpstreamPool(max_idle=4096)

    async def post(self, url: str, path: str, body: bytes, headers: dict[str, str]) -> bool:
        try:
            up = await self._pool.request(url, "POST", path, list(headers.items()), body)
            try:
                await up.read()
            finally:
                up.release()
        except UpstreamError:
            return False
        return up.status == 200

    async def close(self) -> None:
        self._pool.close()


class AiohttpClient(Client):
    def __init__(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def post(self, url: str, path: str, body: bytes, headers: dict[str, str]) -> bool:
        try:
            async with self._session.post(url + path, data=body, headers=headers) as resp:
                await resp.read()
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    async def close(self) -> None:
        await self._session.close()


CLIENTS: dict[str, type[Client]] = {"lean": LeanClient, "aiohttp": AiohttpClient}


async def drive(
    client: Client,
    base: str,
    opts: Options,
    count: int,
    concurrency: int,
    offset: int = 0,
) -> Side:
    """``count`` requests, ``concurrency`` at a time; latency = whole response read."""
    side = Side([])
    next_i = offset

    async def worker() -> None:
        nonlocal next_i
        while next_i < offset + count:
            i = next_i
            next_i += 1
            path, body, headers = request_for(i, opts)
            t0 = time.perf_counter()
            ok = await client.post(base, path, body, headers)
            if ok:
                side.latencies.append(time.perf_counter() - t0)
            else:
                side.errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    side.elapsed_s = time.perf_counter() - t0
    return side


@dataclass
class Phase:
    total: dict[str, Side]
    rounds: list[dict[str, Side]]  # per round, the two sides' blocks run back to back

    def round_ratios(self) -> list[float]:
        """Gateway rps / direct rps of each round: the two blocks of a round ran
        seconds apart, so load from outside the bench hits both alike."""
        return [r["gateway"].rps / r["direct"].rps for r in self.rounds if r["direct"].rps]


def cpu_now(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds used so far by this process (the load generator) and ``pids``."""
    return {"load_generator": cpu_seconds(), **{n: cpu_seconds(p) for n, p in pids.items()}}


async def phase(
    client: Client,
    urls: dict[str, str],
    opts: Options,
    concurrency: int,
    count: int,
    say: Reporter,
    pids: Mapping[str, int],
) -> Phase:
    """Alternating blocks of ``count`` requests; the side that goes first flips every
    round. Each side's CPU time per process is summed over its blocks."""
    result = Phase({name: Side([]) for name in urls}, [])
    order = list(urls)
    for b in range(opts.blocks):
        this_round: dict[str, Side] = {}
        for name in order if b % 2 == 0 else reversed(order):
            before = cpu_now(pids)
            side = await drive(client, urls[name], opts, count, concurrency, offset=b * count)
            after = cpu_now(pids)
            this_round[name] = side
            total = result.total[name]
            total.latencies += side.latencies
            total.elapsed_s += side.elapsed_s
            total.errors += side.errors
            for proc, seconds in after.items():
                total.cpu_s[proc] = total.cpu_s.get(proc, 0.0) + seconds - before[proc]
        result.rounds.append(this_round)
        say.progress(f"  round {b + 1}/{opts.blocks} done")
    return result


async def measure(deployed: Deployed, opts: Options, say: Reporter) -> dict[str, object]:
    urls = {"direct": deployed.direct, "gateway": deployed.gateway}
    pids = deployed.pids
    client = CLIENTS[opts.client]()
    try:
        say.progress("warming up (pins, connections)")
        for url in urls.values():
            await drive(client, url, opts, max(200, opts.sessions * 2), opts.concurrency)
        say.progress("latency phase (one request at a time)")
        lat = await phase(client, urls, opts, 1, opts.requests, say, pids)
        say.progress(f"throughput phase ({opts.concurrency} in flight)")
        thr = await phase(client, urls, opts, opts.concurrency, opts.throughput_requests, say, pids)
    finally:
        await client.close()
    for name in urls:
        say.line({"phase": "latency", "side": name, **_summary(lat.total[name])})
    for name in urls:
        say.line(
            {
                "phase": "throughput",
                "side": name,
                "concurrency": opts.concurrency,
                **_summary(thr.total[name]),
            }
        )
    errors = sum(s.errors for s in (*lat.total.values(), *thr.total.values()))
    if errors:
        raise BenchError(f"{errors} requests failed; the figures would be meaningless")
    return headline(opts, lat, thr)


def _summary(side: Side) -> dict[str, object]:
    return {
        "requests": len(side.latencies),
        "errors": side.errors,
        "p50_ms": _ms(_pct(side.latencies, 50)),
        "p99_ms": _ms(_pct(side.latencies, 99)),
        "rps": round(side.rps, 1),
    }


def _cpu_per_request(side: Side) -> dict[str, float]:
    n = len(side.latencies)
    return {proc: round(s * 1000 / n, 3) if n else 0.0 for proc, s in sorted(side.cpu_s.items())}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def headline(opts: Options, lat: Phase, thr: Phase) -> dict[str, object]:
    direct, gateway = lat.total["direct"].latencies, lat.total["gateway"].latencies
    d50, d99 = _pct(direct, 50), _pct(direct, 99)
    g50, g99 = _pct(gateway, 50), _pct(gateway, 99)
    added50, added99 = (g50 - d50) * 1000, (g99 - d99) * 1000
    ratios = thr.round_ratios()
    ratio = _pct(ratios, 50) if ratios else 0.0
    d_rps, g_rps = thr.total["direct"].rps, thr.total["gateway"].rps
    return {
        "bench": "gateway",
        "cores": os.cpu_count(),
        "mix": "chat, streaming" if opts.stream else "completions, non-streaming",
        "client": opts.client,
        "requests_per_side": {
            "latency": opts.requests * opts.blocks,
            "throughput": opts.throughput_requests * opts.blocks,
        },
        "concurrency": opts.concurrency,
        "added_latency_ms_p50": round(added50, 3),
        "added_latency_ms_p99": round(added99, 3),
        "throughput_ratio": round(ratio, 3),
        "throughput_ratio_of_totals": round(g_rps / d_rps, 3) if d_rps else 0.0,
        "throughput_ratio_rounds": [round(r, 3) for r in ratios],
        "direct_p50_ms": _ms(d50),
        "direct_p99_ms": _ms(d99),
        "gateway_p50_ms": _ms(g50),
        "gateway_p99_ms": _ms(g99),
        "direct_rps": round(d_rps, 1),
        "gateway_rps": round(g_rps, 1),
        # the throughput phase's CPU per request, by side and process: steadier than
        # the rates, which move with how the processes share the cores
        "cpu_ms_per_request": {name: _cpu_per_request(side) for name, side in thr.total.items()},
        **goals_and_met(
            GOALS,
            {"added_latency_ms_p50": added50, "throughput_ratio": ratio},
            at_least={"throughput_ratio"},
        ),
    }


# ---- running ----------------------------------------------------------------------------


def run_bench(opts: Options, say: Reporter) -> dict[str, object]:
    say.progress("starting etcd, a fast simulator and a gateway")
    with (
        tempfile.TemporaryDirectory(prefix="tectonic-bench-gw-") as tmp,
        deployment(Path(tmp)) as deployed,
    ):
        return uvloop.run(measure(deployed, opts, say))


_positive = at_least(1, "_positive")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--requests",
        type=_positive,
        default=500,
        help="requests per block and side in the latency phase (default 500)",
    )
    p.add_argument(
        "--throughput-requests",
        type=_positive,
        default=3000,
        help="requests per block and side in the throughput phase (default 3000: about "
        "a second a block here; much shorter blocks measure scheduling noise)",
    )
    p.add_argument(
        "--blocks",
        type=_positive,
        default=10,
        help="rounds of alternating blocks per phase (default 10)",
    )
    p.add_argument(
        "--concurrency",
        type=_positive,
        default=16,
        help="requests in flight in the throughput phase (default 16)",
    )
    p.add_argument("--sessions", type=_positive, default=64, help="session ids (default 64)")
    p.add_argument("--max-tokens", type=_positive, default=4, help="tokens per answer")
    p.add_argument(
        "--stream", action="store_true", help="streaming chat instead of non-streaming completions"
    )
    p.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        default="lean",
        help="the load generator's HTTP client, on both sides (default lean: the "
        "gateway's upstream client, the least CPU taken from the processes measured)",
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
        stream=args.stream,
        client=args.client,
        quiet=args.quiet,
    )
    return main(
        lambda: run_bench(opts, Reporter(opts.quiet)),
        (BenchError, RuntimeError),
        on_sigterm_too=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
