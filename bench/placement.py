"""``python -m bench placement``: replica choice inside a region, against round robin and
the vLLM production stack's router, on the same simulators with the same prompts.

Two simulator replicas (``--max-num-seqs`` each, prefix caching on) serve through
three front ends, started side by side and loaded one at a time, in ``--rounds``
rounds (each round all three, in an order rotated from round to round, so that none
always runs first on a machine warming up):

* **tectonic**: Tectonic's gateway (a real etcd holding the region's routing), whose
  replica choice is prefix affinity bounded by what each replica bears
  (``regions/dataplane/replicas.py``), learned from the replicas' ``/metrics``;
* **round_robin**: plain round robin, by ``vllm-router --policy round_robin`` (the
  gateway has no mode without its ring, and a proxy written for the bench would add
  its own overhead: this one is the peer's, less its policy);
* **peer**: ``vllm-router`` (PyPI ``vllm-router``, the Rust router of vLLM's production
  stack) with its cache-aware policy (``--policy cache_aware``, its defaults).

Before each front end's run the replicas' prefix caches are emptied, then a short
warm-up (``--warmup-s``) sends one hot prompt, unrelated to the measured ones, at the
same concurrency: time for the gateway to see a replica at its limit in its metrics
(the routers learn nothing from it). The load is vLLM's own benchmark
client, ``vllm bench serve`` from ``.venv-vllm``, on its ``prefix_repetition`` dataset
(``--prefixes`` shared prefixes of ``--prefix-tokens``, each prompt with its own
``--suffix-tokens``; in round k the seed ``--seed`` + k - 1, the same for all three, so
the same prompts in the same order for each front end)
with ``--concurrency`` requests in flight. The defaults: 16 shared prefixes of 1,024
tokens, and a KV cache per replica that holds about 3/4 of them (768 blocks of 16), so
that where a prefix goes matters (round robin needs every prefix on every replica;
with room for all of them everywhere, every choice hits alike after the first
requests); decode at 50 tokens/s per request and 16 output tokens, as on a GPU a
request's decode outlasts a long prefill, and so that the front ends' relay of each
token, which shares the bench machine's cores with the simulators and the client,
does not decide the figures. Figures per front end: first-token p50/p99
and requests per second as the client measured them, the prefix-cache hit rate from
the simulators' counters (hit tokens / queried tokens over the run), and, sampled from
the replicas' gauges every 0.1 s, the most requests one replica held and the share of
samples in which some replica queued. Which prefixes the ring gives each replica
depends on the replicas' URLs (their ports differ per run), so hit rates vary by a
few hundredths from run to run.

One JSON object per front end and round goes to stdout, then the headline: for each
front end the median over the rounds of ``p99_ms_*``, ``p50_ms_*``, ``rps_*``,
``hit_rate_*`` (a round the shared machine disturbed moves no median), the goals
(Tectonic's p99 at most round robin's and the peer's, its hit rate and throughput at
least the peer's) with ``met`` on the medians, and ``met_in_rounds``: in how many
rounds each goal held (a goal met by luck shows as a split count).
Needs etcd, ``vllm-router`` (a dev dependency) and ``.venv-vllm``
(``scripts/setup_vllm_cpu.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import aiohttp

from bench._common import (
    BenchError,
    Reporter,
    at_least,
    main,
    write_routing,
    write_topology,
)
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import start_gateway, start_simulators
from chaos.lab.vllm_cpu import SETUP_HINT, TINY_MODEL_DIR, VLLM_VENV
from controlplane.kernel.vllm.metrics import (
    PREFIX_HITS,
    PREFIX_QUERIES,
    RUNNING,
    WAITING,
    parse_gauges,
)
from regions.pool.processes import ServerProcess, free_port, start_process, wait_healthy

REGION = "bench"
CLUSTER = "bench-placement"
SYSTEMS = ("tectonic", "round_robin", "peer")
VLLM_BENCH = VLLM_VENV / "bin" / "vllm"
_COUNTERS = frozenset({PREFIX_HITS, PREFIX_QUERIES})
_GAUGES = frozenset({RUNNING, WAITING})


@dataclass(frozen=True)
class Options:
    replicas: int = 2
    engine_seqs: int = 8  # each simulator's --max-num-seqs
    concurrency: int = 16
    prompts: int = 1200
    prefixes: int = 16
    prefix_tokens: int = 1024
    suffix_tokens: int = 64
    output_tokens: int = 16
    prefill_rate: float = 20_000.0  # simulator tokens per second
    decode_rate: float = 50.0  # per request: a GPU's, decode outlasts a prefill
    kv_blocks: int = 768  # per simulator, 16 tokens each: 3/4 of the shared prefixes
    warmup_s: float = 5.0
    rounds: int = 3
    seed: int = 0
    quiet: bool = False


_ARGS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("--replicas", at_least(2, "replicas"), "simulator replicas"),
    ("--engine-seqs", at_least(1, "seqs"), "requests a replica runs at once (--max-num-seqs)"),
    ("--concurrency", at_least(1, "concurrency"), "requests in flight (vllm bench serve)"),
    ("--prompts", at_least(1, "prompts"), "prompts in the measured run of each front end"),
    ("--prefixes", at_least(1, "prefixes"), "shared prefixes (prefix_repetition dataset)"),
    ("--prefix-tokens", at_least(1, "tokens"), "tokens of each shared prefix"),
    ("--suffix-tokens", at_least(1, "tokens"), "tokens of each prompt after its prefix"),
    ("--output-tokens", at_least(1, "tokens"), "tokens generated per request"),
    ("--prefill-rate", float, "simulator prefill tokens per second"),
    ("--decode-rate", float, "simulator decode tokens per second"),
    ("--kv-blocks", at_least(1, "blocks"), "KV-cache blocks per simulator (16 tokens)"),
    ("--warmup-s", float, "seconds of one hot prompt before each measured run"),
    ("--rounds", at_least(1, "rounds"), "rounds of all three front ends (median of each)"),
    ("--seed", int, "dataset seed of round 1, +1 each round (the same for every front end)"),
)


# ---- the front ends -------------------------------------------------------------------


@dataclass
class Deployed:
    replicas: list[str]
    front: dict[str, str] = field(default_factory=dict)  # system -> base URL


@contextlib.contextmanager
def deployment(o: Options, tmp: Path) -> Iterator[Deployed]:
    """etcd, the simulators, Tectonic's gateway and vllm-router, all on this machine."""
    procs: list[ServerProcess] = []
    sim_args = [
        "--max-num-seqs",
        str(o.engine_seqs),
        "--prefill-tokens-per-s",
        str(o.prefill_rate),
        "--decode-tokens-per-s",
        str(o.decode_rate),
        "--num-gpu-blocks-override",
        str(o.kv_blocks),
        "--max-model-len",
        str(max(4096, o.prefix_tokens + o.suffix_tokens + o.output_tokens + 64)),
        "--log-level",
        "WARNING",
    ]
    with EtcdServer() as etcd:
        try:
            sims = start_simulators(o.replicas, extra_args=sim_args, timeout=60)
            procs += sims
            deployed = Deployed([p.url for p in sims])
            deployed.front["tectonic"] = _gateway(etcd.endpoint, deployed.replicas, tmp, procs)
            deployed.front["round_robin"] = _router(deployed.replicas, "round_robin", procs)
            deployed.front["peer"] = _router(deployed.replicas, "cache_aware", procs)
            yield deployed
        finally:
            for p in procs:  # kill_all's, for the router too (no Proc of the lab)
                with contextlib.suppress(Exception):
                    p.kill()


def _gateway(etcd: str, replicas: list[str], tmp: Path, procs: list[ServerProcess]) -> str:
    topo: dict[str, object] = {
        "cluster": CLUSTER,
        "etcd": {"endpoints": [etcd]},
        "regions": [
            {
                "name": REGION,
                "zone": "z",
                "agent": "127.0.0.1:9",  # no agent runs: nothing reads it
                "capacity_rps": 1000,
                "replicas": replicas,
            }
        ],
    }
    path = write_topology(tmp / "topology.yaml", topo)
    asyncio.run(write_routing(etcd, CLUSTER, REGION))
    gw = start_gateway(path, REGION, extra_args=["--log-level", "WARNING"])
    procs.append(gw)
    return gw.url


def router_binary() -> str | None:
    """The ``vllm-router`` next to this interpreter (the dev venv), else on PATH."""
    here = Path(sys.executable).parent / "vllm-router"
    return str(here) if here.exists() else shutil.which("vllm-router")


def _router(replicas: list[str], policy: str, procs: list[ServerProcess]) -> str:
    binary = router_binary()
    if binary is None:
        raise BenchError("vllm-router is not installed: pip install vllm-router==0.1.17")
    port = free_port()
    argv = [
        binary,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *replicas,
        "--policy",
        policy,
        "--prometheus-port",
        str(free_port()),
        "--log-level",
        "warning",
    ]
    proc = start_process(argv, f"bench-placement-router-{policy}")
    procs.append(proc)
    proc.url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, 60.0, "vllm-router")
    return proc.url


# ---- the replicas' own figures --------------------------------------------------------


async def _scrape(http: aiohttp.ClientSession, url: str, names: frozenset[str]) -> dict[str, float]:
    async with http.get(url + "/metrics") as r:
        return parse_gauges(await r.text(), names)


async def reset_caches(http: aiohttp.ClientSession, replicas: Sequence[str]) -> None:
    """Wait until no replica runs or queues anything, then empty their prefix caches."""
    deadline = time.monotonic() + 60
    pending = list(replicas)
    while pending:
        if time.monotonic() > deadline:
            raise BenchError(f"replicas still busy after 60 s: {pending}")
        for url in list(pending):
            busy = await _scrape(http, url, _GAUGES)
            if not sum(busy.values()):
                async with http.post(url + "/reset_prefix_cache") as r:
                    if r.status == 200 and (await r.json()).get("success"):
                        pending.remove(url)
        if pending:
            await asyncio.sleep(0.05)


async def counters(http: aiohttp.ClientSession, replicas: Sequence[str]) -> tuple[float, float]:
    """Prefix-cache (hit tokens, queried tokens), summed over the replicas."""
    hits = queries = 0.0
    for url in replicas:
        c = await _scrape(http, url, _COUNTERS)
        hits += c.get(PREFIX_HITS, 0.0)
        queries += c.get(PREFIX_QUERIES, 0.0)
    return hits, queries


@dataclass
class Occupancy:
    """What the replicas held, sampled while a run goes on."""

    samples: int = 0
    queued_samples: int = 0  # some replica had requests waiting
    max_held: int = 0  # running + waiting on one replica

    def queued_share(self) -> float:
        return self.queued_samples / self.samples if self.samples else 0.0


async def sample(
    http: aiohttp.ClientSession, replicas: Sequence[str], into: Occupancy, every_s: float = 0.1
) -> None:
    """Until cancelled: every ``every_s``, each replica's running and waiting."""
    while True:
        gauges = await asyncio.gather(*(_scrape(http, u, _GAUGES) for u in replicas))
        into.samples += 1
        into.queued_samples += any(g.get(WAITING, 0) > 0 for g in gauges)
        held = max(int(g.get(RUNNING, 0) + g.get(WAITING, 0)) for g in gauges)
        into.max_held = max(into.max_held, held)
        await asyncio.sleep(every_s)


# ---- the load -------------------------------------------------------------------------


async def warm_up(http: aiohttp.ClientSession, url: str, o: Options) -> None:
    """``o.concurrency`` streams of one hot prompt for ``o.warmup_s``: a replica at its
    limit for the gateway to see (the prompt shares nothing with the measured ones)."""
    rng = random.Random(o.seed + 1)
    words = " ".join(rng.choice(("warm", "up", "hot", "prompt", "only")) for _ in range(400))
    body = {"model": "tiny", "prompt": "warm-up: " + words, "max_tokens": o.output_tokens}
    end = time.monotonic() + o.warmup_s

    async def stream() -> None:
        while time.monotonic() < end:
            async with http.post(url + "/v1/completions", json={**body, "stream": True}) as r:
                if r.status != 200:
                    raise BenchError(f"{url}: warm-up got HTTP {r.status}")
                async for _ in r.content:
                    pass

    await asyncio.gather(*(stream() for _ in range(o.concurrency)))


def vllm_bench_argv(url: str, o: Options, result_dir: Path, name: str) -> list[str]:
    """``vllm bench serve`` on the prefix_repetition dataset against ``url``."""
    return [
        str(VLLM_BENCH),
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        "tiny",
        "--tokenizer",
        str(TINY_MODEL_DIR),
        "--dataset-name",
        "prefix_repetition",
        "--prefix-repetition-num-prefixes",
        str(o.prefixes),
        "--prefix-repetition-prefix-len",
        str(o.prefix_tokens),
        "--prefix-repetition-suffix-len",
        str(o.suffix_tokens),
        "--prefix-repetition-output-len",
        str(o.output_tokens),
        "--num-prompts",
        str(o.prompts),
        "--max-concurrency",
        str(o.concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--seed",
        str(o.seed),
        "--percentile-metrics",
        "ttft,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        f"{name}.json",
    ]


async def vllm_bench(url: str, o: Options, result_dir: Path, name: str) -> dict[str, object]:
    """Run the load against ``url``; vLLM's result JSON."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    proc = await asyncio.create_subprocess_exec(
        *vllm_bench_argv(url, o, result_dir, name),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    try:
        out, _ = await proc.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    path = result_dir / f"{name}.json"
    if proc.returncode != 0 or not path.exists():
        tail = out.decode(errors="replace")[-3000:]
        raise BenchError(f"vllm bench serve against {url} failed ({proc.returncode}):\n{tail}")
    result: dict[str, object] = json.loads(path.read_text())
    return result


@dataclass(frozen=True)
class Figures:
    system: str
    round: int
    p50_ttft_ms: float
    p99_ttft_ms: float
    rps: float
    hit_rate: float
    completed: int
    failed: int
    max_held_one_replica: int
    queued_share: float


async def measure(
    http: aiohttp.ClientSession,
    system: str,
    url: str,
    d: Deployed,
    o: Options,
    tmp: Path,
    round_: int = 0,
) -> Figures:
    """One front end in round ``round_`` (its prompts: seed + round): empty caches,
    warm-up, then the measured run."""
    await reset_caches(http, d.replicas)
    if o.warmup_s > 0:
        await warm_up(http, url, o)
    hits0, queries0 = await counters(http, d.replicas)
    occupancy = Occupancy()
    sampler = asyncio.create_task(sample(http, d.replicas, occupancy))
    try:
        result = await vllm_bench(url, replace(o, seed=o.seed + round_), tmp, system)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await sampler
    hits1, queries1 = await counters(http, d.replicas)
    completed = int(result["completed"])  # type: ignore[call-overload]
    if completed == 0:
        raise BenchError(f"{system}: no request completed")
    queried = queries1 - queries0
    return Figures(
        system=system,
        round=round_ + 1,
        p50_ttft_ms=round(float(result["p50_ttft_ms"]), 2),  # type: ignore[arg-type]
        p99_ttft_ms=round(float(result["p99_ttft_ms"]), 2),  # type: ignore[arg-type]
        rps=round(float(result["request_throughput"]), 2),  # type: ignore[arg-type]
        hit_rate=round((hits1 - hits0) / queried, 4) if queried else 0.0,
        completed=completed,
        failed=int(result.get("failed", 0)),  # type: ignore[call-overload]
        max_held_one_replica=occupancy.max_held,
        queued_share=round(occupancy.queued_share(), 3),
    )


# ---- the run --------------------------------------------------------------------------


def median_figures(rounds: Sequence[Figures]) -> Figures:
    """One front end's rounds in one: each figure the median of its rounds (a round
    disturbed by the machine moves no figure), counts summed, extremes kept."""
    if not rounds:
        raise ValueError("no rounds")

    def mid(name: str) -> float:
        return round(float(statistics.median(getattr(f, name) for f in rounds)), 4)

    return Figures(
        system=rounds[0].system,
        round=0,
        p50_ttft_ms=mid("p50_ttft_ms"),
        p99_ttft_ms=mid("p99_ttft_ms"),
        rps=mid("rps"),
        hit_rate=mid("hit_rate"),
        completed=sum(f.completed for f in rounds),
        failed=sum(f.failed for f in rounds),
        max_held_one_replica=max(f.max_held_one_replica for f in rounds),
        queued_share=mid("queued_share"),
    )


def round_orders(rounds: int) -> list[tuple[str, ...]]:
    """The front ends' order in each round: rotated, so none always goes first (on a
    machine warming up) or last."""
    return [SYSTEMS[i % 3 :] + SYSTEMS[: i % 3] for i in range(rounds)]


def headline(
    figures: dict[str, Figures],
    o: Options,
    elapsed_s: float,
    per_round: dict[str, list[Figures]] | None = None,
) -> dict[str, object]:
    """The headline of ``figures`` (per front end, the medians of its rounds)."""
    t, rr, peer = figures["tectonic"], figures["round_robin"], figures["peer"]
    out: dict[str, object] = {"bench": "placement"}
    for f in (t, rr, peer):
        out[f"p99_ms_{f.system}"] = f.p99_ttft_ms
        out[f"p50_ms_{f.system}"] = f.p50_ttft_ms
        out[f"rps_{f.system}"] = f.rps
        out[f"hit_rate_{f.system}"] = f.hit_rate
        out[f"failed_{f.system}"] = f.failed
    out["goals"] = {
        "p99_ms_tectonic": "<= p99_ms_round_robin and <= p99_ms_peer",
        "hit_rate_tectonic": ">= hit_rate_peer",
        "rps_tectonic": ">= rps_peer",
    }
    out["met"] = {
        "p99_ms_tectonic": t.p99_ttft_ms <= min(rr.p99_ttft_ms, peer.p99_ttft_ms),
        "hit_rate_tectonic": t.hit_rate >= peer.hit_rate,
        "rps_tectonic": t.rps >= peer.rps,
    }
    if per_round:  # how often each goal held round by round: luck shows here
        rounds = list(
            zip(per_round["tectonic"], per_round["round_robin"], per_round["peer"], strict=True)
        )
        out["met_in_rounds"] = {
            "p99_ms_tectonic": sum(
                a.p99_ttft_ms <= min(b.p99_ttft_ms, c.p99_ttft_ms) for a, b, c in rounds
            ),
            "hit_rate_tectonic": sum(a.hit_rate >= c.hit_rate for a, _, c in rounds),
            "rps_tectonic": sum(a.rps >= c.rps for a, _, c in rounds),
        }
    out["settings"] = {k: v for k, v in asdict(o).items() if k != "quiet"}
    out["elapsed_s"] = round(elapsed_s, 1)
    return out


async def _all_systems(
    d: Deployed, o: Options, tmp: Path, rep: Reporter
) -> dict[str, list[Figures]]:
    """Every round, the three front ends in that round's order."""
    figures: dict[str, list[Figures]] = {s: [] for s in SYSTEMS}
    async with aiohttp.ClientSession() as http:
        for i, order in enumerate(round_orders(o.rounds)):
            for system in order:
                url = d.front[system]
                rep.progress(f"placement: round {i + 1}/{o.rounds}, {system} ({url})")
                f = await measure(http, system, url, d, o, tmp, i)
                figures[system].append(f)
                rep.line(asdict(f))
    return figures


def run_bench(o: Options, rep: Reporter) -> dict[str, object]:
    if not VLLM_BENCH.exists():
        raise BenchError(f"no vllm bench client at {VLLM_BENCH}: {SETUP_HINT}")
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="bench-placement-") as tmp,
        deployment(o, Path(tmp)) as d,
    ):
        per_round = asyncio.run(_all_systems(d, o, Path(tmp), rep))
    figures = {s: median_figures(f) for s, f in per_round.items()}
    return headline(figures, o, time.monotonic() - t0, per_round)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Options()
    for flag, kind, text in _ARGS:
        default = getattr(d, flag[2:].replace("-", "_"))
        shown = f"{default:,g}" if isinstance(default, float) else f"{default:,}"
        p.add_argument(flag, type=kind, default=default, help=f"{text} (default {shown})")
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def run(args: argparse.Namespace) -> int:
    o = Options(**{f.name: getattr(args, f.name) for f in fields(Options)})
    return main(
        lambda: run_bench(o, Reporter(o.quiet)),
        (BenchError, RuntimeError, aiohttp.ClientError, OSError),
    )
