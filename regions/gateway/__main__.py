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
import logging
from collections.abc import Sequence
from functools import partial

from controlplane.kernel.logs import LogSettings, add_log_format_flag
from controlplane.kernel.tracing import add_otlp_flag
from controlplane.kernel.version import add_version_flag
from regions.dataplane.cli_common import (
    add_admission_flags,
    add_etcd_flags,
    add_prefix_flags,
    add_replica_flags,
    add_report_flags,
    admission_options,
    routing_options,
    run_main,
    serve,
)
from regions.dataplane.replay_headers import add_replay_key_flag, replay_key
from regions.gateway.app import AppConfig
from regions.gateway.continuation import ContinuationConfig
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
    add_etcd_flags(p)
    _add_proxy_flags(p)
    p.add_argument("--max-pins", type=int, default=100_000, help="session pins cached locally")
    p.add_argument("--grace", type=float, default=5.0, help="seconds to finish on SIGTERM")
    add_report_flags(p)
    p.add_argument(
        "--no-warm-first",
        dest="warm_first",
        action="store_false",
        help="while routing splits the home region's traffic (graduated recovery), place "
        "new sessions by weight only, even where home is still cold for their prompt; "
        "and do not replay, when a region serves again, the prompts it answered before "
        "(default: both on; see regions/gateway/warmth.py)",
    )
    add_prefix_flags(p)
    add_replica_flags(p)
    _add_continuation_flags(p)
    add_admission_flags(p)
    p.add_argument("--log-level", default="INFO")
    add_log_format_flag(p)
    add_replay_key_flag(p, "warm-first replays (user credentials are stripped from what is kept)")
    add_otlp_flag(p)
    add_version_flag(p)
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


def _add_proxy_flags(p: argparse.ArgumentParser) -> None:
    """The replicas: when the gateway stops retrying, how long it waits."""
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


def parse_args(argv: Sequence[str] | None = None) -> tuple[GatewayOptions, LogSettings]:
    """The gateway's options and the log level."""
    p = _parser()
    args = p.parse_args(argv)
    if args.continuation_deadline <= 0:
        p.error("--continuation-deadline must be positive")
    app = AppConfig(
        home=args.region,
        warm_first=args.warm_first,
        continuation=ContinuationConfig(
            enabled=args.stream_continuation,
            max_continuations=args.max_continuations,
            deadline_s=args.continuation_deadline,
        ),
    )
    options = routing_options(
        p,
        args,
        GatewayOptions,
        listens=(args.listen,),
        positive=("max_continuations",),
        app=app,
        listen=args.listen,
        proxy=ProxyConfig(retry_deadline_s=args.retry_deadline, read_timeout_s=args.read_timeout),
        grace_s=args.grace,
        admission=admission_options(p, args),
        replay_api_key=replay_key(p, args),
    )
    return options, LogSettings(str(args.log_level).upper(), args.log_format, args.otlp_endpoint)


async def _run(options: GatewayOptions) -> int:
    # Built inside the running loop: its gRPC channels (health reports) bind to it.
    return await serve(GatewayServer(options), "gateway")


def main(argv: Sequence[str] | None = None) -> None:
    options, logs = parse_args(argv)
    run_main(logs, partial(_run, options), "gateway")


if __name__ == "__main__":
    main()
