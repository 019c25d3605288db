"""``python -m bench store``: etcd's database under a lab's steady traffic, while the
control-plane leader compacts etcd's history (issue 27).

A local lab (chaos/lab/deployment.py: one etcd member, three regions of two
simulators with their agents and gateways, two control-plane processes) serves
``--sessions`` chat sessions for ``--duration-s``: chaos/drills/traffic.py's load, the
drills' own (groups of five sessions share a system prompt, each session sends a turn
about every ``--request-interval`` seconds through its home region's gateway, half of
them streamed). The topology's ``etcd.compact_retention_s`` / ``compact_interval_s``
are ``--retention-s`` / ``--compact-interval-s``, short, so that compaction settles
within the run. Then, unless ``--without-compaction-s 0``, the same lab again for that
long with ``compact_retention_s: 0`` (the leader never compacts), for the ratio.

The truth is etcd's, not Tectonic's:

* the database's size: etcd's own ``/metrics`` (``etcd_mvcc_db_total_size_in_bytes``,
  the high-water mark of its file, what its quota is checked against) every
  ``--sample-s``. ``db_growth_mb_per_min`` is the least-squares slope over the run's
  second half (compaction has settled by then), ``db_mb_first_window`` the size one
  retention and one interval after the traffic started (the first compaction is due),
  ``db_mb_after`` the size at the end;
* who writes how much: one watch of the deployment's whole prefix from the revision at
  which the traffic starts, summing each event's value size by writer, read off the key
  (the table of keys in docs/architecture.md §2): ``prefix-exports/<gateway>``,
  ``sessions/`` (by the pin's home: the gateway a session enters by), ``session-moves/``
  (by its ``by``),
  ``session-leases/`` (``shared``) are the gateways'; ``leader``, ``spec``,
  ``regions/<r>/{state,health}``, ``routing/``, ``prefixes/``, ``prefix-wanted/``,
  ``degradation/``, ``audit/``, ``intent-outcomes/`` the leader's; ``reports/`` are
  written by any control-plane replica's API for the agents and gateways that report
  (and by the leader's probe), counted apart (``reports``, split by observer kind);
  ``pools/`` the agents'; the rest by who the table names, or ``other``.

Tectonic's own figures are reported beside them: the compactions the control planes
ran (``tectonic_store_compactions_total``, both replicas summed) against etcd's
``etcd_debugging_mvcc_compact_revision``, and the prefix payloads the gateways dropped
(``tectonic_gateway_prefix_payloads_dropped_total``; 0 with
``payloads_dropped_source: "absent"`` when no gateway exports that counter).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from bench._common import BenchError, Reporter, goals_and_met, main
from chaos.drills.traffic import Traffic
from chaos.lab.deployment import LocalDeployment
from chaos.lab.run import running_lab
from chaos.lab.spec import DeploymentSpec
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import StoreError, StoreUnavailable, WatchEvent
from controlplane.kernel.store.settings import EtcdConfig

MB = 1_000_000
ETCD_DB = "etcd_mvcc_db_total_size_in_bytes"
ETCD_DB_IN_USE = "etcd_mvcc_db_total_size_in_use_in_bytes"
ETCD_COMPACT_REVISION = "etcd_debugging_mvcc_compact_revision"
ETCD_QUOTA = "etcd_server_quota_backend_bytes"
CP_COMPACTIONS = "tectonic_store_compactions_total"
CP_COMPACTED = "tectonic_store_compacted_revision"
PAYLOADS_DROPPED = "tectonic_gateway_prefix_payloads_dropped_total"

# Who writes the keys under each first path segment (docs/architecture.md §2).
GATEWAY_SEGMENTS = frozenset({"prefix-exports", "sessions", "session-moves", "session-leases"})
LEADER_SEGMENTS = frozenset(
    {
        "leader",
        "spec",
        "regions",
        "routing",
        "prefixes",
        "prefix-wanted",
        "degradation",
        "audit",
        "intent-outcomes",
    }
)
OTHER_WRITERS = {
    "reports": "reports",  # any replica's API, for the observer named in the key
    "pools": "agent",
    "pool-loans": "drills",
    "capacity": "drills",
    "drills": "drills",
    "intents": "api",
    "intent-claims": "api",
    "control": "api",
}
SHARED = "shared"  # a gateway key no one gateway owns (the session leases)


@dataclass(frozen=True)
class Goals:
    db_growth_mb_per_min: float = 1.0  # after compaction settles
    payloads_dropped: int = 0


# ---- who wrote what: a watch of the whole prefix ---------------------------------------------
def _json_field(value: bytes, name: str) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        found = json.loads(value).get(name)
        if isinstance(found, str):
            return found
    return ""


def _gateway_region(gateway_id: str) -> str:
    """``gateway:<region>:<host>:<port>`` -> region ('' when not of that shape)."""
    parts = gateway_id.split(":")
    return parts[1] if len(parts) > 2 and parts[0] == "gateway" else ""


def writer_of(key: str, value: bytes) -> tuple[str, str]:
    """Who wrote ``key`` (relative to the deployment's root) and, for a gateway's key,
    which gateway (its region, or ``shared``; '' otherwise)."""
    first, _, rest = key.partition("/")
    if first in GATEWAY_SEGMENTS:
        if first == "prefix-exports":
            region = _gateway_region(rest)
        elif first == "sessions":
            region = _json_field(value, "home")
        elif first == "session-moves":
            region = _gateway_region(_json_field(value, "by"))
        else:
            region = ""
        return "gateway", region or SHARED
    if first == "regions" and rest.endswith("/readiness"):
        return "drills", ""
    if first in LEADER_SEGMENTS:
        return "leader", ""
    return OTHER_WRITERS.get(first, "other"), ""


@dataclass
class WriteTally:
    """Bytes of values written under ``root`` after revision ``after``, as a watch saw
    them: by writer, by gateway, by first key segment, by kind of reporting observer."""

    root: str
    after: int  # events of revisions above this one count ...
    until: int | None = None  # ... up to this one (None: no end yet)
    bytes_by_writer: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes_by_gateway: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes_by_segment: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    reports_by_observer: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    events: int = 0
    last_revision: int = 0
    # revisions the watch could not see (compacted before it resumed): (first, last)
    gaps: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.last_revision = self.after

    @property
    def total(self) -> int:
        return sum(self.bytes_by_writer.values())

    def add(self, ev: WatchEvent) -> None:
        self.last_revision = max(self.last_revision, ev.kv.mod_revision)
        revision = ev.kv.mod_revision
        if revision <= self.after or (self.until is not None and revision > self.until):
            return
        if not ev.kv.key.startswith(self.root):
            return
        key, size = ev.kv.key[len(self.root) :], len(ev.kv.value)
        self.events += 1
        writer, gateway = writer_of(key, ev.kv.value)
        self.bytes_by_writer[writer] += size
        self.bytes_by_segment[key.partition("/")[0]] += size
        if gateway:
            self.bytes_by_gateway[gateway] += size
        if writer == "reports":
            observer = key.split("/")[-1]
            self.reports_by_observer[observer.partition(":")[0]] += size

    async def follow(self, store: EtcdStore) -> None:
        """Watch ``root`` from ``after`` + 1 until cancelled: resumes where it was when
        the stream breaks, and from the store's current revision (recording the gap)
        when the revision it needs was compacted away meanwhile."""
        while True:
            try:
                async for ev in store.watch_prefix(
                    self.root, start_revision=self.last_revision + 1
                ):
                    self.add(ev)
            except StoreUnavailable:
                await asyncio.sleep(0.2)
            except StoreError:
                now = (await store.get_prefix(self.root + "leader")).revision
                self.gaps.append((self.last_revision + 1, now))
                self.last_revision = now

    async def caught_up(self, store: EtcdStore, within: float) -> bool:
        """End the count at the store's current revision and wait (at most ``within``
        s) until the watch has seen it; whether it did."""
        revision = (await store.get_prefix(self.root + "leader")).revision
        self.until = revision
        deadline = time.monotonic() + within
        while self.last_revision < revision:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True


# ---- etcd's and the processes' own figures ---------------------------------------------------
def metric_values(text: str, name: str) -> list[float]:
    """Every sample of ``name`` (any labels) in a Prometheus text exposition."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return [float(v) for v in pattern.findall(text)]


async def scrape(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/metrics") as r:
        r.raise_for_status()
        return await r.text()


async def summed(http: aiohttp.ClientSession, urls: Iterable[str], name: str) -> float | None:
    """``name`` summed over every process at ``urls`` (None: no process exports it)."""
    texts = await asyncio.gather(*(scrape(http, u) for u in urls))
    values = [v for text in texts for v in metric_values(text, name)]
    return sum(values) if values else None


@dataclass(frozen=True)
class DbSample:
    t: float  # s since the traffic started
    total: int  # etcd_mvcc_db_total_size_in_bytes
    in_use: int


async def db_sample(http: aiohttp.ClientSession, etcd_url: str, t0: float) -> DbSample:
    text = await scrape(http, etcd_url)
    total, in_use = metric_values(text, ETCD_DB), metric_values(text, ETCD_DB_IN_USE)
    if not total:
        raise BenchError(f"etcd at {etcd_url} exports no {ETCD_DB}")
    return DbSample(time.monotonic() - t0, int(total[0]), int(in_use[0]) if in_use else 0)


def slope_mb_per_min(samples: Sequence[DbSample], since_s: float) -> float | None:
    """Least-squares slope of the database's size over the samples from ``since_s`` on."""
    pts = [(s.t / 60, s.total / MB) for s in samples if s.t >= since_s]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / var


def size_at(samples: Sequence[DbSample], t: float) -> DbSample:
    """The first sample at or after ``t`` (the last one if none)."""
    return next((s for s in samples if s.t >= t), samples[-1])


def _mb(n: float) -> float:
    return round(n / MB, 3)


def _rates(counts: dict[str, int], seconds: float) -> dict[str, float]:
    return {k: round(v / seconds, 1) for k, v in sorted(counts.items())}


# ---- one lab under load ------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    duration_s: float
    retention_s: float  # 0: the leader never compacts
    compact_interval_s: float


async def load_lab(
    dep: LocalDeployment, run: Run, args: argparse.Namespace, out: Reporter
) -> dict[str, object]:
    """Drive the traffic through ``dep`` for ``run.duration_s``; what etcd saw."""
    store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
    await store.connect()
    etcd_url = f"http://{dep.etcd_endpoints[0]}"
    traffic = Traffic(
        dep.gateway_urls, interval_s=args.request_interval, stream_share=0.5, seed=args.seed
    )
    traffic.add(args.sessions, list(dep.spec.regions))
    timeout = aiohttp.ClientTimeout(total=5)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            start_revision = (await store.get_prefix(dep.keys.leader())).revision
            tally = WriteTally(dep.keys.root, start_revision)
            watch = asyncio.create_task(tally.follow(store))
            await traffic.start()
            t0 = time.monotonic()
            samples = [await db_sample(http, etcd_url, t0)]
            next_say = 15.0
            try:
                while (now := time.monotonic() - t0) < run.duration_s:
                    await asyncio.sleep(min(args.sample_s, run.duration_s - now))
                    samples.append(await db_sample(http, etcd_url, t0))
                    if samples[-1].t >= next_say:
                        next_say += 15.0
                        out.progress(
                            f"t+{samples[-1].t:.0f}s: etcd's db {_mb(samples[-1].total)} MB "
                            f"({_mb(samples[-1].in_use)} MB in use), watched "
                            f"{tally.total / samples[-1].t / 1e3:.1f} kB/s; {traffic.line()}"
                        )
            finally:
                await traffic.stop()
            elapsed = time.monotonic() - t0
            caught_up = await tally.caught_up(store, within=10.0)
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            cp_urls = [f"http://127.0.0.1:{p}" for p in dep.cp_http_ports.values()]
            gw_urls = list(dep.data_plane_metrics_urls.values())
            compactions = await summed(http, cp_urls, CP_COMPACTIONS)
            cp_revisions = [
                v for u in cp_urls for v in metric_values(await scrape(http, u), CP_COMPACTED)
            ]
            # etcd's after the leader's: the leader still compacts every interval, and it
            # sets its gauge once etcd has compacted, so read in this order the leader's
            # revision can never be ahead of etcd's (read the other way round, it was).
            etcd_text = await scrape(http, etcd_url)
            dropped = await summed(http, gw_urls, PAYLOADS_DROPPED)
            alarms = await store.alarms()
    finally:
        await store.close()
    if not caught_up:
        raise BenchError("the watch of etcd did not catch up within 10 s of the run's end")
    etcd_compact = metric_values(etcd_text, ETCD_COMPACT_REVISION)
    quota = metric_values(etcd_text, ETCD_QUOTA)
    settle = run.retention_s + run.compact_interval_s
    first = size_at(samples, settle if run.retention_s else run.duration_s / 2)
    return {
        "duration_s": round(elapsed, 1),
        "retention_s": run.retention_s,
        "compact_interval_s": run.compact_interval_s,
        "db_growth_mb_per_min": _round(slope_mb_per_min(samples, run.duration_s / 2), 3),
        "db_mb_start": _mb(samples[0].total),
        "db_mb_first_window": _mb(first.total),
        "db_first_window_at_s": round(first.t, 1),
        "db_mb_after": _mb(samples[-1].total),
        "db_mb_max": _mb(max(s.total for s in samples)),
        "db_in_use_mb_after": _mb(samples[-1].in_use),
        "db_samples": len(samples),
        "write_bytes_per_s_gateway": _rates(tally.bytes_by_gateway, elapsed),
        "write_bytes_per_s_leader": round(tally.bytes_by_writer.get("leader", 0) / elapsed, 1),
        "write_bytes_per_s_by_writer": _rates(tally.bytes_by_writer, elapsed),
        "write_bytes_per_s_by_key": _rates(tally.bytes_by_segment, elapsed),
        "write_bytes_per_s_reports_by_observer": _rates(tally.reports_by_observer, elapsed),
        "write_bytes_per_s_total": round(tally.total / elapsed, 1),
        "written_mb": _mb(tally.total),
        "watched_events": tally.events,
        "watch_gaps": [list(g) for g in tally.gaps],
        "compactions": int(compactions or 0),
        "compacted_revision": int(max(cp_revisions, default=0)),
        "etcd_compact_revision": int(etcd_compact[0]) if etcd_compact else None,
        "etcd_quota_bytes": int(quota[0]) if quota else None,
        "etcd_alarms": alarms,
        "payloads_dropped": int(dropped or 0),
        "payloads_dropped_source": "gateways' /metrics" if dropped is not None else "absent",
        "requests_ok": traffic.ok,
        "requests_failed": len(traffic.failures),
    }


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) else None


async def one_lab(run: Run, args: argparse.Namespace, out: Reporter) -> dict[str, object]:
    spec = dataclasses.replace(
        DeploymentSpec(),
        compact_retention_s=run.retention_s,
        compact_interval_s=run.compact_interval_s,
    )
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-bench-store-"))
    async with running_lab(spec, workdir, say=out.progress) as dep:
        prefixes = yaml.safe_load(dep.topology_path.read_text())["prefixes"]
        words = f"every {run.compact_interval_s:g} s, keeping {run.retention_s:g} s"
        out.progress(
            f"{args.sessions} sessions for {run.duration_s:g} s; the leader compacts "
            + (words if run.retention_s else "never")
        )
        figures = await load_lab(dep, run, args, out)
    figures["prefix_export_interval_s"] = prefixes["export_interval_s"]
    figures["prefix_aggregate_interval_s"] = prefixes["aggregate_interval_s"]
    return figures


async def measure(args: argparse.Namespace, out: Reporter) -> dict[str, object]:
    t0 = time.monotonic()
    main_run = Run(args.duration_s, args.retention_s, args.compact_interval_s)
    head = await one_lab(main_run, args, out)
    out.line({"run": "compaction", **head})
    without: dict[str, object] | None = None
    if args.without_compaction_s > 0:
        bare = Run(args.without_compaction_s, 0.0, args.compact_interval_s)
        without = await one_lab(bare, args, out)
        out.line({"run": "without_compaction", **without})
    bare_growth = without["db_growth_mb_per_min"] if without else None
    figures = {k: _num(head[k]) for k in ("db_growth_mb_per_min", "payloads_dropped")}
    return {
        "bench": "store",
        "sessions": args.sessions,
        "request_interval_s": args.request_interval,
        **head,
        "db_growth_mb_per_min_without_compaction": bare_growth,
        "without_compaction": without,
        **goals_and_met(Goals(), figures),
        "runtime_s": round(time.monotonic() - t0, 1),
    }


EPILOG = """figures (last line, JSON); sizes and bytes are read from etcd itself:
  db_growth_mb_per_min   slope of etcd_mvcc_db_total_size_in_bytes (etcd's /metrics)
                         over the run's second half, once compaction has settled (goal <= 1)
  db_mb_first_window     the size one retention + one interval after the traffic started
  db_mb_after            the size at the end
  write_bytes_per_s_*    value bytes per second put in etcd, from a watch of the whole
                         cluster prefix, by writer (each gateway, the leader, the reports
                         the control plane stores for agents and gateways, ...) and by key
  compactions            tectonic_store_compactions_total of both control planes, beside
                         etcd_compact_revision (etcd's own)
  payloads_dropped       tectonic_gateway_prefix_payloads_dropped_total (goal 0)
  db_growth_mb_per_min_without_compaction
                         the same lab with compact_retention_s 0 (--without-compaction-s)

example: python -m bench store --duration-s 120 --retention-s 20 --quiet"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument(
        "--duration-s", type=float, default=180.0, help="traffic time with compaction (180)"
    )
    p.add_argument(
        "--retention-s",
        type=float,
        default=30.0,
        help="the lab topology's etcd.compact_retention_s: history kept behind the head "
        "(default 30, so that compaction settles within the run)",
    )
    p.add_argument(
        "--compact-interval-s",
        type=float,
        default=5.0,
        help="the topology's etcd.compact_interval_s (default 5)",
    )
    p.add_argument(
        "--without-compaction-s",
        type=float,
        default=60.0,
        help="then the same lab this long with compact_retention_s 0, for "
        "db_growth_mb_per_min_without_compaction (default 60; 0: skip)",
    )
    p.add_argument("--sessions", type=int, default=30, help="chat sessions (default 30)")
    p.add_argument(
        "--request-interval", type=float, default=0.5, help="s between a session's turns (0.5)"
    )
    p.add_argument("--sample-s", type=float, default=2.0, help="s between etcd size samples (2)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    if args.retention_s <= 0 or args.compact_interval_s <= 0:
        print(json.dumps({"error": "--retention-s and --compact-interval-s must be > 0"}))
        return 2
    if args.duration_s < 4 * args.sample_s or args.sessions < 1:
        print(json.dumps({"error": "--duration-s too short for --sample-s, or no sessions"}))
        return 2
    out = Reporter(args.quiet)
    return main(lambda: asyncio.run(measure(args, out)), (BenchError, TimeoutError))
