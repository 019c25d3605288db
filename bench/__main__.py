"""``python -m bench <name>``: benchmarks of a real Tectonic deployment.

Each bench lives in its own module (``bench/<name>.py``) with two functions,
``add_arguments(parser)`` and ``run(args) -> exit code`` (the ``BenchModule``
protocol), and is listed in ``BENCHES`` with a one-sentence summary for ``--help``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bench import (
    autoscale,
    capacity,
    cost,
    epp,
    etcd_rtt,
    failover,
    gateway,
    leader,
    overload,
    placement,
    prefixes,
    prewarm,
    recovery,
    scale,
    sessions,
    soak,
    store,
    surge,
    zero,
)
from controlplane.kernel.version import add_version_flag


class BenchModule(Protocol):
    def add_arguments(self, p: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True)
class BenchInfo:
    name: str
    module: BenchModule
    summary: str  # one sentence, shown by --help


BENCHES = (
    BenchInfo(
        "failover",
        failover,
        "Kill a region's vLLM servers and the leading control plane, on a real etcd and "
        "real processes: detection time, routing-switch time, leader-resume time.",
    ),
    BenchInfo(
        "leader",
        leader,
        "SIGKILL the control-plane leader at each step of a failover (before and during "
        "pre-warm, after the routing switch, during recovery): time until a new leader "
        "acts, against the lease TTL, and that no completed step is repeated.",
    ),
    BenchInfo(
        "soak",
        soak,
        "The gateways under sustained streaming load for minutes with a region blackout "
        "in the middle: requests lost before their first byte, retries, session "
        "consistency violations, memory growth.",
    ),
    BenchInfo(
        "store",
        store,
        "etcd's database under a lab's steady chat traffic while the leader compacts its "
        "history: growth per minute once compaction settles (with and without it), and "
        "the bytes each writer puts in etcd, read from etcd itself.",
    ),
    BenchInfo(
        "gateway",
        gateway,
        "Latency the gateway adds and throughput it keeps against the same simulator "
        "reached directly (etcd, a fast simulator and a gateway as processes; alternating "
        "blocks from one aiohttp client).",
    ),
    BenchInfo(
        "epp",
        epp,
        "The endpoint picker's cost behind a real Envoy: added latency, throughput and CPU "
        "per request of each process for Envoy direct (round robin), Envoy + picker "
        "(header-only, buffered and full-duplex body) and the Python gateway, against "
        "the same two simulators.",
    ),
    BenchInfo(
        "scale",
        scale,
        "The leader's tick at 32, 128 and 512 regions on a real etcd, every region's "
        "agent report pushed over gRPC each second: tick and decide() p99, and how long a "
        "dead region takes to be failed over.",
    ),
    BenchInfo(
        "sessions",
        sessions,
        "Sticky sessions at scale on a real etcd: the failover switch's p99 with 1,000 vs "
        "1,000,000 sessions pinned (it must stay O(1)).",
    ),
    BenchInfo(
        "etcd_rtt",
        etcd_rtt,
        "One etcd with three members whose peer and client links pay 0, 30, 60 and 100 ms "
        "of injected round trip (latency proxies): the failover switch's commit, a new "
        "session's pin (its first-token overhead), the leader lease and detection to switch.",
    ),
    BenchInfo(
        "prefixes",
        prefixes,
        "The pre-warm prefix tracker on a Zipf(1.1) workload of 2,048-token prompts, in one "
        "process: prompts per second through the gateway's hot path, recall of the merged "
        "sketch's top 1 % against exact counts, and the sketch's serialized size.",
    ),
    BenchInfo(
        "prewarm",
        prewarm,
        "Pre-warm on simulator replicas: how fast the executor warms every prefix and at "
        "what share of the prefill capacity (1, 2, 4 replays per replica), that its budget "
        "cuts it off on time, and the first requests' TTFT and prefix-cache hits warm vs cold.",
    ),
    BenchInfo(
        "recovery",
        recovery,
        "A region takes its traffic back after a failover with cold caches, through a real "
        "gateway on simulators under load: first-token p99 during graduated recovery and "
        "when restoring everything at once, each over the steady-state p99.",
    ),
    BenchInfo(
        "placement",
        placement,
        "Replica choice on two simulators with the same prompts (vllm bench serve, shared "
        "prefixes): first-token p50/p99, throughput and prefix hit rate through the "
        "gateway, plain round robin and vllm-router's cache-aware policy.",
    ),
    BenchInfo(
        "capacity",
        capacity,
        "The capacity probe on simulators of two configurations: its knee, ultimate and "
        "allowed load and cache effect (beta) against what the replica sustains (the "
        "simulator's scheduler modelled in steady state, checked against a minute of the "
        "real simulator), the probe's duration and T_recover.",
    ),
    BenchInfo(
        "overload",
        overload,
        "Twice the allowed load (from a queue model of the simulators) through a real "
        "gateway for 60 s, with and without admission control: goodput within the SLO, "
        "first-token p99 of admitted requests, and the share refused, interactive vs batch.",
    ),
    BenchInfo(
        "autoscale",
        autoscale,
        "The reference ramp (12 -> 240 requests/s in 90 s) and a hit-rate collapse against "
        "HPA, KEDA, NVIDIA Dynamo's planner, Tectonic (reactive and forecast) and an oracle, "
        "each policy's own code on a discrete-event model of the simulator's engine checked "
        "against real simulators: first-token p99, SLO attainment, replica-seconds and cost.",
    ),
    BenchInfo(
        "cost",
        cost,
        "The reference ramp with a pool budget that binds at its peak, interactive and "
        "batch traffic: the real scaler caps at the budget and the real ladder sheds batch: "
        "spend over the budget (from the replicas' states), interactive SLO attainment, "
        "the batch share shed, against the same run without a budget; and a failover onto "
        "the pool, which may spend past its budget for its allowance only.",
    ),
    BenchInfo(
        "surge",
        surge,
        "A loaded region fails over into a target that needs twice its ACTIVE replicas, on "
        "simulator warm pools: first-minute first-token p99 over before, with failover-aware "
        "scaling and with scaling off, and how long the extra replicas take to go after "
        "recovery.",
    ),
    BenchInfo(
        "zero",
        zero,
        "A pool scaled to zero receives requests, on simulator warm pools: first token "
        "through the gateway and through the endpoint picker, the wake's duration, and the "
        "requests refused while it woke.",
    ),
)

EPILOG = """examples:
  python -m bench failover                 # 5 failover + 3 leader-kill rounds
  python -m bench failover --rounds 10 --quiet
  python -m bench failover --help          # options of one bench

Each bench prints one JSON object per round on stdout and a headline object last;
progress goes to stderr. See bench/README.md for what the figures mean."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmarks of a real Tectonic deployment (etcd, simulators, agents, "
        "control-plane replicas as processes).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_flag(p)
    sub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for info in BENCHES:
        # argparse %-formats help strings ("top 1 %" would read as a format code)
        sp = sub.add_parser(
            info.name, help=info.summary.replace("%", "%%"), description=info.summary
        )
        info.module.add_arguments(sp)
        sp.set_defaults(run=info.module.run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
