"""``python -m regions.gateway``: the session-affine, OpenAI-compatible gateway.

    python -m regions.gateway --topology topology.yaml --region us-east \\
        --listen 127.0.0.1:8080 [--session-header x-session-id] \\
        [--max-body-bytes 1048576] [--etcd 127.0.0.1:2379,...] \\
        [--control-plane 127.0.0.1:7000,...]

Forwards ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming or
not) and ``GET /v1/models`` to the replicas of the region that serves each session:
the ACTIVE replicas its agent's warm pool publishes in ``pools/<region>``, else the
topology's ``regions[].replicas``; ``GET /health`` and ``GET /metrics`` are the
gateway's own. With ``--control-plane`` it also reports, per region, what its
requests saw (``ReportHealth``, kind GATEWAY). Prints ``READY http://HOST:PORT`` on
stdout once it serves; logs go to stderr. SIGTERM / SIGINT: stop accepting, finish
requests in flight, exit 0.

Pre-warm: the gateway counts every request's prompt prefixes (model, text, token ids
or chat messages, cache_salt) in a mergeable sketch and writes it every
prefixes.export_interval_s to etcd (prefix-exports/<id>, on a lease of 3 intervals),
where the control-plane leader merges all gateways into prefixes/<region>. The
fingerprint parameters, K and the routing prefix length come from the topology's
``prefixes`` section only, which the leader reads too: at start the gateway compares
its topology with the cluster spec the leader published in etcd (``spec``) and refuses
to start, naming each setting, when they disagree (exit 2). It follows the spec while
it runs: when a new leader publishes one that disagrees, it logs an ERROR naming each
setting, stops as on SIGTERM and exits 2, for its supervisor to restart it on the new
topology. Flags set only what is this gateway's own: its identity, listen address,
timeouts and local resources.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence

import uvloop
from pydantic import ValidationError

from controlplane.kernel.cluster_spec import SpecDisagreement
from controlplane.kernel.config import HOST_PORT, ConfigError, PrefixesConfig, load_topology
from regions.gateway.app import AppConfig
from regions.gateway.continuation import ContinuationConfig
from regions.gateway.prefix_export import ExportOptions, tracker_config
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
    _add_timeout_flags(p)
    p.add_argument("--max-pins", type=int, default=100_000, help="session pins cached locally")
    p.add_argument("--grace", type=float, default=5.0, help="seconds to finish on SIGTERM")
    _add_report_flags(p)
    p.add_argument(
        "--no-warm-first",
        dest="warm_first",
        action="store_false",
        help="while routing splits the home region's traffic (graduated recovery), place "
        "new sessions by weight only, even where home is still cold for their prompt; "
        "and do not replay, when a region serves again, the prompts it answered before "
        "(default: both on; see regions/gateway/warmth.py)",
    )
    _add_prefix_flags(p)
    _add_continuation_flags(p)
    p.add_argument("--log-level", default="INFO")
    return p


def _add_continuation_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "stream continuation",
        "A streamed completion whose replica fails after the first byte is continued on "
        "another replica of its region, or of the session's next region, from what the "
        "client already has (regions/gateway/continuation.py). A request turns it off "
        "with the header 'x-tectonic-continue: off'.",
    )
    g.add_argument(
        "--no-stream-continuation",
        dest="stream_continuation",
        action="store_false",
        help="leave every cut stream visible to its client (an in-band error event)",
    )
    g.add_argument(
        "--max-continuations",
        type=int,
        default=2,
        metavar="N",
        help="continuations one request may get (default 2)",
    )
    g.add_argument(
        "--continuation-deadline",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="no continuation starts later than this after the cut (default 30)",
    )


def _add_timeout_flags(p: argparse.ArgumentParser) -> None:
    """etcd and the replicas: how long the gateway waits, and when it stops retrying."""
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


def _add_report_flags(p: argparse.ArgumentParser) -> None:
    """Health reports to the control plane: what this gateway's requests saw."""
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


def _add_prefix_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "prefix tracking (pre-warm)",
        "The fingerprint settings, K and the routing length live in the topology's "
        "prefixes section only (every gateway and the control-plane leader must agree); "
        "these flags set this gateway's own resources.",
    )
    g.add_argument(
        "--no-prefix-tracking",
        action="store_true",
        help="count no prefixes and export nothing (failovers then warm nothing)",
    )
    g.add_argument(
        "--prefix-session-key-file",
        metavar="PATH",
        default="",
        help="file holding the key that hashes session ids in exports (the same on every "
        "gateway); default: $TECTONIC_PREFIX_SESSION_KEY, else unkeyed",
    )
    g.add_argument(
        "--prefix-export-interval",
        metavar="SECONDS",
        type=float,
        help="seconds between exports to etcd; default: prefixes.export_interval_s (10)",
    )
    g.add_argument(
        "--prefix-export-max-bytes",
        metavar="BYTES",
        type=int,
        help="exports are cut to this size, lowest-ranked prefixes first; default: "
        "prefixes.export_max_bytes (512 KiB)",
    )


def _prefix_options(
    p: argparse.ArgumentParser, args: argparse.Namespace, base: PrefixesConfig
) -> tuple[PrefixesConfig, str]:
    """The topology's prefixes section with the export flags applied, and the session
    key."""
    flags = {  # config field -> flag
        "export_interval_s": "prefix_export_interval",
        "export_max_bytes": "prefix_export_max_bytes",
    }
    given = {k: getattr(args, a) for k, a in flags.items() if getattr(args, a) is not None}
    try:
        prefixes = PrefixesConfig.model_validate({**base.model_dump(), **given})
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            name = "--" + flags[field].replace("_", "-") if field in flags else "--prefix-*"
            problems.append(f"{name}: {err['msg'].removeprefix('Value error, ')}")
        p.error("; ".join(problems))
    key = os.environ.get("TECTONIC_PREFIX_SESSION_KEY", "")
    if args.prefix_session_key_file:
        try:
            with open(args.prefix_session_key_file, encoding="utf-8") as f:
                key = f.read().strip()
        except OSError as e:
            p.error(f"--prefix-session-key-file: {e.strerror}: {args.prefix_session_key_file}")
    return prefixes, key


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
    if args.continuation_deadline <= 0:
        p.error("--continuation-deadline must be positive")
    for name in ("max_body_bytes", "max_pins", "max_continuations"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    prefixes, session_key = _prefix_options(p, args, topology.prefixes)
    options = GatewayOptions(
        topology=topology,
        app=AppConfig(
            home=args.region,
            session_header=args.session_header.lower(),
            max_body_bytes=args.max_body_bytes,
            prefix_chars=topology.prefixes.routing_chars,
            warm_first=args.warm_first,
            continuation=ContinuationConfig(
                enabled=args.stream_continuation,
                max_continuations=args.max_continuations,
                deadline_s=args.continuation_deadline,
            ),
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
        prefix_tracking=not args.no_prefix_tracking,
        tracker=tracker_config(prefixes, session_key),
        prefix_export=ExportOptions.from_topology(prefixes),
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
    if isinstance(exc := starting.exception(), SpecDisagreement):
        return await _refuse(server, exc)
    if exc is not None:
        log.error("gateway failed to start", exc_info=exc)
        await server.stop()
        return 1
    print(f"READY {server.url}", flush=True)
    runner = asyncio.create_task(server.wait())
    done, _ = await asyncio.wait({waiter, runner}, return_when=asyncio.FIRST_COMPLETED)
    if waiter in done:
        log.info("signal received; shutting down")
    elif isinstance(exc := runner.exception(), SpecDisagreement):  # a new leader's spec
        waiter.cancel()
        return await _refuse(server, exc)
    await server.stop()
    waiter.cancel()
    await asyncio.wait({waiter, runner})
    if runner in done and not runner.cancelled() and runner.exception() is not None:
        log.error("gateway tasks failed", exc_info=runner.exception())
        return 1
    return 0


async def _refuse(server: GatewayServer, disagreement: SpecDisagreement) -> int:
    """A topology that disagrees with the cluster spec: a configuration mistake, not a
    crash. Stop as on SIGTERM, and exit 2 with the message, which names each setting."""
    print(f"error: {disagreement}", file=sys.stderr, flush=True)
    await server.stop()
    return 2


def main(argv: Sequence[str] | None = None) -> None:
    options, level = parse_args(argv)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sys.exit(uvloop.run(_run(options)))


if __name__ == "__main__":
    main()
