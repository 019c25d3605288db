"""``tectonic-epp`` (``python -m regions.picker``): Tectonic's endpoint picker for Envoy.

    tectonic-epp --topology topology.yaml --region us-east \\
        [--listen 127.0.0.1:9002] [--http-listen 127.0.0.1:9003] \\
        [--etcd 127.0.0.1:2379,...] [--control-plane 127.0.0.1:7000,...]

An Envoy external processor (ext_proc, gRPC) that follows the Gateway API Inference
Extension's endpoint picker protocol: for each request it names the model servers
Envoy sends it to, in order (``x-gateway-destination-endpoint``, header and
``envoy.lb`` metadata), by the gateway's rules: the session's pin in etcd, the
region's routing, prefix-aware bounded-load replica choice, the degradation ladder's
actuators (shedding answers 429, over-long contexts vLLM's 400), the spill to the
zone's next region when every replica of the session's region refuses before the
first byte (the session then moves there for good), and, with ``--admission``, the
gateway's admission control: per-replica in-flight limits steered by first-token
time and bounded by the measured capacity; over them a request waits at most
``--admission-max-wait`` (keep it under Envoy's ext_proc ``message_timeout``, past
which Envoy fails open), then gets 429 with Retry-After. A request for a pool at zero
(scale to zero) is held while the pool wakes, ``--wake-hold-max`` at most; the picker
first asks Envoy to wait that long (``override_message_timeout``), up to
``--max-message-timeout``, which Envoy's ``max_message_timeout`` must allow. Any number
of pickers serve one Envoy side by side: they share nothing but etcd (each admits on its
own: give each its share of the bound with ``--admission-max-inflight``). Envoy's
configuration: ``deploy/envoy/envoy.yaml``.

Serves ``grpc.health.v1`` (``liveness``, ``readiness`` and the ext_proc service name:
readiness is SERVING once this picker's caches are read) and, on ``--http-listen``,
``GET /metrics`` (the gateway's metric names) and ``GET /health``. Prints
``READY grpc://HOST:PORT`` once it serves; logs go to stderr. SIGTERM / SIGINT: turn
NOT_SERVING, finish the streams in flight, exit 0. A topology that disagrees with the
cluster spec in etcd (at start, or a new leader's later): exit 2, naming each setting.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import partial

from controlplane.kernel.logs import LogSettings, add_log_format_flag
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
from regions.dataplane.options import DataPlaneOptions
from regions.picker.extproc import BODY_BUFFERED, BODY_FULL_DUPLEX, BODY_NONE
from regions.picker.pick import PickerConfig
from regions.picker.server import PickerOptions, PickerServer
from regions.picker.service import HOLD_MARGIN_S, MAX_MESSAGE_TIMEOUT_S

BODY_MODES = {"buffered": BODY_BUFFERED, "full-duplex": BODY_FULL_DUPLEX, "none": BODY_NONE}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tectonic-epp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--topology", required=True, help="topology YAML (regions, replicas, etcd)")
    p.add_argument("--region", required=True, help="the region whose Envoy this picker serves")
    p.add_argument(
        "--listen", default="127.0.0.1:9002", help="ext_proc gRPC host:port (port 0 = any)"
    )
    p.add_argument("--http-listen", default="127.0.0.1:0", help="/metrics and /health host:port")
    p.add_argument(
        "--session-header",
        default="x-session-id",
        help="request header carrying the session id (else the body's 'user')",
    )
    p.add_argument(
        "--body-mode",
        choices=sorted(BODY_MODES),
        default="buffered",
        help="how Envoy sends bodies when its request does not say (Envoy 1.40 says: "
        "its ext_proc processing_mode decides); none = header-only (default buffered)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=1 << 20,
        help="larger request bodies get 413 (default 1 MiB)",
    )
    p.add_argument(
        "--max-endpoints",
        type=int,
        default=3,
        help="replicas of a region in one answer: the choice and its fallbacks (default 3)",
    )
    p.add_argument(
        "--no-spill",
        action="store_true",
        help="never end the list with the zone's next region (a session whose replicas "
        "all refuse gets Envoy's 503 instead of moving)",
    )
    add_etcd_flags(p)
    p.add_argument("--max-pins", type=int, default=100_000, help="session pins cached locally")
    p.add_argument("--grace", type=float, default=5.0, help="seconds to finish on SIGTERM")
    p.add_argument(
        "--max-message-timeout",
        type=float,
        default=MAX_MESSAGE_TIMEOUT_S,
        help="Envoy's ext_proc max_message_timeout, in seconds: the longest the picker asks "
        "Envoy to wait for an answer while it holds a request for a pool at zero; at "
        f"least --wake-hold-max + {HOLD_MARGIN_S:g} (default {MAX_MESSAGE_TIMEOUT_S:g}, as "
        "deploy/envoy/envoy.yaml)",
    )
    add_report_flags(p)
    add_prefix_flags(p)
    add_replica_flags(p)
    # under the 1 s message_timeout of deploy/envoy/envoy.yaml: a later answer fails open
    add_admission_flags(p, max_wait_s=0.5)
    p.add_argument("--log-level", default="INFO")
    add_log_format_flag(p)
    add_version_flag(p)
    return p


def parse_args(argv: Sequence[str] | None = None) -> tuple[PickerOptions, LogSettings]:
    p = _parser()
    args = p.parse_args(argv)
    routing = routing_options(
        p,
        args,
        DataPlaneOptions,
        listens=(args.listen, args.http_listen),
        positive=("max_endpoints",),
        admission=admission_options(p, args),
    )
    if args.wake_hold_max + HOLD_MARGIN_S > args.max_message_timeout:
        p.error(
            f"--max-message-timeout ({args.max_message_timeout:g} s) must be at least "
            f"--wake-hold-max + {HOLD_MARGIN_S:g} s ({args.wake_hold_max + HOLD_MARGIN_S:g} s): "
            "Envoy fails a longer hold open"
        )
    topology = routing.topology
    picker = PickerConfig(
        home=args.region,
        zones=topology.spill_groups(),
        entries={r.name: r.entry for r in topology.regions if r.entry},
        max_endpoints=args.max_endpoints,
        spill=not args.no_spill,
    )
    options = PickerOptions(
        routing=routing,
        listen=args.listen,
        http_listen=args.http_listen,
        body_mode=BODY_MODES[args.body_mode],
        picker=picker,
        grace_s=args.grace,
        max_message_timeout_s=args.max_message_timeout,
    )
    return options, LogSettings(str(args.log_level).upper(), args.log_format)


async def _run(options: PickerOptions) -> int:
    # Built inside the running loop: its gRPC channels (health reports) bind to it.
    return await serve(PickerServer(options), "endpoint picker")


def main(argv: Sequence[str] | None = None) -> None:
    options, logs = parse_args(argv)
    run_main(logs, partial(_run, options), "picker")


if __name__ == "__main__":
    main()
