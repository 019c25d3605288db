"""The drill service's command line: serve the schedule, run one drill now (``--run``)
or print the history (``--history``). What a drill acts on comes from the caller, a
``RunDrill`` loaded only when drills are to run: ``python -m chaos`` (chaos/__main__.py)
offers the local lab's (the default) and a cluster's (``--target kubernetes``).

    .venv/bin/python -m chaos --schedule chaos/schedule.yaml \\
        --etcd 127.0.0.1:2379 --cluster demo
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from chaos.capacity.service import CapacityProber
from chaos.drills import requests as requests
from chaos.drills.lock import DrillBusy
from chaos.drills.scenario import SCENARIO_DIR, load_all
from chaos.drills.schedule import SCHEDULE_FILE, load_schedule
from chaos.drills.service import MANUAL, DrillService, RunDrill, default_holder, history
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.config import ConfigError, load_topology
from controlplane.kernel.drills import CAPACITY_PROBE, CAPACITY_PROBE_MAX_S
from controlplane.kernel.keys import Keys
from controlplane.kernel.logs import add_log_format_flag, configure_logging
from controlplane.kernel.store.port import StoreError
from controlplane.kernel.store.settings import EtcdConfig
from controlplane.kernel.version import add_version_flag

# a target's name -> what builds its RunDrill from the command line (imported only when
# drills are to run)
RunnerLoader = Callable[[argparse.Namespace], RunDrill]


def _parser(targets: Sequence[str] = ("lab",)) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Run the scheduled chaos drills (one at a time, inside their windows) "
        "and keep their history in etcd.",
        epilog="Check the schedule first: python -m chaos.drills.schedule next chaos/schedule.yaml",
    )
    p.add_argument("--schedule", type=Path, default=SCHEDULE_FILE, help="default: %(default)s")
    add_log_format_flag(p)
    p.add_argument(
        "--topology",
        type=Path,
        help="the deployment's topology file: its cluster name and "
        "etcd settings (endpoints, TLS, users); --etcd and --cluster override them",
    )
    p.add_argument("--etcd", help="host:port[,host:port...] (default 127.0.0.1:2379)")
    p.add_argument("--cluster", help="deployment name in etcd keys (default: default)")
    p.add_argument("--scenarios", type=Path, help="scenario directory (default chaos/scenarios)")
    p.add_argument("--tick-s", type=float, default=30.0, help="how often to look (default 30)")
    p.add_argument("--lock-ttl-s", type=int, default=15, help="lease of the drill lock")
    p.add_argument("--holder", help="id in the lock and history (default drills-HOST-PID)")
    p.add_argument("--history", type=int, metavar="N", help="print the last N drills and exit")
    p.add_argument("--run", metavar="SCENARIO", help="run this drill once now and exit")
    p.add_argument("--region", help="with --run: target region (default the scenario's)")
    p.add_argument(
        "--replica",
        metavar="URL",
        help=f"with --run {CAPACITY_PROBE}: the replica to probe (not in rotation); "
        "default: a WARM one of the region's warm pool",
    )
    p.add_argument(
        "--reports",
        type=Path,
        default=Path("drill-reports"),
        help="where capacity probes write their reports (default %(default)s)",
    )
    p.add_argument(
        "--probe-step-s",
        type=float,
        default=5.0,
        help="seconds per step of a capacity probe (default %(default)s)",
    )
    p.add_argument(
        "--target",
        choices=targets,
        default=targets[0],
        help="what the drills act on: %(choices)s (default %(default)s: a local lab of "
        "real processes; kubernetes: the cluster's pods, see --target-config)",
    )
    p.add_argument(
        "--target-config",
        type=Path,
        metavar="FILE",
        help="with --target kubernetes: where each region's pods are (chaos/kube/service.py)",
    )
    add_version_flag(p)
    return p


async def _main(args: argparse.Namespace, load_runner: RunnerLoader) -> int:
    topo = load_topology(args.topology) if args.topology else None
    keys = Keys(cluster=args.cluster or (topo.cluster if topo else "default"))
    config = topo.etcd if topo else EtcdConfig(endpoints=("127.0.0.1:2379",))
    if args.etcd:
        config = config.model_copy(
            update={"endpoints": tuple(e.strip() for e in args.etcd.split(","))}
        )
    from controlplane.kernel.store.etcd import EtcdStore  # the adapter, only for the process

    # before etcd: a target file that does not load is refused before anything starts
    run_drill = load_runner(args) if args.history is None else None
    async with EtcdStore(config) as store:
        if run_drill is None:  # --history
            for row in await history(store, keys, args.history):
                print(row.model_dump_json())
            return 0
        directory = args.scenarios or SCENARIO_DIR
        scenarios = load_all(directory) if directory.is_dir() else []
        durations = {s.name: s.abort.max_duration_s for s in scenarios}
        holder = args.holder or default_holder()
        # A capacity probe needs each region's SLA and factor of safety: the topology's.
        prober = (
            CapacityProber(
                store, keys, topo, holder=holder, reports=args.reports, step_s=args.probe_step_s
            )
            if topo is not None
            else None
        )
        if durations:  # without --topology a scheduled probe fails, saying so
            durations[CAPACITY_PROBE] = CAPACITY_PROBE_MAX_S
        schedule = load_schedule(args.schedule, durations or None)
        service = DrillService(
            store,
            keys,
            schedule,
            run_drill,
            SystemClock(),
            holder=holder,
            tick_s=args.tick_s,
            lock_ttl_s=args.lock_ttl_s,
            default_regions={s.name: s.region for s in scenarios},
            scenarios=requests.scenario_infos(scenarios),
            probe=prober,
        )
        task = asyncio.current_task()
        if task is not None:  # SIGTERM: stop like Ctrl-C (the drill's rollbacks run)
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        if args.run:
            summary = await service.run_once(args.run, args.region, MANUAL, replica=args.replica)
            print(summary.model_dump_json())
            return 0 if summary.passed else 1
        await service.serve()
    return 0


def main(loaders: Mapping[str, RunnerLoader], argv: Sequence[str] | None = None) -> int:
    """``loaders``: the targets this entry point offers, the default first."""
    args = _parser(tuple(loaders)).parse_args(argv)
    load_runner = loaders[args.target]
    configure_logging(logging.INFO, args.log_format, "drills")
    try:
        return asyncio.run(_main(args, load_runner))
    except (ConfigError, DrillBusy, StoreError) as e:
        print(str(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
