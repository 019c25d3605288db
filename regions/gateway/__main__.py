"""``python -m regions.gateway``: the session-affine, OpenAI-compatible gateway.

    python -m regions.gateway --topology topology.yaml --region us-east \\
        --listen 127.0.0.1:8080 [--session-header x-session-id] \\
        [--max-body-bytes 1048576] [--etcd 127.0.0.1:2379,...] \\
        [--control-plane 127.0.0.1:7000,...]

Forwards ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming or
not) and ``GET /v1/models`` to the replicas (``regions[].replicas`` in the topology)
of the region that serves each session; ``GET /health`` and ``GET /metrics`` are the
gateway's own. With ``--control-plane`` it also reports, per region, what its
requests saw (``ReportHealth``, kind GATEWAY). Prints ``READY http://HOST:PORT`` on
stdout once it serves; logs go to stderr. SIGTERM / SIGINT: stop accepting, finish
requests in flight, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import signal
import sys
from collections.abc import Sequence

from controlplane.config import HOST_PORT, ConfigError, load_topology
from regions.gateway.app import AppConfig
from regions.gateway.proxy import ProxyConfig
from regions.gateway.server import GatewayOptions, GatewayServer

log = logging.getLogger("tectonic.gateway")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m regions.gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--topology", required=True, help="topology YAML (regions, replicas, etcd)")
    p.add_argument("--region", required=True, help="home region: where new sessions start")
    p.add_argument("--listen", default="127.0.0.1:8080", help="host:port (port 0 = any)")
    p.add_argument(
        "--session-header",
        default="x-session-id",
        help="request header carrying the session id (else the body's 'user')",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=1 << 20,
        help="larger request bodies get 413 (default 1 MiB)",
    )
    p.add_argument("--etcd", default="", help="host:port[,host:port...]; default: topology's")
    p.add_argument(
        "--etcd-timeout",
        type=float,
        default=0.5,
        help="seconds per etcd request (retried within twice this)",
    )
    p.add_argument(
        "--store-timeout",
        type=float,
        default=1.0,
        help="seconds a request waits for etcd before serving from the cache",
    )
    p.add_argument(
        "--retry-deadline",
        type=float,
        default=10.0,
        help="no retry on another replica starts later than this after arrival",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=300.0,
        help="seconds a replica may stay silent (headers or between chunks)",
    )
    p.add_argument(
        "--prefix-chars",
        type=int,
        default=256,
        help="prompt characters that pick the replica (prefix-aware hashing)",
    )
    p.add_argument("--max-pins", type=int, default=100_000, help="session pins cached locally")
    p.add_argument("--grace", type=float, default=5.0, help="seconds to finish on SIGTERM")
    p.add_argument(
        "--control-plane",
        action="append",
        default=[],
        help="host:port[,host:port...] of control-plane replicas; when given, the "
        "gateway reports what its requests saw per region (kind GATEWAY)",
    )
    p.add_argument(
        "--observer-id",
        default="",
        help="observer name in those reports (default gateway:<home>:<port>)",
    )
    p.add_argument(
        "--report-interval", type=float, default=1.0, help="seconds between health reports"
    )
    p.add_argument("--log-level", default="INFO")
    return p


def parse_args(argv: Sequence[str] | None = None) -> tuple[GatewayOptions, str]:
    """The gateway's options and the log level."""
    p = _parser()
    args = p.parse_args(argv)
    try:
        topology = load_topology(args.topology)
    except ConfigError as e:
        p.error(str(e))
    if args.region not in topology.names:
        p.error(
            f"--region {args.region!r} is not in the topology "
            f"(regions: {', '.join(topology.names)})"
        )
    endpoints = tuple(e.strip() for e in args.etcd.split(",") if e.strip())
    cps = tuple(e.strip() for arg in args.control_plane for e in arg.split(",") if e.strip())
    bad = [e for e in (*endpoints, *cps, args.listen) if not _host_port(e)]
    if bad:
        p.error(f"expected host:port, got {bad}")
    if args.observer_id and not re.match(r"^[A-Za-z0-9][A-Za-z0-9:._@-]{0,127}$", args.observer_id):
        p.error("--observer-id: 1-128 of letters, digits and ':._@-', starting alphanumeric")
    for name in ("max_body_bytes", "prefix_chars", "max_pins"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    options = GatewayOptions(
        topology=topology,
        app=AppConfig(
            home=args.region,
            session_header=args.session_header.lower(),
            max_body_bytes=args.max_body_bytes,
            prefix_chars=args.prefix_chars,
        ),
        listen=args.listen,
        etcd_endpoints=endpoints,
        etcd_timeout_s=args.etcd_timeout,
        store_timeout_s=args.store_timeout,
        max_pins=args.max_pins,
        proxy=ProxyConfig(retry_deadline_s=args.retry_deadline, read_timeout_s=args.read_timeout),
        grace_s=args.grace,
        control_planes=cps,
        observer_id=args.observer_id,
        report_interval_s=args.report_interval,
    )
    return options, str(args.log_level).upper()


def _host_port(value: str) -> bool:
    return re.match(HOST_PORT, value) is not None


async def _run(options: GatewayOptions) -> int:
    server = GatewayServer(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.create_task(server.start())
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # stopped while waiting for etcd
        starting.cancel()
        await asyncio.wait({starting})
        await server.stop()
        return 0
    if starting.exception() is not None:
        log.error("gateway failed to start", exc_info=starting.exception())
        await server.stop()
        return 1
    print(f"READY {server.url}", flush=True)
    runner = asyncio.create_task(server.wait())
    done, _ = await asyncio.wait({waiter, runner}, return_when=asyncio.FIRST_COMPLETED)
    if waiter in done:
        log.info("signal received; shutting down")
    await server.stop()
    waiter.cancel()
    await asyncio.wait({waiter, runner})
    if runner in done and not runner.cancelled() and runner.exception() is not None:
        log.error("gateway tasks failed", exc_info=runner.exception())
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    options, level = parse_args(argv)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sys.exit(asyncio.run(_run(options)))


if __name__ == "__main__":
    main()
