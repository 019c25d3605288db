"""``python -m bench failover``: the headline figures of a failover, on real processes.

A real etcd, one simulator process per replica of three regions, one region agent
per region and two control-plane replica processes are started; then:

* **failover rounds** (``--rounds``, rotating over the regions): every simulator of
  one region is SIGKILLed. ``detect_s`` runs from that kill to the moment the bench's
  etcd watch sees ``regions/<r>/health`` put with ``verdict == UNHEALTHY``;
  ``switch_ms`` from that event to the watch event of the ``routing/<r>`` put that
  sends the region's traffic away. Then the simulators are restarted on the same
  ports and the bench waits until the region is NORMAL again.
* **leader rounds** (``--leader-rounds``): the leading control-plane process is
  SIGKILLed (no resign: its lease must expire). ``leader_resume_s`` runs from the
  kill to the first fenced write of the new leader: the first ``regions/*/health``
  put after the ``leader`` key's new put. The killed replica is restarted after.

All times are ``time.monotonic()`` of this process, taken when the watch event
arrives. One JSON object per round goes to stdout, then the headline object;
progress goes to stderr. Every process is killed on exit, also on Ctrl-C / SIGTERM.

The processes are ``bench.failover_deploy``, the rounds ``bench.failover_rounds``;
this module holds the options, the headline and the command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._common import (
    BenchError,
    Reporter,
    add_pools_flag,
    at_least,
    goals_and_met,
    main,
    percentile,
)
from bench.failover_deploy import (
    CLUSTER,
    CONTROL_PLANES,
    FAILURE_THRESHOLD,
    PROBE_INTERVAL_S,
    REGIONS,
    Deployment,
)
from bench.failover_rounds import Bench, FailoverRound, LeaderRound, Watcher
from chaos.lab.local_etcd import EtcdServer
from controlplane.kernel.config import ConfigError
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig


@dataclass(frozen=True)
class Goals:
    detect_s_p99: float = 4.0
    switch_ms_p99: float = 100.0
    resume_over_ttl: float = 1.0


GOALS = Goals()


@dataclass(frozen=True)
class Options:
    rounds: int = 5
    leader_rounds: int = 3
    lease_ttl_s: int = 5
    replicas: int = 1
    pools: int = 1  # model pools per region (docs/models.md); 1: regions without pools
    quiet: bool = False
    seed: int | None = None


# ---- figures ----------------------------------------------------------------------------


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def headline(
    opts: Options, fo: Sequence[FailoverRound], lr: Sequence[LeaderRound], runtime_s: float
) -> dict[str, object]:
    """The final line: percentiles over the rounds, the goals and whether each was met."""
    detect = [r.detect_s for r in fo]
    switch = [r.switch_ms for r in fo]
    detect_p99, switch_p99 = percentile(detect, 99), percentile(switch, 99)
    resume = percentile([r.leader_resume_s for r in lr], 99)
    over_ttl = None if resume is None else resume / (opts.lease_ttl_s + 2)
    return {
        "bench": "failover",
        "rounds": len({r.round for r in fo}),
        "pools": opts.pools,  # failing at once in each round
        "units_timed": len(fo),
        "detect_s_p50": _r(percentile(detect, 50)),
        "detect_s_p99": _r(detect_p99),
        "switch_ms_p50": _r(percentile(switch, 50)),
        "switch_ms_p99": _r(switch_p99),
        "leader_rounds": len(lr),
        "leader_resume_s": _r(resume),
        "lease_ttl_s": opts.lease_ttl_s,
        "resume_over_ttl": _r(over_ttl),
        "probe_interval_s": PROBE_INTERVAL_S,
        "failure_threshold": FAILURE_THRESHOLD,
        **goals_and_met(
            GOALS,
            {
                "detect_s_p99": detect_p99,
                "switch_ms_p99": switch_p99,
                "resume_over_ttl": over_ttl,
            },
        ),
        "runtime_s": round(runtime_s, 1),
    }


# ---- running ----------------------------------------------------------------------------


async def measure(
    dep: Deployment, opts: Options, out: Reporter, started: float
) -> dict[str, object]:
    store = EtcdStore(EtcdConfig(endpoints=(dep.etcd_endpoint,)))
    await store.connect()
    watcher = Watcher(store, Keys(CLUSTER))
    task = asyncio.create_task(watcher.run(), name="bench-watch")
    try:
        bench = Bench(dep, store, watcher, rng=random.Random(opts.seed))
        await bench.wait_steady()
        out.progress(f"deployment steady after {time.monotonic() - started:.1f} s")
        fo: list[FailoverRound] = []
        for n in range(1, opts.rounds + 1):
            for r in await bench.failover_round(n):
                fo.append(r)
                out.progress(r.line(opts.rounds))
                out.line({"round": n, **r.as_json()})
        lr: list[LeaderRound] = []
        for n in range(1, opts.leader_rounds + 1):
            lead = await bench.leader_round(n)
            lr.append(lead)
            out.progress(lead.line(opts.leader_rounds))
            out.line({"round": n, **lead.as_json()})
        return headline(opts, fo, lr, time.monotonic() - started)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


def run_bench(opts: Options, out: Reporter) -> dict[str, object]:
    started = time.monotonic()
    pooled = f" x {opts.pools} model pools" if opts.pools > 1 else ""
    out.progress(
        f"starting etcd, {len(REGIONS)} regions{pooled} x {opts.replicas} simulator(s), "
        f"an agent each, {len(CONTROL_PLANES)} control planes (lease {opts.lease_ttl_s} s)"
    )
    with tempfile.TemporaryDirectory(prefix="tectonic-bench-") as tmp, EtcdServer() as etcd:
        dep = Deployment(etcd.endpoint, Path(tmp), opts.lease_ttl_s, opts.replicas, opts.pools)
        try:
            dep.start()
            return asyncio.run(measure(dep, opts, out, started))
        except BenchError as e:
            raise BenchError(f"{e}\nlogs:\n{dep.log_tails()}") from None
        finally:
            dep.close()


_count = at_least(0, "_count")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=_count, default=5, help="failover rounds (default 5)")
    p.add_argument("--leader-rounds", type=_count, default=3, help="leader-kill rounds (default 3)")
    p.add_argument(
        "--lease-ttl",
        type=int,
        default=5,
        choices=range(2, 61),
        metavar="S",
        help="leader lease TTL in whole seconds, 2-60 (default 5)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        choices=range(1, 5),
        metavar="N",
        help="simulator replicas per region, 1-4 (default 1)",
    )
    add_pools_flag(
        p,
        "each has its own agent and simulators, and a round kills all of a region's pools "
        "at once: detection and switch are timed per pool",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the kill-time jitter")
    p.add_argument("--quiet", action="store_true", help="print only the final JSON line")


def run(args: argparse.Namespace) -> int:
    opts = Options(
        rounds=args.rounds,
        leader_rounds=args.leader_rounds,
        lease_ttl_s=args.lease_ttl,
        replicas=args.replicas,
        pools=args.pools,
        quiet=args.quiet,
        seed=args.seed,
    )
    out = Reporter(opts.quiet)
    return main(lambda: run_bench(opts, out), (BenchError, ConfigError))
