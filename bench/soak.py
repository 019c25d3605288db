"""``python -m bench soak``: the gateways under sustained streaming load for minutes,
with a region blackout in the middle.

A local lab (chaos/lab/deployment.py: etcd, three regions of two simulators each with
their agents and gateways, two control-plane processes) serves ``--sessions`` chat
sessions, each streaming one completion after another through its home region's
gateway (``x-session-id``). Halfway through, every simulator of us-east is SIGKILLed;
``--down-s`` later they come back and the region recovers in steps.

Figures (one JSON line at the end):

* ``requests``: completions attempted; ``lost``: those that failed before their first
  byte reached the client (the gateway should have retried them elsewhere), ``cut``:
  those that failed mid-stream as the client saw them (the gateway should have
  continued them elsewhere); ``continued``: the gateways' count of streams whose
  replica failed mid-way and that they continued on another replica or region
  (``tectonic_gateway_stream_continuations_total{outcome="continued"}``);
* ``retries``: the gateways' own count of attempts retried on another replica;
* ``consistency_violations``: requests served outside the session's region (a session
  may move once, only because its home failed over; chaos/drills/measure.py), plus the
  gateways' own violation counter;
* ``rss_growth_ratio``: the gateways' resident memory at the end ÷ after warm-up (the
  largest of the three), and ``cp_rss_growth_ratio`` for the control planes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench._common import BenchError, Reporter, goals_and_met, main
from chaos.drills.measure import SessionLog, consistency_violations
from chaos.drills.traffic import MODEL, REGION_HEADER, SESSION_HEADER, system_prompt
from chaos.lab.deployment import LocalDeployment
from chaos.lab.run import running_lab
from chaos.lab.spec import DeploymentSpec

VICTIM = "us-east"
CONTINUATIONS = "tectonic_gateway_stream_continuations_total"


@dataclass(frozen=True)
class Goals:
    lost: int = 0
    cut: int = 0
    consistency_violations: int = 0
    rss_growth_ratio: float = 1.5


@dataclass
class Tally:
    requests: int = 0
    ok: int = 0
    lost: int = 0
    cut: int = 0
    logs: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    homes: dict[str, str] = field(default_factory=dict)
    lost_reasons: dict[str, int] = field(default_factory=lambda: defaultdict(int))


async def one(
    http: aiohttp.ClientSession, url: str, sid: str, system: str, n: int, tally: Tally
) -> None:
    """One streamed chat turn; counted as ok, lost (nothing reached us) or cut."""
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 8,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"turn {n} of {sid}"},
        ],
    }
    tally.requests += 1
    got_bytes = False
    try:
        async with http.post(
            url + "/v1/chat/completions", json=body, headers={SESSION_HEADER: sid}
        ) as r:
            region = r.headers.get(REGION_HEADER, "")
            if r.status != 200:
                tally.lost += 1
                tally.lost_reasons[f"HTTP {r.status}"] += 1
                tally.logs[sid].append((time.monotonic(), ""))
                return
            done = False
            async for raw in r.content:
                got_bytes = True
                if raw.strip() == b"data: [DONE]":
                    done = True
            if not done:
                raise aiohttp.ClientPayloadError("stream ended without [DONE]")
    except (aiohttp.ClientError, TimeoutError) as e:
        if got_bytes:
            tally.cut += 1
        else:
            tally.lost += 1
            tally.lost_reasons[type(e).__name__] += 1
        tally.logs[sid].append((time.monotonic(), ""))
        return
    tally.ok += 1
    tally.logs[sid].append((time.monotonic(), region))


async def session_loop(
    http: aiohttp.ClientSession,
    url: str,
    sid: str,
    system: str,
    interval_s: float,
    until: float,
    tally: Tally,
    rng: random.Random,
) -> None:
    await asyncio.sleep(rng.uniform(0, interval_s))
    n = 0
    while time.monotonic() < until:
        n += 1
        await one(http, url, sid, system, n, tally)
        await asyncio.sleep(interval_s * rng.uniform(0.8, 1.2))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchError(f"no VmRSS for pid {pid}")


async def gateway_counter(
    http: aiohttp.ClientSession, urls: list[str], name: str, having: str = ""
) -> float:
    """``name`` summed over every gateway and label set (those whose line holds
    ``having``, e.g. ``outcome="continued"``)."""
    total = 0.0
    for url in urls:
        async with http.get(url + "/metrics") as r:
            for line in (await r.text()).splitlines():
                if line.startswith(name) and having in line:
                    total += float(line.rsplit(" ", 1)[1])
    return total


async def drive(dep: LocalDeployment, args: argparse.Namespace, out: Reporter) -> dict[str, object]:
    duration = args.minutes * 60
    warmup = max(5.0, duration * 0.1)
    rng = random.Random(args.seed)
    tally = Tally()
    start = time.monotonic()
    until = start + duration
    regions = list(dep.spec.regions)
    gw_pids = {r: g.pid for r, g in dep.gateways.items()}
    cp_pids = {rid: p.pid for rid, p in dep.cps.items() if p is not None}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=10)
    ) as http:
        tasks = []
        for i in range(args.sessions):
            home = regions[i % len(regions)]
            sid = f"soak-{i:04d}-{home}"
            tally.homes[sid] = home
            system = system_prompt(i // 5)
            url = dep.gateway_urls[home]
            loop = session_loop(http, url, sid, system, args.interval, until, tally, rng)
            tasks.append(asyncio.create_task(loop))
        await asyncio.sleep(warmup)
        rss0 = {r: rss_kib(p) for r, p in gw_pids.items()}
        cp0 = {r: rss_kib(p) for r, p in cp_pids.items()}
        out.progress(f"warmed up ({warmup:.0f} s): gateways' RSS {sorted(rss0.values())} KiB")
        await asyncio.sleep(max(0.0, start + duration / 2 - time.monotonic()))
        out.progress(f"t+{time.monotonic() - start:.0f}s: SIGKILL every vLLM server of {VICTIM}")
        fault_at = time.monotonic() - start
        await asyncio.to_thread(dep.stop_servers, VICTIM)
        await asyncio.sleep(args.down_s)
        await asyncio.to_thread(dep.start_servers, VICTIM)
        out.progress(f"t+{time.monotonic() - start:.0f}s: {VICTIM}'s servers are back")
        while time.monotonic() < until:
            await asyncio.sleep(min(10.0, until - time.monotonic()))
            out.progress(
                f"t+{time.monotonic() - start:.0f}s: {tally.requests} requests, "
                f"{tally.lost} lost, {tally.cut} cut"
            )
        await asyncio.gather(*tasks)
        rss1 = {r: rss_kib(p) for r, p in gw_pids.items()}
        cp1 = {r: rss_kib(p) for r, p in cp_pids.items() if dep.cps[r] is not None}
        urls = list(dep.gateway_urls.values())
        retries = await gateway_counter(http, urls, "tectonic_gateway_retries_total")
        gw_violations = await gateway_counter(
            http, urls, "tectonic_gateway_consistency_violations_total"
        )
        continued = await gateway_counter(http, urls, CONTINUATIONS, having='outcome="continued"')
    logs = [SessionLog(sid, tally.homes[sid], tuple(log)) for sid, log in tally.logs.items()]
    violations = consistency_violations(logs, {VICTIM}) + int(gw_violations)
    growth = max(rss1[r] / rss0[r] for r in rss0)
    cp_growth = max((cp1[r] / cp0[r] for r in cp1 if r in cp0), default=1.0)
    figures = {
        "lost": tally.lost,
        "cut": tally.cut,
        "consistency_violations": violations,
        "rss_growth_ratio": growth,
    }
    return {
        "bench": "soak",
        "minutes": args.minutes,
        "sessions": args.sessions,
        "requests": tally.requests,
        "ok": tally.ok,
        "lost": tally.lost,
        "lost_reasons": dict(tally.lost_reasons),
        "cut": tally.cut,
        "continued": int(continued),
        "retries": int(retries),
        "consistency_violations": violations,
        "rss_growth_ratio": round(growth, 4),
        "rss_kib_start": rss0,
        "rss_kib_end": rss1,
        "cp_rss_growth_ratio": round(cp_growth, 4),
        "failover_at_s": round(fault_at, 1),
        "down_s": args.down_s,
        "requests_per_s": round(tally.requests / duration, 1),
        **goals_and_met(Goals(), figures),
    }


async def measure(args: argparse.Namespace, out: Reporter) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-bench-soak-"))
    t0 = time.monotonic()
    async with running_lab(DeploymentSpec(), workdir, say=out.progress) as dep:
        head = await drive(dep, args, out)
    head["runtime_s"] = round(time.monotonic() - t0, 1)
    return head


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    p.add_argument("--sessions", type=int, default=60, help="chat sessions (default 60)")
    p.add_argument("--interval", type=float, default=0.5, help="s between a session's turns")
    p.add_argument("--down-s", type=float, default=20.0, help="how long us-east stays down")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    if args.minutes * 60 < 2 * args.down_s + 20:
        print(json.dumps({"error": "--minutes too short for --down-s"}))
        return 2
    out = Reporter(args.quiet)
    return main(lambda: asyncio.run(measure(args, out)), (BenchError, TimeoutError))
