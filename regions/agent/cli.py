"""``tectonic-agent`` / ``python -m regions.agent``: the region agent's command line.

    tectonic-agent --region eu --listen 127.0.0.1:7001 --control-plane 127.0.0.1:7000 \\
        --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002

Probes the replicas (or runs a warm pool, ``--pool-config``; or finds them in a
Kubernetes Service's EndpointSlices, ``--discovery kubernetes``), judges the region and
reports it to the control plane, which answers with the region's DEGRADED thresholds
from its topology (``regions[].degraded_when``); prints ``READY HOST:PORT`` once it
serves; SIGTERM or SIGINT stops it (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from controlplane.kernel.config import ConfigError, describe_errors, load_etcd, read_yaml
from controlplane.kernel.logs import add_log_format_flag, configure_logging
from controlplane.kernel.security import SecurityConfig
from controlplane.kernel.version import add_version_flag
from regions.agent.kube_wiring import KubeDiscoveryConfig
from regions.agent.pool_config import load_pool_config
from regions.agent.server import AgentConfig, serve_agent
from regions.agent.service import PrewarmServiceConfig
from regions.dataplane.payload_keys import add_payload_keys_flag, payload_keys
from regions.dataplane.replay_headers import add_replay_key_flag, replay_key

log = logging.getLogger("tectonic.agent")


def load_security(path: str) -> SecurityConfig:
    """The ``security:`` section of a YAML file (a topology file, or one with only it)."""
    data = read_yaml(path, "security file")
    if not isinstance(data, dict) or not isinstance(data.get("security"), dict):
        raise ConfigError(f"{path}: expected a mapping with a security: section")
    try:
        return SecurityConfig.model_validate(data["security"])
    except ValidationError as e:
        raise ConfigError(f"{path} is invalid:\n{describe_errors(e)}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tectonic-agent",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--region", required=True, help="the region this agent watches")
    p.add_argument("--listen", default="127.0.0.1:0", help="gRPC host:port (port 0 = any)")
    p.add_argument(
        "--metrics-listen",
        default="",
        metavar="HOST:PORT",
        help="also serve Prometheus /metrics over HTTP here (port 0: any free "
        "port; the log says which); off by default",
    )
    p.add_argument(
        "--control-plane",
        action="append",
        default=[],
        required=True,
        help="host:port[,host:port...]; repeatable; tried in turn",
    )
    _replica_flags(p)
    _kube_flags(p)
    _prewarm_flags(p)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between probes")
    p.add_argument("--timeout", type=float, default=0.5, help="per-request timeout (s)")
    p.add_argument(
        "--security",
        metavar="FILE",
        default=None,
        help="YAML whose security: section (the topology file works) gives TLS for "
        "the agent's server and its reports, the tokens it accepts, and its "
        "own token (token_file or TECTONIC_TOKEN; role reporter); its etcd: "
        "section's TLS and user settings are used for --etcd",
    )
    p.add_argument("--log-level", default="INFO")
    add_log_format_flag(p)
    add_version_flag(p)
    return p


def _replica_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "replicas", "what the agent probes: a fixed list, or a warm pool it runs"
    )
    g.add_argument(
        "--replica",
        action="append",
        default=[],
        help="vLLM base URL, e.g. http://127.0.0.1:8000; repeatable; or --pool-config",
    )
    g.add_argument(
        "--pool-config",
        metavar="FILE",
        default=None,
        help="warm pool YAML (regions/pool/README.md) instead of --replica: the "
        "agent launches or adopts the replicas, keeps some asleep (WARM), "
        "wakes them for pre-warm and publishes the ACTIVE ones to "
        "pools/<region> in etcd for gateways; needs --etcd and --cluster",
    )
    g.add_argument(
        "--etcd",
        default="",
        metavar="HOST:PORT[,...]",
        help="etcd endpoints to publish the pool to (with --pool-config)",
    )
    g.add_argument(
        "--cluster",
        default=None,
        metavar="NAME",
        help="deployment name, the topology's cluster: keys live under "
        "/tectonic/NAME/ (with --pool-config)",
    )


def _kube_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "kubernetes",
        "replicas from a Service's EndpointSlices, and a warm pool that scales a workload "
        "(regions/kube/); the Kubernetes API is reached in-cluster or with a kubeconfig",
    )
    g.add_argument(
        "--discovery",
        choices=("static", "kubernetes"),
        default="static",
        help="where the replicas come from: static (--replica / --pool-config, the "
        "default) or kubernetes (the EndpointSlices of --kube-service)",
    )
    g.add_argument("--kube-namespace", metavar="NS", default=None, help="the Service's namespace")
    g.add_argument(
        "--kube-service",
        metavar="SVC",
        default=None,
        help="the Service that selects all of the region's model pods",
    )
    g.add_argument(
        "--kube-port-name",
        metavar="NAME",
        default=None,
        help="the EndpointSlice port to talk to, by name (e.g. http); default: the only one",
    )
    g.add_argument("--kube-port", type=int, default=None, metavar="N", help="... or by number")
    g.add_argument(
        "--kubeconfig",
        metavar="PATH",
        default=None,
        help="kubeconfig file; default: the pod's service account, else $KUBECONFIG "
        "or ~/.kube/config",
    )
    g.add_argument("--kube-context", metavar="NAME", default=None, help="kubeconfig context")
    g.add_argument(
        "--pool-launcher",
        choices=("kubernetes",),
        default=None,
        help="the warm pool's launcher instead of the --pool-config file's: kubernetes "
        "scales --kube-workload (needs --discovery kubernetes, --etcd and --cluster; "
        "without --pool-config the pool's sizes are the defaults)",
    )
    g.add_argument(
        "--kube-workload",
        metavar="KIND/NAME",
        default=None,
        help="deployment/NAME or statefulset/NAME in --kube-namespace (with "
        "--pool-launcher kubernetes)",
    )
    g.add_argument(
        "--pool-advisory",
        action="store_true",
        help="advisory mode (with --pool-launcher kubernetes): Tectonic scales nothing "
        "itself; an HPA or KEDA scales --kube-workload on the desired replicas the "
        "control plane publishes, and the pool takes the pods it runs (docs/scaling.md)",
    )


def _kube_config(
    p: argparse.ArgumentParser, args: argparse.Namespace
) -> KubeDiscoveryConfig | None:
    """``--discovery kubernetes`` and its flags; the flags without it are an error."""
    given = [
        flag
        for flag, value in (
            ("--kube-namespace", args.kube_namespace),
            ("--kube-service", args.kube_service),
            ("--kube-port-name", args.kube_port_name),
            ("--kube-port", args.kube_port),
            ("--kubeconfig", args.kubeconfig),
            ("--kube-context", args.kube_context),
        )
        if value is not None
    ]
    if args.discovery != "kubernetes":
        if given:
            p.error(f"{', '.join(given)} only go with --discovery kubernetes")
        return None
    missing = [
        flag
        for flag, value in (
            ("--kube-namespace", args.kube_namespace),
            ("--kube-service", args.kube_service),
        )
        if not value
    ]
    if missing:
        p.error(f"--discovery kubernetes needs {' and '.join(missing)}")
    try:
        return KubeDiscoveryConfig(
            namespace=args.kube_namespace,
            service=args.kube_service,
            port_name=args.kube_port_name,
            port=args.kube_port,
            kubeconfig=args.kubeconfig,
            context=args.kube_context,
        )
    except ValidationError as e:
        p.error(_errors(e, "kube"))


def _pool_launcher(
    p: argparse.ArgumentParser, args: argparse.Namespace
) -> dict[str, object] | None:
    if args.pool_launcher is None:
        if args.kube_workload is not None:
            p.error("--kube-workload goes with --pool-launcher kubernetes")
        if args.pool_advisory:
            p.error("--pool-advisory goes with --pool-launcher kubernetes")
        return None
    if args.kube_workload is None:
        p.error("--pool-launcher kubernetes needs --kube-workload deployment/NAME")
    launcher: dict[str, object] = {"kind": "kubernetes", "workload": args.kube_workload}
    if args.pool_advisory:
        launcher["advisory"] = True
    return launcher


def _errors(e: ValidationError, prefix: str = "") -> str:
    return "; ".join(
        f"{'.'.join(map(str, (prefix, *err['loc']) if prefix else err['loc'])) or 'config'}: "
        f"{err['msg']}"
        for err in e.errors()
    )


def _prewarm_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pre-warm", "how fast this region's replicas replay prefixes")
    g.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=None,
        metavar="RATE",
        help="prefill tokens/s of ONE replica, measured for your model and "
        "hardware (default 10,000); the leader sizes a failover's pre-warm "
        "with it (python -m bench prewarm measures it on the simulator)",
    )
    g.add_argument(
        "--prewarm-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="pre-warm replays in flight per replica (default 2): how many "
        "prefills a replica runs at full speed at once, plus one",
    )
    add_replay_key_flag(g, "pre-warm replays")
    add_payload_keys_flag(g, "sealed payloads this agent cannot open are skipped and counted")


def parse_args(argv: Sequence[str] | None = None) -> AgentConfig:
    p = _parser()
    args = p.parse_args(argv)
    configure_logging(args.log_level, args.log_format, "agent")
    cps = tuple(ep.strip() for arg in args.control_plane for ep in arg.split(",") if ep.strip())
    kube = _kube_config(p, args)
    launcher = _pool_launcher(p, args)
    try:
        wanted = args.pool_config or launcher is not None
        pool = load_pool_config(args.pool_config, launcher) if wanted else None
    except ConfigError as e:
        p.error(str(e))
    etcd = tuple(ep.strip() for ep in args.etcd.split(",") if ep.strip())
    key = replay_key(p, args)
    try:
        security = load_security(args.security) if args.security else None
        etcd_settings = load_etcd(args.security) if args.security else None
    except ConfigError as e:
        p.error(str(e))
    try:
        return AgentConfig(
            region=args.region,
            listen=args.listen,
            control_planes=cps,
            metrics_listen=args.metrics_listen or None,
            replicas=tuple(args.replica),
            pool=pool,
            etcd=etcd,
            security=security,
            etcd_settings=etcd_settings,
            cluster=args.cluster,
            kube=kube,
            interval=args.interval,
            timeout=args.timeout,
            prewarm=PrewarmServiceConfig(
                **{
                    k: v
                    for k, v in (
                        ("prefill_tokens_per_s", args.prefill_tokens_per_s),
                        ("per_replica_concurrency", args.prewarm_concurrency),
                        ("replay_api_key", key),
                        ("payload_keys", payload_keys(p, args, seal=False)),
                    )
                    if v is not None
                }
            ),
        )
    except ValidationError as e:
        p.error(_errors(e))


async def _run(config: AgentConfig) -> int:
    handle = await serve_agent(config)
    print(f"READY {config.listen.rsplit(':', 1)[0]}:{handle.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.create_task(stop.wait())
    runner = asyncio.create_task(handle.wait())
    done, _ = await asyncio.wait({waiter, runner}, return_when=asyncio.FIRST_COMPLETED)
    if waiter in done:
        log.info("signal received; shutting down")
    await handle.stop()
    waiter.cancel()
    await asyncio.wait({waiter, runner})
    if runner in done and not runner.cancelled() and runner.exception() is not None:
        log.error("agent loop failed", exc_info=runner.exception())
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``tectonic-agent`` console script."""
    sys.exit(asyncio.run(_run(parse_args(argv))))
