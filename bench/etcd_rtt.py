"""``python -m bench etcd_rtt``: one etcd with members in three regions, costed (issue 35).

For each injected round-trip time (``--rtts``, default 0, 30, 60 and 100 ms) a fresh
three-member etcd (``chaos.lab.local_etcd.EtcdCluster`` with ``proxied_peers``) runs
behind latency proxies (``chaos.lab.latency_proxy``, one process): every member
advertises a proxy to its peers, so every raft message between two members pays
RTT/2 each way, and clients reach the members through proxies too. The clients sit in
member m0's region (``--client-layout colocated``, the default): m0's client link is
not delayed, m1's and m2's are; ``remote`` delays all three. ``--balance`` is every
client's ``etcd.balance``: ``first`` (the default, what docs/etcd.md advises across
regions: m0, listed first, takes every call) or ``round_robin`` (calls spread over
the three members, so most cross regions). The raft leader
is moved to m1, another region (``--etcd-leader remote``, the default; ``local``: m0),
so that every RTT is measured with the same placement. etcd runs with
``--heartbeat-interval`` = max(100, RTT) ms and ``--election-timeout`` = 10 x that
(etcd's tuning guidance), still ``--unsafe-no-fsync``: a disk's fsync comes on top.
Figures:

* **the failover switch** (``switch_ms_p99_rttN``): the orchestrator's SWITCH write,
  ``Orchestrator.write`` of a ``failover_step_write`` (one fenced transaction on the
  region's state, every ``routing/*`` and the audit entry: the control plane's commit
  of a failover), timed ``--switches`` times as ``bench sessions`` times it, the
  snapshot it is decided on read once (``Switches``);
* **a new session's pin** (``pin_ms_p99_rttN``): the gateway's own path for a session
  it has never seen, ``SessionResolver.region_for`` over the real ``SessionStore``
  (read the pin, create-if-absent transaction), with the gateway's default etcd
  timeouts; the first request of a new session waits for it before its first token
  is asked for, so it is that request's first-token overhead. A pin that ran out of
  ``--store-timeout`` and was served fail-static is counted (``pin_fail_static_rttN``),
  not timed;
* **the leader lease** (``lease_survived_rttN``): a ``LeaseKeeper`` with the
  topology's default ``timing.lease_ttl_s`` keeps its lease alive through the run;
  ``keepalive_ms_p99_rttN`` times single refreshes; ``leader_changes_rttN`` counts
  the raft elections etcd held during the measures;
* **detection to switch** (``failover_detect_s_rttN``, unless ``--no-control-plane``):
  a real control-plane process (``bench/scale_cp.py``) on that etcd, three regions
  whose agent reports this process pushes over gRPC; the victim's agent stops: the
  time until ``regions/<victim>/state`` is FAILING_OVER in etcd; ``tick_ms_p50_rttN``
  is how long its leading ticks took;
* **the lab's raft timings** (``lab_flags_healthy_rttN``, ``--lab-flags-rtt``, default
  100): the test lab's heartbeat 10 ms / election 100 ms at that RTT: whether the
  cluster becomes healthy in 15 s, and how many elections it holds in 5 s.

One JSON object per RTT goes to stdout, then the headline; progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from bench import scale
from bench._common import BenchError, Reporter, at_least, main, percentile
from bench.sessions import Deployment, Options, _topology
from bench.sessions import Reporter as QuietPhases
from chaos.lab.local_etcd import EtcdCluster
from chaos.lab.ports import reserved_port
from controlplane.core.actions import Write
from controlplane.core.steps import failover_step_write
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.keys import Keys
from controlplane.kernel.leases import LeaseKeeper, LeaseLost
from controlplane.kernel.model import FailoverStep, Routing
from controlplane.kernel.sessions.store import SessionStore
from controlplane.kernel.snapshot_reader import read_snapshot
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import StoreError
from controlplane.kernel.store.settings import EtcdConfig
from controlplane.kernel.timing import TimingConfig
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.options import DataPlaneOptions
from regions.dataplane.sessions import SessionResolver

RTTS = (0, 30, 60, 100)
HOME = "us-east"  # the sessions bench's regions; the gateway's home
WARMUP = 3  # untimed switches / pins first (the first pin also grants the bucket lease)
ETCD_DEFAULT_HEARTBEAT_MS = 100  # etcd's own defaults
ELECTION_PER_HEARTBEAT = 10  # etcd's guidance: election timeout ~10 x the heartbeat
LAB_FLAGS_HOLD_S = 5.0  # how long the lab's fast raft timings are watched


# the gateway as it ships (a dataclass's class attribute is its field's default)
GATEWAY_ETCD_TIMEOUT_S = DataPlaneOptions.etcd_timeout_s
GATEWAY_STORE_TIMEOUT_S = DataPlaneOptions.store_timeout_s
LEASE_TTL_S = TimingConfig().lease_ttl_s


def raft_flags(rtt_ms: int) -> tuple[str, ...]:
    heartbeat = max(ETCD_DEFAULT_HEARTBEAT_MS, rtt_ms)
    return (
        f"--heartbeat-interval={heartbeat}",
        f"--election-timeout={heartbeat * ELECTION_PER_HEARTBEAT}",
    )


@dataclass
class StaticRouting:
    """The gateway's routing view, every region serving its own traffic."""

    names: Sequence[str]
    connected: bool = True
    _routings: dict[str, Routing] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._routings = {r: Routing(targets={r: 1.0}) for r in self.names}

    @property
    def routings(self) -> Mapping[str, Routing]:
        return self._routings


# ---- the layout ------------------------------------------------------------------------


@contextlib.contextmanager
def proxies(routes: Sequence[str]) -> Iterator[None]:
    """The latency proxies as one process (so that their timers do not queue behind
    this process's measuring), until the block ends."""
    args = [sys.executable, "-m", "chaos.lab.latency_proxy"]
    for r in routes:
        args += ["--route", r]
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("ready"):
                raise BenchError(f"the latency proxy did not start (exit {proc.poll()})")
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


Balance = Literal["first", "round_robin"]  # etcd.balance


@contextlib.contextmanager
def cross_region_etcd(
    rtt_ms: int,
    layout: str,
    leader: int | None,
    flags: tuple[str, ...] | None = None,
    start_timeout_s: float = 60.0,
) -> Iterator[tuple[EtcdCluster, tuple[str, ...]]]:
    """Three members whose peer links all pay ``rtt_ms``, member ``leader`` the raft
    leader (None: whichever won), and the client endpoints (proxies) a process in m0's
    region uses. ``flags``: etcd's raft timings (None: ``raft_flags(rtt_ms)``; (): the
    lab's fast ones)."""
    one_way = rtt_ms / 2
    flags = raft_flags(rtt_ms) if flags is None else flags
    cluster = EtcdCluster(3, extra_flags=flags, proxied_peers=True, start_timeout_s=start_timeout_s)
    taken = {p for m in cluster.members for p in (m.client_port, m.peer_port)}
    taken |= {a for a, _ in cluster.peer_routes}
    routes = [f"{a}=127.0.0.1:{p}@{one_way:g}" for a, p in cluster.peer_routes]
    endpoints = []
    for i, m in enumerate(cluster.members):
        port = reserved_port(taken)
        delay = 0.0 if (layout == "colocated" and i == 0) else one_way
        routes.append(f"{port}=127.0.0.1:{m.client_port}@{delay:g}")
        endpoints.append(f"127.0.0.1:{port}")
    try:
        with proxies(routes):
            cluster.start()
            if leader is not None:
                move_leader(cluster, leader)
            yield cluster, tuple(endpoints)
    finally:
        cluster.stop()


def move_leader(cluster: EtcdCluster, to: int) -> None:
    """Make member ``to`` the raft leader (etcdctl move-leader, on unproxied ports), so
    that every RTT is measured with the leader in the same region."""
    deadline = time.monotonic() + 30
    while (lead := cluster.leader_index()) != to:
        if time.monotonic() > deadline:
            raise BenchError(f"etcd's leader is m{lead}, not m{to}, after 30 s")
        if lead is not None:
            at = f"--endpoints={cluster.members[lead].endpoint}"
            listed = subprocess.run(
                ["etcdctl", at, "member", "list", "-w", "json"],
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            )
            ids = {m["name"]: m["ID"] for m in json.loads(listed.stdout)["members"]}
            subprocess.run(
                ["etcdctl", at, "move-leader", f"{ids[cluster.members[to].name]:x}"],
                capture_output=True,
                check=False,
                timeout=30,
            )
        time.sleep(0.2)


def leader_changes(cluster: EtcdCluster) -> int:
    """The most elections any member has seen (read on its own, unproxied port)."""
    most = 0
    for m in cluster.members:
        with urllib.request.urlopen(f"http://{m.endpoint}/metrics", timeout=5) as r:
            text = r.read().decode()
        found = re.search(r"^etcd_server_leader_changes_seen_total (\S+)$", text, re.MULTILINE)
        most = max(most, int(float(found.group(1))) if found else 0)
    return most


# ---- the measures ----------------------------------------------------------------------


class Switches(Deployment):
    """``bench sessions``' deployment (the same fence, reset and orchestrator write),
    but the snapshot is read once: at 100 ms a snapshot is ~14 reads of ~0.2 s each,
    and the SWITCH written again after each reset differs from the first only in the
    revisions it compares (every key it compares was written by the reset)."""

    template: Write | None = None

    async def switch_once(self) -> float:
        await self._reset()
        kv = await self.store.get(self.keys.region_state(self.source))
        if kv is None:
            raise BenchError("the reset wrote no region state")
        # one more call, so that with round_robin the write's turn over the three
        # members moves on each switch (3 calls a switch would land every write on the
        # same member)
        await self.store.get(self.keys.leader())
        if self.template is None:
            snap = await read_snapshot(self.store, self.keys, self.topo, self.clock.now())
            self.template = failover_step_write(snap, self.source, FailoverStep.SWITCH, "bench")
        rev = kv.mod_revision
        w = self.template.model_copy(
            update={
                "expected_rev": rev,
                "routing_revs": dict.fromkeys(self.template.routing_revs, rev),
            }
        )
        t0 = time.perf_counter()
        ok = await self.orch.write(w)
        elapsed = time.perf_counter() - t0
        if not ok:
            raise BenchError("the SWITCH transaction lost its compare (nothing else writes)")
        return elapsed * 1000


async def switches(store: EtcdStore, endpoint: str, n: int) -> list[float]:
    """The SWITCH write's milliseconds, ``n`` times."""
    dep = Switches(store, endpoint, _topology(endpoint), Options(), QuietPhases(True))
    await dep.fence.take(store)
    times = [await dep.switch_once() for _ in range(WARMUP + n)]
    return times[WARMUP:]


async def pins(
    endpoints: tuple[str, ...], n: int, rtt_ms: int, balance: Balance
) -> tuple[list[float], int]:
    """A new session's pin through the gateway's resolver, ``n`` times: milliseconds of
    those written to etcd, and how many fell back to fail-static instead."""
    config = EtcdConfig(
        endpoints=endpoints, request_timeout_s=GATEWAY_ETCD_TIMEOUT_S, balance=balance
    )
    names = ("us-east", "us-west", "us-central")
    times: list[float] = []
    fail_static = 0
    async with EtcdStore(config) as store:
        sessions = SessionStore(
            store, Keys("bench-sessions"), regions=names, clock=SystemClock(), writer="gateway"
        )

        def resolver() -> SessionResolver:
            return SessionResolver(
                sessions,
                StaticRouting(names),
                HOME,
                DataPlaneMetrics(),
                store_timeout_s=GATEWAY_STORE_TIMEOUT_S,
            )

        gw = resolver()
        for i in range(WARMUP + n):
            t0 = time.perf_counter()
            await gw.region_for(f"rtt{rtt_ms}-s{i:06d}")
            ms = (time.perf_counter() - t0) * 1000
            if gw.pending or not gw.store_up:
                fail_static += 1
                gw = resolver()  # a fresh gateway: this one waits for its store probe
            elif i >= WARMUP:
                times.append(ms)
    return times, fail_static


async def keepalives(store: EtcdStore, n: int) -> list[float]:
    lease = await store.grant_lease(LEASE_TTL_S)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await store.refresh_lease(lease)
        times.append((time.perf_counter() - t0) * 1000)
    await store.revoke_lease(lease)
    return times


async def detect(
    endpoints: tuple[str, ...], rtt_ms: int, balance: Balance, rep: Reporter
) -> tuple[float | None, list[float]]:
    """A control-plane process on this etcd: seconds from the victim's agent going
    silent (and reporting UNHEALTHY) to FAILING_OVER in etcd (None if not in 30 s),
    and the milliseconds of each of its leading ticks."""
    n = 3

    def data_for(agents_port: int, victim_port: int) -> dict[str, object]:
        data = scale._topology(n, endpoints[0], agents_port, victim_port)
        data["etcd"] = {"endpoints": list(endpoints), "balance": balance}
        for region in data["regions"]:  # type: ignore[attr-defined]
            region["zone"] = "z0"  # one residency zone: the victim has somewhere to go
        return data

    config = EtcdConfig(endpoints=endpoints, balance=balance)
    async with (
        scale.reported_control_plane(n, data_for, f"etcd-rtt{rtt_ms}") as cp,
        EtcdStore(config) as store,
    ):
        keys = Keys(f"scale{n}")
        # a leader holds its key (its ticks start then)
        deadline = time.monotonic() + 30
        while await store.get(keys.leader()) is None:
            if time.monotonic() > deadline:
                raise BenchError(f"rtt {rtt_ms} ms: the control plane never led")
            await asyncio.sleep(0.1)
        await asyncio.sleep(2)  # reports from every region count
        rep.progress(f"rtt {rtt_ms} ms: {cp.names[0]}'s agent stops answering")
        victim = await cp.silence_victim()
        seconds = await scale.until_failing_over(store, keys, victim)
    ticks, _, _ = scale._times(cp.times, 0)
    return seconds, ticks


async def measure(
    cluster: EtcdCluster,
    endpoints: tuple[str, ...],
    rtt_ms: int,
    args: argparse.Namespace,
    rep: Reporter,
) -> dict[str, object]:
    elections_at_start = leader_changes(cluster)
    config = EtcdConfig(endpoints=endpoints, request_timeout_s=10.0, balance=args.balance)
    async with EtcdStore(config) as store, EtcdStore(config) as lease_store:
        keeper = LeaseKeeper(lease_store, LEASE_TTL_S, name="bench leader lease")
        await keeper.grant()
        held_from = time.monotonic()
        keeping = asyncio.create_task(keeper.keep_alive())
        try:
            rep.progress(f"rtt {rtt_ms} ms: {args.switches} switches")
            switch = await switches(store, endpoints[0], args.switches)
            rep.progress(f"rtt {rtt_ms} ms: {args.pins} new sessions")
            pin, fail_static = await pins(endpoints, args.pins, rtt_ms, args.balance)
            keep = await keepalives(store, args.keepalives)
            cp, ticks = (
                await detect(endpoints, rtt_ms, args.balance, rep)
                if args.control_plane
                else (None, [])
            )
            held_s = time.monotonic() - held_from
            survived = not keeping.done() and keeper.valid
        finally:
            keeping.cancel()
            with contextlib.suppress(asyncio.CancelledError, LeaseLost, StoreError):
                await keeping
            with contextlib.suppress(StoreError):
                await keeper.revoke()
    leader = cluster.leader_index()
    sfx = f"rtt{rtt_ms}"
    return {
        f"switch_ms_p50_{sfx}": _round(percentile(switch, 50)),
        f"switch_ms_p99_{sfx}": _round(percentile(switch, 99)),
        f"pin_ms_p50_{sfx}": _round(percentile(pin, 50)),
        f"pin_ms_p99_{sfx}": _round(percentile(pin, 99)),
        f"pin_fail_static_{sfx}": fail_static,
        f"keepalive_ms_p99_{sfx}": _round(percentile(keep, 99)),
        f"lease_survived_{sfx}": survived,
        f"lease_held_s_{sfx}": round(held_s, 1),
        f"leader_changes_{sfx}": leader_changes(cluster) - elections_at_start,
        f"etcd_leader_{sfx}": None if leader is None else f"m{leader}",
        f"failover_detect_s_{sfx}": _round(cp),
        f"tick_ms_p50_{sfx}": _round(percentile(ticks, 50)),
        f"tick_ms_p99_{sfx}": _round(percentile(ticks, 99)),
        f"raft_flags_{sfx}": " ".join(raft_flags(rtt_ms)),
    }


def lab_flags_at(rtt_ms: int, hold_s: float, rep: Reporter) -> dict[str, object]:
    """The lab's fast raft timings (heartbeat 10 ms, election 100 ms) across ``rtt_ms``:
    whether the cluster becomes healthy in 15 s, and the elections it holds in
    ``hold_s`` more (the first election included)."""
    rep.progress(f"rtt {rtt_ms} ms: the lab's fast raft timings (heartbeat 10, election 100)")
    sfx = f"rtt{rtt_ms}"
    try:
        with cross_region_etcd(rtt_ms, "colocated", None, (), 15.0) as (cluster, _):
            time.sleep(hold_s)
            changes = leader_changes(cluster)
    except TimeoutError:
        return {f"lab_flags_healthy_{sfx}": False, f"lab_flags_leader_changes_{sfx}": None}
    return {f"lab_flags_healthy_{sfx}": True, f"lab_flags_leader_changes_{sfx}": changes}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _bench(args: argparse.Namespace) -> dict[str, object]:
    rep = Reporter(args.quiet)
    started = time.monotonic()
    figures: dict[str, object] = {}
    for rtt in args.rtts:
        rep.progress(f"rtt {rtt} ms: starting three members behind latency proxies")
        leader = 0 if args.etcd_leader == "local" else 1
        with cross_region_etcd(rtt, args.client_layout, leader) as (cluster, endpoints):
            one = asyncio.run(measure(cluster, endpoints, rtt, args, rep))
        rep.line({"rtt_ms": rtt, **one})
        figures.update(one)
    if args.lab_flags_rtt is not None:
        lab = lab_flags_at(args.lab_flags_rtt, LAB_FLAGS_HOLD_S, rep)
        rep.line({"rtt_ms": args.lab_flags_rtt, **lab})
        figures.update(lab)
    return {
        "bench": "etcd_rtt",
        **{
            f"{k}_rtt{r}": figures.get(f"{k}_rtt{r}")
            for k in ("switch_ms_p99", "pin_ms_p99")
            for r in args.rtts
        },
        "figures": figures,
        "rtts_ms": list(args.rtts),
        "members": 3,
        "client_layout": args.client_layout,
        "etcd_leader": args.etcd_leader,
        "balance": args.balance,
        "switches": args.switches,
        "pins": args.pins,
        "pin_is": "a new session's first-token overhead: its first request waits for "
        "this pin (read + create-if-absent txn) before a replica is asked",
        "gateway_etcd_timeout_s": GATEWAY_ETCD_TIMEOUT_S,
        "gateway_store_timeout_s": GATEWAY_STORE_TIMEOUT_S,
        "lease_ttl_s": LEASE_TTL_S,
        "etcd": "3 members on loopback behind latency proxies (peer and client links), "
        "--unsafe-no-fsync",
        "cpus": os.cpu_count(),
        "runtime_s": round(time.monotonic() - started, 1),
    }


def _rtts(text: str) -> tuple[int, ...]:
    try:
        rtts = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole milliseconds like 0,30,100, got {text!r}"
        ) from None
    if any(r < 0 for r in rtts):
        raise argparse.ArgumentTypeError(f"a round-trip time cannot be negative, got {text!r}")
    if any(r > 2000 for r in rtts):
        raise argparse.ArgumentTypeError("round-trip times above 2000 ms are not a region pair")
    return rtts


def _one_rtt(text: str) -> int | None:
    """One round-trip time in ms, or ``off``."""
    if text == "off":
        return None
    rtts = _rtts(text)
    if len(rtts) != 1:
        raise argparse.ArgumentTypeError(f"one round-trip time or 'off', got {text!r}")
    return rtts[0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--balance",
        choices=("first", "round_robin"),
        default="first",
        help="etcd.balance of every client: first (default: the member in the clients' "
        "own region takes every call, as docs/etcd.md advises across regions) or "
        "round_robin (calls spread over the three members)",
    )
    p.add_argument(
        "--rtts",
        type=_rtts,
        default=RTTS,
        help="injected round-trip times in ms (default 0,30,60,100)",
    )
    p.add_argument(
        "--switches",
        type=at_least(3, "count"),
        default=30,
        help="timed SWITCH writes per RTT (default 30)",
    )
    p.add_argument(
        "--pins",
        type=at_least(3, "count"),
        default=30,
        help="timed new-session pins per RTT (default 30)",
    )
    p.add_argument(
        "--keepalives",
        type=at_least(1, "count"),
        default=10,
        help="timed lease refreshes per RTT (default 10)",
    )
    p.add_argument(
        "--client-layout",
        choices=("colocated", "remote"),
        default="colocated",
        help="colocated: the clients share m0's region (its client link undelayed); "
        "remote: every client link pays the RTT (default colocated)",
    )
    p.add_argument(
        "--etcd-leader",
        choices=("remote", "local"),
        default="remote",
        help="remote: the raft leader is m1, in another region than the clients; local: "
        "m0, in theirs (moved there with etcdctl move-leader; default remote)",
    )
    p.add_argument(
        "--lab-flags-rtt",
        type=_one_rtt,
        default=100,
        help="also start the cluster with the lab's fast raft timings (heartbeat 10 ms, "
        "election 100 ms) at this RTT and count its elections (default 100; 'off': skip)",
    )
    p.add_argument(
        "--no-control-plane",
        dest="control_plane",
        action="store_false",
        help="skip the control-plane process (failover_detect_s_rttN)",
    )
    p.add_argument("--quiet", action="store_true", help="only the headline")


def run(args: argparse.Namespace) -> int:
    return main(lambda: _bench(args), (BenchError, StoreError))
