"""What the gateway's and the endpoint picker's command lines share: the etcd, health
report, prefix tracking, replica and admission control flags, the data plane's
options read from them (``routing_options``), and the life of the server process
(READY, SIGTERM, exit 2 on a topology that disagrees with the cluster spec). Each
command line adds its own flags and options (``regions/gateway/__main__.py``,
``regions/picker/__main__.py``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import uvloop
from pydantic import ValidationError

from controlplane.kernel.cluster_spec import SpecDisagreement
from controlplane.kernel.config import ConfigError, PrefixesConfig, load_topology
from controlplane.kernel.logs import LogSettings, configure_logging
from controlplane.kernel.store.settings import HOST_PORT
from controlplane.kernel.tracing import configure_tracing
from regions.dataplane.admission_bound import BoundAt
from regions.dataplane.admission_gate import AdmissionOptions
from regions.dataplane.options import DataPlaneOptions, RequestConfig
from regions.dataplane.payload_keys import add_payload_keys_flag, payload_keys
from regions.dataplane.prefix_export import ExportOptions, tracker_config

log = logging.getLogger("tectonic.gateway")


OBSERVER_ID = r"^[A-Za-z0-9][A-Za-z0-9:._@-]{0,127}$"
Options = TypeVar("Options", bound=DataPlaneOptions)


def routing_options(
    p: argparse.ArgumentParser,
    args: argparse.Namespace,
    options: type[Options],
    *,
    listens: Sequence[str],
    positive: Sequence[str],
    **more: Any,
) -> Options:
    """The options both command lines read alike (topology, region, etcd, health
    reports, prefix tracking, pins), checked, as ``options`` (DataPlaneOptions or the
    caller's extension of it): ``listens`` are host:port flags too, ``positive`` the
    names of flags that must be at least 1; ``more`` the caller's own fields (``app``'s
    are completed with the shared ones; default: a RequestConfig)."""
    try:
        topology = load_topology(args.topology)
    except ConfigError as e:
        p.error(str(e))
    if args.region not in topology.sites:
        p.error(
            f"--region {args.region!r} is not in the topology "
            f"(regions: {', '.join(topology.sites)})"
        )
    endpoints = tuple(e.strip() for e in args.etcd.split(",") if e.strip())
    cps = tuple(e.strip() for arg in args.control_plane for e in arg.split(",") if e.strip())
    bad = [e for e in (*endpoints, *cps, *listens) if not host_port(e)]
    if bad:
        p.error(f"expected host:port, got {bad}")
    if args.observer_id and not re.match(OBSERVER_ID, args.observer_id):
        p.error("--observer-id: 1-128 of letters, digits and ':._@-', starting alphanumeric")
    for name in ("max_body_bytes", "max_pins", *positive):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if not 0 < args.wake_hold <= args.wake_hold_max:
        p.error("--wake-hold must be positive and at most --wake-hold-max")
    prefixes, session_key = prefix_options(p, args, topology.prefixes)
    keys = payload_keys(p, args, seal=True)
    if keys is None and prefixes.sealed_payloads and not args.no_prefix_tracking:
        p.error(
            "the topology's prefixes.sealed_payloads is on: give --payload-keys DIR (this "
            "zone's data keys, docs/residency.md), or --no-prefix-tracking"
        )
    app = more.pop("app", None) or RequestConfig(home=args.region)
    app = replace(
        app,
        home=args.region,
        session_header=args.session_header.lower(),
        max_body_bytes=args.max_body_bytes,
        prefix_chars=topology.prefixes.routing_chars,
    )
    return options(
        topology=topology,
        app=app,
        etcd_endpoints=endpoints,
        etcd_timeout_s=args.etcd_timeout,
        store_timeout_s=args.store_timeout,
        max_pins=args.max_pins,
        control_planes=cps,
        observer_id=args.observer_id,
        report_interval_s=args.report_interval,
        prefix_tracking=not args.no_prefix_tracking,
        tracker=tracker_config(prefixes, session_key),
        prefix_export=ExportOptions.from_topology(prefixes, keys),
        payload_keys=keys,
        replica_slots=replica_slots(p, args.replica_slots),
        wake_hold_s=args.wake_hold,
        wake_hold_max_s=args.wake_hold_max,
        **more,
    )


def run_main(
    logs: LogSettings, run: Callable[[], Coroutine[Any, Any, int]], component: str
) -> None:
    """Log to stderr (and trace) as ``logs`` says and exit with what ``run()`` returns,
    on uvloop; the spans still buffered are sent before the exit."""
    configure_logging(logs.level, logs.format, component)
    provider = configure_tracing(component, logs.otlp_endpoint)
    try:
        code = uvloop.run(run())
    finally:
        if provider is not None:
            provider.shutdown()
    sys.exit(code)


class Server(Protocol):
    @property
    def url(self) -> str: ...

    async def start(self) -> None: ...

    async def wait(self) -> None: ...

    async def stop(self) -> None: ...


def add_etcd_flags(p: argparse.ArgumentParser) -> None:
    """etcd: where it is, and how long a request waits for it."""
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


def add_report_flags(p: argparse.ArgumentParser) -> None:
    """Health reports to the control plane: what this process's requests saw."""
    p.add_argument(
        "--control-plane",
        action="append",
        default=[],
        help="host:port[,host:port...] of control-plane replicas; when given, the "
        "process reports what its requests saw per region (kind GATEWAY)",
    )
    p.add_argument(
        "--observer-id",
        default="",
        help="observer name in those reports (default <kind>:<home>:<port>)",
    )
    p.add_argument(
        "--report-interval", type=float, default=1.0, help="seconds between health reports"
    )


def add_replica_flags(p: argparse.ArgumentParser) -> None:
    """What each replica bears, when the operator knows it better than the metrics; how
    long a request for a pool at zero waits for one to wake (scale to zero)."""
    p.add_argument(
        "--wake-hold",
        type=float,
        default=30.0,
        help="seconds a request for a pool at zero (scale to zero) is held while it wakes, "
        "when the pool has measured no wake yet; else its wake p95 + 5 s (default 30)",
    )
    p.add_argument(
        "--wake-hold-max",
        type=float,
        default=60.0,
        help="seconds such a request is held at most, whatever the pool measured; then "
        "503 with Retry-After (default 60)",
    )
    p.add_argument(
        "--replica-slots",
        action="append",
        default=[],
        metavar="N|URL=N[,URL=N...]",
        help="requests a replica runs at once (vLLM's --max-num-seqs): one number for "
        "every replica, or URL=N per replica (repeat the flag or join with commas; a "
        "replica not named is learned). A replica takes a request while it has a free "
        "slot; default: learned from each replica's num_requests_running/waiting",
    )


def replica_slots(p: argparse.ArgumentParser, values: Sequence[str]) -> int | dict[str, int] | None:
    """``--replica-slots``: None (learn them), one count for all, or counts per URL."""
    items = [v.strip() for arg in values for v in arg.split(",") if v.strip()]
    if not items:
        return None
    if len(items) == 1 and "=" not in items[0]:
        return _slot_count(p, items[0], "--replica-slots")
    per: dict[str, int] = {}
    for item in items:
        url, eq, count = item.rpartition("=")
        if not eq or not re.match(r"^https?://[^/\s]+", url):
            p.error(
                f"--replica-slots: expected one number, or URL=N per replica "
                f"(URL as http://host:port), got {item!r}"
            )
        if url in per:
            p.error(f"--replica-slots: {url} given twice")
        per[url] = _slot_count(p, count, f"--replica-slots {url}")
    return per


def _slot_count(p: argparse.ArgumentParser, text: str, name: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        p.error(f"{name}: expected a whole number of at least 1, got {text!r}")
    return n


def add_admission_flags(p: argparse.ArgumentParser, *, max_wait_s: float = 1.0) -> None:
    """Admission control's flags (the gateway's and the endpoint picker's);
    ``max_wait_s``: the default of --admission-max-wait."""
    g = p.add_argument_group(
        "admission control",
        "Each replica gets an in-flight limit that grows while first tokens come within "
        "a target and shrinks when they do not; over it a request waits briefly in its "
        "region's queue or gets 429 with Retry-After. x-priority: batch (or low) is the "
        "batch partition, anything else interactive (regions/dataplane/admission_gate.py).",
    )
    g.add_argument(
        "--admission",
        action="store_true",
        help="turn admission control on (default off)",
    )
    g.add_argument(
        "--admission-target",
        type=float,
        metavar="SECONDS",
        help="first-token time a replica's answers should stay under; default: the "
        "region's slo.ttft_p99_s less --admission-max-wait (at least half the SLO)",
    )
    g.add_argument(
        "--admission-max-wait",
        type=float,
        default=max_wait_s,
        metavar="SECONDS",
        help=f"the longest a request waits for a slot (default {max_wait_s:g}; a tenth "
        "of it while the queue stands: not emptied, or a waiter timed out, within that long)",
    )
    g.add_argument(
        "--admission-max-queue",
        type=int,
        default=128,
        metavar="N",
        help="requests waiting per region at most (default 128)",
    )
    g.add_argument(
        "--admission-interactive-share",
        type=float,
        default=0.9,
        metavar="SHARE",
        help="share of each replica's limit reserved for interactive requests; batch "
        "gets the rest, and each borrows what the other leaves unused (default 0.9)",
    )
    g.add_argument(
        "--admission-max-inflight",
        type=int,
        metavar="N",
        help="upper bound of each replica's limit; the limit starts there. It overrides "
        "the bound otherwise read from the region's measured capacity (capacity/<region> "
        "in etcd: the in-flight at the probed rate, see --admission-bound-at); without "
        "either (no record, a stale one, or one without in-flight figures): unbounded, "
        "starting at 16",
    )
    g.add_argument(
        "--admission-bound-at",
        choices=[b.value for b in BoundAt],
        default=BoundAt.ULTIMATE.value,
        help="which measured rate the bound is the in-flight of: ultimate (the most "
        "that met the SLA; default) or allowed (ultimate / factor of safety)",
    )


def admission_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> AdmissionOptions:
    """The admission flags, checked (a bad value: exit 2 naming each)."""
    problems = []
    if args.admission_target is not None and not args.admission_target > 0:
        problems.append("--admission-target must be positive")
    if not args.admission_max_wait >= 0:
        problems.append("--admission-max-wait must be 0 or more")
    if args.admission_max_queue < 0:
        problems.append("--admission-max-queue must be 0 or more")
    if not 0 < args.admission_interactive_share < 1:
        problems.append("--admission-interactive-share must be between 0 and 1")
    if args.admission_max_inflight is not None and args.admission_max_inflight < 1:
        problems.append("--admission-max-inflight must be positive")
    if problems:
        p.error("; ".join(problems))
    return AdmissionOptions(
        enabled=args.admission,
        first_token_target_s=args.admission_target,
        max_queue_wait_s=args.admission_max_wait,
        max_queue=args.admission_max_queue,
        interactive_share=args.admission_interactive_share,
        max_inflight=args.admission_max_inflight,
        bound_at=BoundAt(args.admission_bound_at),
    )


def add_prefix_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "prefix tracking (pre-warm)",
        "The fingerprint settings, K and the routing length live in the topology's "
        "prefixes section only (every gateway, picker and the control-plane leader must agree); "
        "these flags set this process's own resources.",
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
    add_payload_keys_flag(g, "replay payloads are exported sealed with the active key")


def prefix_options(
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


def host_port(value: str) -> bool:
    return re.match(HOST_PORT, value) is not None


async def serve(server: Server, kind: str) -> int:
    """Run ``server`` until SIGTERM / SIGINT: ``READY <url>`` on stdout once it serves;
    exit status 2 on a topology that disagrees with the cluster spec (at start, or a
    new leader's later), 1 when it fails, 0 when stopped."""
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
        log.error("%s failed to start", kind, exc_info=exc)
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
        log.error("%s tasks failed", kind, exc_info=runner.exception())
        return 1
    return 0


async def _refuse(server: Server, disagreement: SpecDisagreement) -> int:
    """A topology that disagrees with the cluster spec: a configuration mistake, not a
    crash. Stop as on SIGTERM, and exit 2 with the message, which names each setting."""
    print(f"error: {disagreement}", file=sys.stderr, flush=True)
    await server.stop()
    return 2
