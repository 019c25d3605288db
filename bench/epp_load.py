"""``python -m bench epp``'s load: the request mix, sent to one path ``concurrency`` at a
time, and the phases (a block per path per round, the order flipped each round) with the
CPU each process used meanwhile (from ``/proc``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench._common import Reporter, cpu_seconds
from bench.epp_deploy import Deployed
from regions.gateway.upstream import UpstreamError, UpstreamPool


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
