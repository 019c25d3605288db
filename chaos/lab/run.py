"""Run a drill in a local lab: a whole deployment on this machine, synthetic chat
sessions through its data plane, the drill, and everything stopped afterwards.

    python -m chaos.lab.run region-blackout             # ~1 min; prints the story and verdict
    python -m chaos.lab.run auth-503-storm --json
    python -m chaos.lab.run leader-kill-mid-failover --dry-run
    python -m chaos.lab.run flapping-region --data-plane envoy

The data plane is Tectonic's gateway per region (``--data-plane gateway``, the default)
or, with ``--data-plane envoy``, a real Envoy per region (deploy/envoy/envoy.yaml) asking
two endpoint pickers (``tectonic-epp``) where each request goes.

The lab is what the demo and the tests run drills on, and what the drill service
runs when it has no other target. A drill against a deployment elsewhere needs an
adapter implementing ``chaos.drills.runner.DrillTarget`` over that deployment's processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import re
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from chaos.drills.lock import DrillLocker, LockLost
from chaos.drills.result import DrillResult, Sample
from chaos.drills.runner import DrillRunner, dump
from chaos.drills.scenario import Scenario, find_scenario
from chaos.drills.traffic import MODEL, Traffic
from chaos.lab.deployment import LocalDeployment
from chaos.lab.spec import DATA_PLANES, DataPlane, DeploymentSpec
from chaos.lab.surge import (
    SURGE_INTERVAL_S,
    SURGE_MAX_TOKENS,
    SURGE_SESSIONS,
    surge_capacity,
    surge_spec,
    write_capacity,
)
from controlplane.kernel.clock import SystemClock
from controlplane.kernel.codec import decode
from controlplane.kernel.config import REGION_NAME, ConfigError, load_topology
from controlplane.kernel.prefix.catalog import PrefixCatalog
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig

REPORTS = Path("drill-reports")
LAB_LOCK_TTL_S = 10  # the drill lock's lease: a lab whose drill process died frees it soon


@contextlib.asynccontextmanager
async def running_lab(
    spec: DeploymentSpec, workdir: Path, say: Callable[[str], None] = print
) -> AsyncIterator[LocalDeployment]:
    """Start every process of a local deployment (etcd first, the data plane last);
    stop them all on the way out, whatever happened."""
    dep = LocalDeployment(spec, workdir)
    try:
        say(f"starting etcd ({spec.etcd_members} member{'s' * (spec.etcd_members > 1)}) ...")
        await asyncio.to_thread(dep.start_etcd)
        dep.write_topology()
        say(f"topology: {dep.topology_path}")
        kind = "vLLM servers" if spec.server == "vllm" else "vLLM simulators"
        each = f"{len(spec.pools)} model pools of " if spec.pools else ""
        servers = f"{spec.replicas_per_region} {kind} + an agent"
        if spec.warm_pool is not None:
            w = spec.warm_pool
            servers = f"an agent with a warm pool of simulators ({w.active} ACTIVE, {w.warm} WARM)"
            if w.vllm_units:
                servers += f" (real vLLM servers for {', '.join(w.vllm_units)})"
        say(f"starting regions {', '.join(spec.regions)} (in parallel): {each}{servers} each ...")
        await asyncio.gather(*(asyncio.to_thread(dep.start_region, r) for r in spec.regions))
        for rid in dep.cp_ports:
            say(f"starting control-plane replica {rid} ...")
            await asyncio.to_thread(dep.start_controlplane, rid)
        say(f"dashboard: {' or '.join(dep.dashboard_urls.values())} (live while the lab runs)")
        say(f"starting {data_plane_words(spec.data_plane)} ({', '.join(spec.regions)}) ...")
        await asyncio.gather(*(asyncio.to_thread(dep.start_data_plane, r) for r in spec.regions))
        yield dep
    finally:
        await asyncio.to_thread(dep.stop)


def data_plane_words(data_plane: DataPlane) -> str:
    """What runs in front of each region's servers, in words."""
    if data_plane == "envoy":
        return "one Envoy per region, each with two endpoint pickers"
    return "one gateway per region"


def add_data_plane_flag(p: argparse.ArgumentParser) -> None:
    """``--data-plane``, the same on the demo and on ``python -m chaos.lab.run``."""
    p.add_argument(
        "--data-plane",
        choices=DATA_PLANES,
        default="gateway",
        help="what serves the traffic in each region: Tectonic's gateway (default), or "
        "a real Envoy (deploy/envoy/envoy.yaml) in front of two endpoint pickers",
    )


async def wait_catalog(store: EtcdStore, dep: LocalDeployment, region: str, within: float) -> int:
    """Wait until the leader's prefix catalog of ``region`` has a prefix that may leave
    (a failover has something to pre-warm); the number of such prefixes."""
    deadline = time.monotonic() + within
    while True:
        kv = await store.get(dep.keys.prefixes(region))
        if kv is not None:
            catalog = decode(PrefixCatalog, kv.value, kv.key)
            n = sum(e.payload is not None for e in catalog.entries)
            if n:
                return n
        if time.monotonic() > deadline:
            raise TimeoutError(f"no prefix of {region} may leave after {within:g}s")
        await asyncio.sleep(0.25)


def lab_spec(scenario: Scenario, base: DeploymentSpec | None = None) -> DeploymentSpec:
    """The lab a scenario needs: its etcd members; a surge's warm pools for the scaler."""
    base = base or DeploymentSpec()
    if scenario.surges:
        base = surge_spec(base)
    return dataclasses.replace(base, etcd_members=max(base.etcd_members, scenario.etcd_members))


async def run_in_lab(
    scenario: Scenario,
    region: str | None = None,
    *,
    dry_run: bool = False,
    reports: Path = REPORTS,
    sessions: int | None = None,
    spec: DeploymentSpec | None = None,
    say: Callable[[str], None] = print,
    on_sample: Callable[[Sample], None] | None = None,
) -> DrillResult:
    """Start a lab, drive ``sessions`` chat sessions through it (default 30; a surge
    drill's own few), run the drill."""
    if sessions is None:
        sessions = SURGE_SESSIONS if scenario.surges else 30
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-lab-"))
    async with running_lab(lab_spec(scenario, spec), workdir, say) as dep:
        store = EtcdStore(EtcdConfig(endpoints=dep.etcd_endpoints))
        await store.connect()
        try:
            return await drill_on(
                dep,
                store,
                scenario,
                region,
                dry_run=dry_run,
                reports=reports,
                sessions=sessions,
                say=say,
                on_sample=on_sample,
            )
        finally:
            await store.close()


def surge_traffic(dep: LocalDeployment) -> Traffic:
    """The surge drills' traffic: a request a second per session, every answer as short
    as the slowed simulators' modelled capacity assumes (chaos/lab/surge.py)."""
    return Traffic(
        dep.gateway_urls,
        interval_s=SURGE_INTERVAL_S,
        stream_share=0.5,
        stream_tokens=SURGE_MAX_TOKENS,
    )


def lab_traffic(dep: LocalDeployment, interval_s: float | None = None) -> Traffic:
    """The drills' synthetic chat traffic through the lab's data plane; each session
    sends a request every ``interval_s`` (default 0.5 s; 1.5 s on real vLLM)."""
    real = dep.spec.server == "vllm"
    if interval_s is None:
        # Three CPU vLLM servers share two cores with the whole lab: at the simulator's
        # pace the survivors of a blackout saturate them and the killed region's restart
        # (~20 s alone) starves for minutes.
        interval_s = 1.5 if real else 0.5
    # Half the requests stream (a longer answer on the simulator): a replica killed
    # mid-stream must be continued by the gateway, or the request counts as failed.
    # Real vLLM on CPU caches whole 128-token blocks: longer shared prompts fill one.
    return Traffic(
        dep.gateway_urls,
        interval_s=interval_s,
        prompt_repeat=2 if real else 1,
        stream_share=0.5,
        stream_tokens=4 if real else 24,
    )


async def drill_on(
    dep: LocalDeployment,
    store: EtcdStore,
    scenario: Scenario,
    region: str | None = None,
    *,
    dry_run: bool = False,
    reports: Path = REPORTS,
    sessions: int = 30,
    interval_s: float | None = None,
    say: Callable[[str], None] = print,
    on_sample: Callable[[Sample], None] | None = None,
    traffic: Traffic | None = None,
    session_prefix: str = "s",
) -> DrillResult:
    """Run one drill on a running lab, under ``sessions`` synthetic chat sessions, each
    sending a request every ``interval_s`` (default 0.5 s; 1.5 s on real vLLM).
    ``traffic``: the caller's ``lab_traffic``, to read its sessions' logs afterwards;
    ``session_prefix`` starts the sessions' ids (a second drill on one lab: new ones)."""
    target = region or scenario.region
    if traffic is None:
        traffic = surge_traffic(dep) if scenario.surges else lab_traffic(dep, interval_s)
    if scenario.surges and dep.spec.warm_pool is not None:
        # the scaler sizes per replica as a capacity probe measured it (none runs here)
        await write_capacity(store, dep.keys, surge_capacity(dep.spec))
    try:
        models = [model for _, model in dep.spec.pools] or [MODEL]
        pools = {model: pool for pool, model in dep.spec.pools}
        regions = list(dep.spec.regions)
        traffic.add(sessions, regions, prefix=session_prefix, models=models, pools=pools)
        await traffic.start()
        entry = "Envoys" if dep.spec.data_plane == "envoy" else "gateways"
        say(
            f"traffic: {sessions} chat sessions through the {entry} of their home regions "
            "(half the requests stream)"
        )
        topology = load_topology(dep.topology_path)
        if scenario.measure.prewarm_attainment is not None and not dry_run:
            # a region with model pools: each pool's own catalog
            units = topology.units_of(target) if target in topology.sites else (target,)
            for unit in units:
                n = await wait_catalog(store, dep, unit, 45)
                say(f"the leader's prefix catalog of {unit}: {n} prefixes may leave")
        runner = DrillRunner(
            target=dep,
            store=store,
            topology=topology,
            reports_root=reports,
            traffic=traffic,
            on_sample=on_sample,
            say=say,
        )
        # Held like the drill service holds it: the leader marks what it decides on the
        # region meanwhile as the drill's (cause "drill"), so it pages no one.
        locker = DrillLocker(store, dep.keys, SystemClock(), "lab", LAB_LOCK_TTL_S, 10.0)
        async with locker.locked(scenario.name, target, "lab") as held:
            keeper = asyncio.create_task(locker.keep_alive(held))
            try:
                return await runner.run(scenario, region, dry_run=dry_run)
            finally:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError, LockLost):
                    await keeper
    finally:
        await traffic.stop()


def pools_flag(text: str) -> tuple[tuple[str, str], ...]:
    """``--pools chat=llama-3,code=qwen-coder``: (pool, model) pairs."""
    pairs = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        pool, sep, model = item.partition("=")
        if not sep or not re.fullmatch(REGION_NAME, pool) or not model or " " in model:
            raise argparse.ArgumentTypeError(
                f"expected POOL=MODEL (a DNS-label pool name, a model name), got {item!r}"
            )
        pairs.append((pool, model))
    return tuple(pairs)


async def run_drill(name: str, region: str | None, *, dry_run: bool = False) -> DrillResult:
    """What the drill service calls: the named scenario, in a lab."""
    return await run_in_lab(find_scenario(name), region, dry_run=dry_run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m chaos.lab.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", help="a name from chaos/scenarios/ or a path to a YAML file")
    p.add_argument("--region", help="target region (default: the scenario's)")
    p.add_argument("--dry-run", action="store_true", help="check steady state; inject nothing")
    p.add_argument("--reports", type=Path, default=REPORTS, help="where reports go")
    p.add_argument("--sessions", type=int, default=30, help="synthetic chat sessions")
    p.add_argument("--json", action="store_true", help="print the result as JSON at the end")
    p.add_argument(
        "--pools",
        type=pools_flag,
        default=(),
        metavar="POOL=MODEL,...",
        help="model pools (docs/models.md): every region holds one pool of each, its "
        "servers serving that model, and each session talks to every model; then "
        "--region names a pool as <region>.<pool> (e.g. pool-outage --region us-east.chat "
        "with --pools chat=llama-3,code=qwen-coder)",
    )
    add_data_plane_flag(p)
    args = p.parse_args(argv)
    try:
        scenario = find_scenario(args.scenario)
        result = asyncio.run(
            run_in_lab(
                scenario,
                args.region,
                dry_run=args.dry_run,
                reports=args.reports,
                sessions=args.sessions,
                spec=DeploymentSpec(data_plane=args.data_plane, pools=args.pools),
            )
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (TimeoutError, RuntimeError) as e:
        print(f"lab failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; every lab process stopped", file=sys.stderr)
        return 130
    for c in result.criteria:
        print(f"  {'PASS' if c.passed else 'FAIL'}  {c.name}: {c.measured} (required {c.required})")
    print(f"data plane: {args.data_plane}")
    print(f"report: {result.report_path}")
    if args.json:
        print(dump(result))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
