"""``python -m bench recovery``: first-token latency while a region takes its traffic back.

After a failover, home region ``us-east`` comes back with cold prefix caches and empty
queues. A real etcd, ``--replicas`` simulators per region (home ``us-east``, target
``us-west``), one gateway process for home and home's region agent run; the bench writes
``routing/us-east`` as the leader would (``routing_recovery_step``) and the gateway's
sessions follow it. Before the graduated recovery's first step the bench pre-warms home
as the leader does (``AgentPrewarmer.prewarm_home``: home's catalog, merged from the
gateway's exports, replayed by home's agent); ``--prewarm none`` leaves it out. The
gateway warms home by itself too (``regions/gateway/warmth.py``: warm-first placement
of new sessions and the recall of the prompts home answered before). The load: Poisson
session arrivals, each session a few streaming completions sharing its tenant's long
system prompt; client-side TTFT, serving region and cache hit kept
per request. Each round: home warm, **steady** window; then twice **failover** (all to
the target, home drained and ``/reset_prefix_cache``) and a **recovery** window,
graduated (``--step-percent`` every ``--step-interval`` s) or all at once, in
alternating order. Ratios: window p99 ÷ the round's steady p99; headline = medians
over rounds. Figures and sizing: bench/README.md (latest) and bench/results/recovery.md.

The workload is in bench/recovery_load.py, the figures in bench/recovery_figures.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import aiohttp

from bench._common import BenchError, Reporter, at_least, kill_all, main, write_topology
from bench.recovery_figures import _ratio, headline, rho, slices, window
from bench.recovery_load import HOME, TARGET, Load, Options, system_prompt, touch
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, spawn, start_simulators
from controlplane.agent_prewarm import AgentPrewarmer
from controlplane.core.failover import routing_recovery_step
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.config import Topology, parse_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.prefix.catalog import PrefixCatalog
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from controlplane.kernel.vllm.metrics import parse_gauges
from controlplane.prefix_aggregator import PrefixAggregator
from regions.pool.processes import free_port, read_ready

CLUSTER = "bench-recovery"
_BUSY = frozenset({"vllm:num_requests_running", "vllm:num_requests_waiting"})


# ---- the deployment ---------------------------------------------------------------------


@dataclass(frozen=True)
class Deployed:
    topology: Topology
    gateway: str  # URL
    home: list[str]  # replica URLs
    target: list[str]


@contextlib.contextmanager
def deployment(o: Options, tmp: Path) -> Iterator[Deployed]:
    """etcd, the simulators, a gateway and home's region agent."""
    sim_args = [
        "--prefill-tokens-per-s",
        str(o.prefill_rate),
        "--decode-tokens-per-s",
        str(o.decode_rate),
        "--max-num-seqs",
        str(o.engine_seqs),
        "--num-gpu-blocks-override",
        str(o.kv_blocks),
        "--enable-prompt-tokens-details",
        "--max-model-len",
        str(max(4096, o.prompt_tokens + 512)),
        "--log-level",
        "WARNING",
    ]
    procs: list[Proc] = []
    with EtcdServer() as etcd:
        try:
            sims = start_simulators(2 * o.replicas, extra_args=sim_args, timeout=60)
            procs += sims
            home = [p.url for p in sims[: o.replicas]]
            target = [p.url for p in sims[o.replicas :]]
            agent_at = f"127.0.0.1:{free_port()}"
            # Home's agent: probes home's replicas and replays the recovery pre-warm. It
            # reports to no control plane (the bench is the leader).
            agent = spawn(
                [
                    "-m",
                    "regions.agent",
                    "--region",
                    HOME,
                    "--listen",
                    agent_at,
                    "--control-plane",
                    "127.0.0.1:9",
                    "--interval",
                    "1",
                    "--timeout",
                    "0.5",
                    "--prefill-tokens-per-s",
                    str(o.prefill_rate),
                    "--log-level",
                    "ERROR",
                    *(a for u in home for a in ("--replica", u)),
                ],
                "bench-recovery-agent",
                stdout_pipe=True,
            )
            procs.append(agent)
            regions = [
                {
                    "name": name,
                    "zone": "z",
                    "agent": agent_at,
                    "capacity_rps": 1000,
                    "replicas": urls,
                }
                for name, urls in ((HOME, home), (TARGET, target))
            ]
            topo: dict[str, object] = {
                "cluster": CLUSTER,
                "etcd": {"endpoints": [etcd.endpoint]},
                "regions": regions,
                # the gateway's prefix counts reach etcd every 2 s (10 s in production)
                "prefixes": {"export_interval_s": 2},
            }
            path = write_topology(tmp / "topology.yaml", topo)
            read_ready(agent, time.monotonic() + 30)
            asyncio.run(_initial_routing(etcd.endpoint))
            gw = spawn(
                [
                    "-m",
                    "regions.gateway",
                    "--topology",
                    str(path),
                    "--region",
                    HOME,
                    "--listen",
                    "127.0.0.1:0",
                    "--log-level",
                    "WARNING",
                    *(() if o.warm_first else ("--no-warm-first",)),
                ],
                "bench-recovery-gateway",
                stdout_pipe=True,
            )
            procs.append(gw)
            gw.url = read_ready(gw, time.monotonic() + 30)
            yield Deployed(parse_topology(topo), gw.url, home, target)
        finally:
            kill_all(procs)


async def _initial_routing(endpoint: str) -> None:
    async with EtcdStore(EtcdConfig(endpoints=(endpoint,))) as store:
        keys = Keys(CLUSTER)
        await store.put(keys.routing(HOME), encode(Routing(targets={HOME: 1.0})))
        await store.put(keys.routing(TARGET), encode(Routing(targets={TARGET: 1.0})))


async def _busy(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as r:
        return sum(parse_gauges(await r.text(), _BUSY).values())


async def drain_and_reset(http: aiohttp.ClientSession, urls: Sequence[str]) -> float:
    """Wait until no request runs or waits on ``urls``, then drop their prefix caches
    (as a restarted replica has none); seconds it took."""
    t0 = time.monotonic()
    pending = list(urls)
    while pending:
        if time.monotonic() - t0 > 60:
            raise BenchError(f"home replicas still busy 60 s after the failover: {pending}")
        for u in list(pending):
            if not await _busy(http, u):
                async with http.post(u + "/reset_prefix_cache") as r:
                    if r.status == 200 and (await r.json()).get("success"):
                        pending.remove(u)
        if pending:
            await asyncio.sleep(0.05)
    return time.monotonic() - t0


# ---- phases -----------------------------------------------------------------------------


@dataclass
class Router:
    """Writes ``routing/us-east`` as the leader would: one put per change, epoch + 1."""

    store: EtcdStore
    current: Routing = field(default_factory=lambda: Routing(targets={HOME: 1.0}))

    async def write(self, routing: Routing) -> None:
        self.current = routing
        await self.store.put(Keys(CLUSTER).routing(HOME), encode(routing))

    async def failover(self) -> None:
        await self.write(Routing(targets={TARGET: 1.0}, epoch=self.current.epoch + 1))

    async def recover(self, fraction: float) -> None:
        await self.write(routing_recovery_step(self.current, HOME, fraction))


async def recovery(router: Router, o: Options, graduated: bool) -> tuple[float, float]:
    """One recovery from all-at-target; the window (start, end) on the monotonic clock."""
    t0 = time.monotonic()
    if graduated:
        for i in range(1, o.steps + 1):
            await asyncio.sleep(max(0.0, t0 + (i - 1) * o.step_interval - time.monotonic()))
            await router.recover(min(1.0, i * o.step_percent / 100))
    else:
        await router.recover(1.0)
    end = t0 + o.window_s
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    return t0, end


_PREWARM_FIGURES = frozenset(
    {
        "prefixes_total",
        "prefixes_warmed",
        "prefixes_failed",
        "attained_fraction",
        "verified_hit_rate",
        "targets_unreachable",
    }
)


@dataclass
class HomeWarmer:
    """The leader's part of the recovery pre-warm. At the failover it merges the
    gateway's prefix exports into home's catalog (``PrefixAggregator.run_once``, as the
    leader does every ``prefixes.aggregate_interval_s``); before the first recovery step
    it replays that catalog on home through home's agent (``AgentPrewarmer.prewarm_home``,
    what the orchestrator runs; budget and share from the topology's defaults)."""

    store: EtcdStore
    topology: Topology
    runs: int = 0

    def __post_init__(self) -> None:
        keys, clock, t = Keys(CLUSTER), SystemClock(), self.topology
        self.aggregator = PrefixAggregator(
            self.store, keys, t.prefixes, clock, lambda: [], regions=t.names
        )
        self.prewarmer = AgentPrewarmer(
            t,
            self.store,
            keys,
            clock,
            min_sessions=t.prefixes.min_sessions,
            verify=t.prewarm.verify,
        )

    async def merge(self) -> None:
        await self.aggregator.run_once()

    async def warm(self) -> tuple[dict[str, object], frozenset[int]]:
        """Pre-warm home; its figures and the tenants whose prompts its catalog holds."""
        self.runs += 1
        t, t0 = self.topology, time.monotonic()
        figs = await self.prewarmer.prewarm_home(
            HOME, t.prewarm.budget_s, f"bench-{self.runs}", t.recovery.prewarm_top_fraction
        )
        seconds = time.monotonic() - t0
        kv = await self.store.get(Keys(CLUSTER).prefixes(HOME))
        entries = () if kv is None else decode(PrefixCatalog, kv.value, kv.key).entries
        prompts = [e.payload.prompt for e in entries if e.payload and e.payload.prompt]
        tenants = frozenset(int(p[:5]) for p in prompts if p[:5].isdigit())
        out: dict[str, object] = {
            "seconds": round(seconds, 2),
            "catalog_entries": len(entries),
            "catalog_payloads": len(prompts),
            "tenants": len(tenants),
            **{k: round(v, 3) for k, v in sorted(figs.flat().items()) if k in _PREWARM_FIGURES},
        }
        return out, tenants


def arms(o: Options, r: int) -> list[str]:
    """The recoveries of round ``r``, in the order they run (rotating over rounds)."""
    names = ["graduated", "all_at_once", *(["graduated_cold"] if o.cold_arm else [])]
    k = r % len(names)
    return names[k:] + names[:k]


async def measure(d: Deployed, o: Options, say: Reporter) -> dict[str, object]:
    prompts = [system_prompt(i, max(1, o.prompt_tokens - 8), o.seed) for i in range(o.tenants)]
    rng = random.Random(o.seed)
    rounds: list[dict[str, object]] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    home, target = d.home, d.target
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as http,
        EtcdStore(d.topology.etcd) as store,
    ):
        router = Router(store)
        warmer = HomeWarmer(store, d.topology)
        say.progress(f"warming {len(prompts)} tenant prompts on every replica of both regions")
        await touch(http, [*home, *target], prompts, o)
        # ... and once through the gateway (sessionless: no tenant gains a session toward
        # the catalog's K), which a long steady state leaves having answered every tenant
        # at home: what its prompt memory recalls into home when home serves again.
        await touch(http, [d.gateway], prompts, o)
        load = Load(http, d.gateway, prompts, o, rng)
        stop = asyncio.Event()
        loader = asyncio.create_task(load.run(stop))
        spans: list[dict[str, tuple[float, float]]] = []
        warmups: list[tuple[dict[str, object], frozenset[int]]] = []
        failed_over: list[dict[str, float]] = []  # per round: arm -> when its failover began
        try:
            for r in range(o.rounds):
                if r:
                    say.progress(f"round {r + 1}: re-warming home")
                    await touch(http, home, prompts, o)
                await asyncio.sleep(1.0)  # the touch's queue drains
                t = time.monotonic()
                say.progress(f"round {r + 1}/{o.rounds}: steady state, {o.steady_s:g} s")
                await asyncio.sleep(o.steady_s)
                span = {"steady": (t, time.monotonic())}
                warmed: tuple[dict[str, object], frozenset[int]] = ({}, frozenset())
                failed_over.append({})
                for name in arms(o, r):
                    failed_over[-1][name] = time.monotonic()
                    await router.failover()
                    await warmer.merge()  # home's catalog as the failover finds it
                    drained = await drain_and_reset(http, home)
                    say.progress(
                        f"  failover: home drained and reset in {drained:.2f} s; "
                        f"{o.failover_s:g} s at the target"
                    )
                    await asyncio.sleep(o.failover_s)
                    if name == "graduated" and o.prewarm == "catalog":
                        warmed = await warmer.warm()
                        say.progress(f"  recovery pre-warm of home: {warmed[0]}")
                    elif name == "graduated" and o.prewarm == "all":
                        t0 = time.monotonic()
                        await touch(http, home, prompts, o)
                        pre: dict[str, object] = {
                            "seconds": round(time.monotonic() - t0, 2),
                            "tenants": len(prompts),
                        }
                        warmed = (pre, frozenset(range(len(prompts))))
                    say.progress(f"  recovery {name}, {o.window_s:g} s window")
                    span[name] = await recovery(router, o, name != "all_at_once")
                spans.append(span)
                warmups.append(warmed)
        finally:
            stop.set()
            await loader
        if load.failures:
            say.progress(f"{len(load.failures)} requests failed, e.g. {load.failures[0]}")
    k = d.topology.prefixes.min_sessions
    for r, (span, (pre, tenants)) in enumerate(zip(spans, warmups, strict=True)):
        figs = {name: window(load.records, s, tenants) for name, s in span.items()}
        for name, at in failed_over[r].items():
            # Tenants a catalog could hold at all when the failover came: K sessions
            # after the gateway admitted the prompt (its second sighting), so K + 1.
            seen = Counter(t for started, t in load.starts if started < at)
            eligible = {t for t, n in seen.items() if n > k}
            lo, hi = span[name]
            figs[name]["cold_outside_k"] = sum(
                rec.cold and rec.tenant not in eligible
                for rec in load.records
                if lo <= rec.sent < hi and rec.ttft_s is not None
            )
        steady = figs["steady"]["p99_ms"]
        line: dict[str, object] = {
            "round": r + 1,
            **figs,
            "graduated_steps": slices(load.records, span["graduated"], o.step_interval),
            "prewarm": pre,
            "p99_ratio_recovery": _ratio(figs["graduated"]["p99_ms"], steady),
            "p99_ratio_all_at_once": _ratio(figs["all_at_once"]["p99_ms"], steady),
            "p99_warm_ratio_recovery": _ratio(figs["graduated"]["p99_warm_ms"], steady),
            "p99_warm_ratio_all_at_once": _ratio(figs["all_at_once"]["p99_warm_ms"], steady),
        }
        if "graduated_cold" in figs:
            line["p99_ratio_recovery_cold"] = _ratio(figs["graduated_cold"]["p99_ms"], steady)
        say.line(line)
        rounds.append(line)
    return headline(o, rounds, len(load.records), len(load.failures))


# ---- command line -----------------------------------------------------------------------


def run_bench(o: Options, say: Reporter) -> dict[str, object]:
    started = time.monotonic()
    say.progress(
        f"starting etcd, {2 * o.replicas} simulators ({o.prefill_rate:,.0f} prefill tokens/s, "
        f"{o.engine_seqs} running each) and a gateway; home load if all cold "
        f"{rho(o, cold=True):.0%}, warm {rho(o, cold=False):.0%}"
    )
    with (
        tempfile.TemporaryDirectory(prefix="tectonic-bench-recovery-") as tmp,
        deployment(o, Path(tmp)) as deployed,
    ):
        result = asyncio.run(measure(deployed, o, say))
    result["runtime_s"] = round(time.monotonic() - started, 1)
    return result


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


_positive.__name__ = "number"


def _percent(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be 1 to 100, got {value}")
    return value


_percent.__name__ = "percent"
_COUNT = at_least(1, "count")
_ARGS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("--rounds", _COUNT, "rounds of (steady, graduated, all-at-once), order alternating"),
    ("--tenants", _COUNT, "tenants, each with its own long system prompt"),
    ("--zipf", float, "Zipf exponent of the tenants' popularity (0: uniform)"),
    ("--prompt-tokens", at_least(32, "count"), "about how many tokens a system prompt has"),
    ("--sessions-per-s", _positive, "new sessions per second (Poisson)"),
    ("--turns", _COUNT, "requests per session"),
    ("--think-s", _positive, "seconds between a session's answer and its next request"),
    ("--max-tokens", _COUNT, "tokens per answer"),
    ("--replicas", _COUNT, "simulator replicas per region"),
    ("--engine-seqs", _COUNT, "the simulators' --max-num-seqs (sequences running at once)"),
    ("--prefill-rate", _positive, "prefill tokens/s of one running sequence"),
    ("--decode-rate", _positive, "decode tokens/s of one running sequence"),
    ("--kv-blocks", _COUNT, "KV blocks per replica"),
    ("--step-percent", _percent, "graduated recovery: weight moved home per step"),
    (
        "--step-interval",
        _positive,
        "graduated recovery: seconds between steps (default: the control plane's, 10)",
    ),
    ("--steady-s", _positive, "length of the steady-state window, seconds"),
    ("--failover-s", _positive, "seconds at the target after home is reset"),
    ("--seed", int, "seed of the prompts and the arrivals"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Options()
    for flag, kind, text in _ARGS:
        default = getattr(d, flag[2:].replace("-", "_"))
        shown = f"{default:,g}" if isinstance(default, float) else f"{default:,}"
        p.add_argument(flag, type=kind, default=default, help=f"{text} (default {shown})")
    p.add_argument(
        "--prewarm",
        choices=("catalog", "all", "none"),
        default=d.prewarm,
        help="before the graduated recovery's first step: catalog = the control plane's "
        "recovery pre-warm (home's catalog through its agent); all = every tenant's "
        "prompt on every home replica (a bound: what a complete catalog would give); "
        "none = no pre-warm (as before) (default %(default)s)",
    )
    p.add_argument(
        "--cold-arm",
        action="store_true",
        help="a third recovery per round: graduated without the pre-warm "
        "(headline p99_ratio_recovery_cold)",
    )
    p.add_argument(
        "--no-warm-first",
        dest="warm_first",
        action="store_false",
        help="start the gateway with --no-warm-first: no warm-first placement, no recall "
        "of home's prompts (the catalog pre-warm only)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def run(args: argparse.Namespace) -> int:
    o = Options(**{f.name: getattr(args, f.name) for f in fields(Options)})
    return main(
        lambda: run_bench(o, Reporter(o.quiet)),
        (BenchError, RuntimeError, aiohttp.ClientError, OSError),
    )
