"""``python -m controlplane``: run one control-plane replica against etcd."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

from controlplane.kernel.config import ConfigError, Topology, load_topology, parse_topology
from controlplane.kernel.ladder.file import topology_ladder
from controlplane.kernel.ladder.model import Ladder
from controlplane.kernel.logs import add_log_format_flag, configure_logging
from controlplane.kernel.tracing import add_otlp_flag, configure_tracing
from controlplane.kernel.version import add_version_flag
from controlplane.prewarm import Prewarmer

EXAMPLES = """examples:
  python -m controlplane --topology examples/topology.yaml --id cp-1 --listen 127.0.0.1:50051
  python -m controlplane --topology examples/topology.yaml --http-listen 127.0.0.1:8081
      # also serve /healthz /readyz /metrics /v1/* and the dashboard at http://127.0.0.1:8081/
  python -m controlplane --topology examples/topology.yaml --check   # validate and exit
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m controlplane",
        description="Tectonic control-plane replica: tracks region health, elects a leader "
        "through etcd, and fails regions over. Run several replicas for high availability.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--topology", required=True, help="topology YAML (regions, timing, etcd)")
    p.add_argument(
        "--id",
        default=f"{socket.gethostname()}-{os.getpid()}",
        help="replica id, unique per replica (default: host-pid)",
    )
    p.add_argument("--listen", default="127.0.0.1:50051", help="gRPC listen address")
    p.add_argument(
        "--http-listen",
        default="",
        metavar="HOST:PORT",
        help="also serve the HTTP API and dashboard here (port 0: any free port; "
        "the log says which); off by default. With security.tokens every path but "
        "/healthz, /readyz and /metrics needs a bearer token; without a security: section "
        "only a loopback host is accepted",
    )
    p.add_argument(
        "--http-metrics-auth",
        action="store_true",
        help="/metrics needs a bearer token too (with security.tokens; Prometheus: "
        "authorization with a viewer token)",
    )
    p.add_argument(
        "--insecure-listen-any",
        action="store_true",
        help="let --http-listen bind a non-loopback address without a security: section: "
        "the HTTP API is then open to anyone who reaches it (logged as a warning at each "
        "start)",
    )
    p.add_argument(
        "--etcd", default="", help="comma-separated etcd endpoints, overriding the topology file"
    )
    p.add_argument("--check", action="store_true", help="validate the topology and exit")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    add_log_format_flag(p)
    add_otlp_flag(p)
    add_version_flag(p)
    return p


def _summary(t: Topology) -> str:
    lines = [f"cluster {t.cluster}: {len(t.regions)} regions, etcd {', '.join(t.etcd.endpoints)}"]
    for r in t.regions:
        lines.append(
            f"  {r.name:<16} zone={r.zone:<8} agent={r.agent:<22} "
            f"capacity={r.capacity_rps:g} rps failover_to={list(r.failover_to) or 'zone'}"
        )
    tm = t.timing
    lines.append(
        f"  detect: {tm.failure_threshold} x {tm.probe_interval_s:g}s, quorum "
        f"{tm.quorum}; lease {tm.lease_ttl_s}s; cooldown {tm.failover_cooldown_s:g}s"
    )
    return "\n".join(lines)


async def _run(
    t: Topology,
    replica_id: str,
    listen: str,
    http_listen: str | None,
    ladder: Ladder | None,
    prewarmer: Prewarmer | None,
    *,
    http_metrics_auth: bool = False,
    insecure_listen_any: bool = False,
) -> None:
    from controlplane.kernel.store.etcd import EtcdStore
    from controlplane.server import ControlPlaneReplica

    store = EtcdStore(t.etcd)
    await store.connect()
    replica = ControlPlaneReplica(
        topology=t,
        store=store,
        replica_id=replica_id,
        listen=listen,
        http_listen=http_listen,
        ladder=ladder,
        prewarmer=prewarmer,
        http_metrics_auth=http_metrics_auth,
        insecure_listen_any=insecure_listen_any,
    )
    task = asyncio.create_task(replica.run())
    started = asyncio.create_task(replica.started.wait())
    await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
    if replica.started.is_set():
        # Launchers (tests, the demo) wait for this line instead of polling.
        print(f"READY {listen.rsplit(':', 1)[0]}:{replica.port}", flush=True)
    started.cancel()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        pass
    finally:
        await store.close()


def main(argv: list[str] | None = None, *, prewarmer: Callable[[], Prewarmer] | None = None) -> int:
    """``prewarmer``: a seam for the test lab (chaos/lab/controlplane.py), which makes
    the pre-warmer a replica runs; None: the real one."""
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format, "controlplane")
    try:
        t = load_topology(args.topology)
        if args.etcd:
            data = t.model_dump()
            data["etcd"]["endpoints"] = args.etcd.split(",")
            t = parse_topology(data, "--etcd")
        ladder = topology_ladder(t, args.topology)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.http_listen:
        from controlplane.api.http_auth import bind_refusal

        refusal = bind_refusal(args.http_listen, t.security, args.insecure_listen_any)
        if refusal is not None:
            print(f"error: {refusal}", file=sys.stderr)
            return 2
    if args.check:
        print(_summary(t))
        return 0
    logging.getLogger("tectonic").info("starting\n%s", _summary(t))
    if ladder is not None:
        logging.getLogger("tectonic").info(
            "degradation ladder %s: %s", t.degradation_ladder, " -> ".join(ladder.names)
        )
    pre = prewarmer() if prewarmer is not None else None
    provider = configure_tracing("controlplane", args.otlp_endpoint)
    # What is loaded by now (modules, schemas, the topology) lives as long as the
    # process: out of the collector's sight, a full collection is ~15 ms shorter, a
    # pause that landed inside ticks at 512 pools
    gc.freeze()
    try:
        asyncio.run(
            _run(
                t,
                args.id,
                args.listen,
                args.http_listen or None,
                ladder,
                pre,
                http_metrics_auth=args.http_metrics_auth,
                insecure_listen_any=args.insecure_listen_any,
            )
        )
    finally:
        if provider is not None:
            provider.shutdown()  # the spans still buffered
    return 0


if __name__ == "__main__":
    sys.exit(main())
