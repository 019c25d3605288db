"""The demo: a local etcd, three simulated regions, two control-plane replicas, and a
region blackout you can watch fail over, survive a leader kill, and recover, while
chat sessions keep talking through the gateways and stay sticky.

Everything runs as real processes on 127.0.0.1: etcd, vLLM-compatible simulators
(two replicas per region), one region agent and one session-affinity gateway per
region, and two control-plane replicas that elect a leader through etcd. Faults are
real: processes are SIGKILLed. A traffic driver (chaos/demo_traffic.py) runs chat
sessions through the gateways from steady state to the end and checks that the
failed region's sessions move once and stay, and that nothing else moves.

    python -m chaos.demo            # under a minute; prints states as they change
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import yaml
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.demo_live import REGIONS, REPLICAS_PER_REGION, STATE, Demo, region
from chaos.demo_summary import print_summary, problems
from chaos.demo_traffic import Session, Traffic, analyse, gateway_counters
from chaos.local_etcd import EtcdServer
from chaos.procs import free_port, start_controlplane
from controlplane.codec import decode
from controlplane.config import EtcdConfig
from controlplane.core.model import FailoverStep, RegionRecord
from controlplane.core.prefix_catalog import PrefixCatalog
from controlplane.keys import Keys
from controlplane.store.etcd import EtcdStore

VICTIM = "us-east"


def demo_topology(
    etcd_endpoints: tuple[str, ...], agent_ports: dict[str, int], sim_ports: dict[str, list[int]]
) -> dict[str, object]:
    """Demo timings: the production shape, compressed so the whole story takes a minute."""
    return {
        "cluster": f"demo-{uuid.uuid4().hex[:6]}",
        "etcd": {"endpoints": list(etcd_endpoints)},
        "regions": [
            {
                "name": r,
                "zone": "us",
                "agent": f"127.0.0.1:{agent_ports[r]}",
                "capacity_rps": 60 if r == "us-central" else 120,
                "replicas": [f"http://127.0.0.1:{p}" for p in sim_ports[r]],
            }
            for r in REGIONS
        ],
        "timing": {
            "probe_interval_s": 0.5,
            "failure_threshold": 3,
            "success_threshold": 3,
            "report_stale_s": 1.5,
            "quorum": 2,
            "degraded_dwell_s": 3,
            "recovery_dwell_s": 3,
            "failover_cooldown_s": 30,
            "loop_period_s": 0.5,
            "retry_timeout_s": 0.5,
            "lease_ttl_s": 3,
        },
        "recovery": {"step_percent": 25, "step_interval_s": 1.0},
        # The demo's traffic has a dozen shared system prompts (a few dozen prefix
        # levels): the top 1 % of so few is one prefix, so the demo warms the top quarter.
        "prewarm": {"budget_s": 30, "top_fraction": 0.25, "verify": 4},
        # The demo's system prompts are ~400 characters: count a level every 32 tokens.
        "prefixes": {"level_tokens": 32, "export_interval_s": 1.0, "aggregate_interval_s": 1.0},
    }


async def run_demo(demo: Demo, sessions: int, interval_s: float) -> dict[str, object]:
    print("starting etcd ...", flush=True)
    etcd = EtcdServer()
    await asyncio.to_thread(etcd.start)
    try:
        agent_ports = {r: free_port() for r in REGIONS}
        demo.sim_ports = {r: [free_port() for _ in range(REPLICAS_PER_REGION)] for r in REGIONS}
        cp_ports = {"cp-1": free_port(), "cp-2": free_port()}
        cp_targets = [f"127.0.0.1:{p}" for p in cp_ports.values()]
        topo_path = demo.workdir / "topology.yaml"
        topo = demo_topology(etcd.endpoints, agent_ports, demo.sim_ports)
        demo.etcd_endpoints, demo.keys = etcd.endpoints, Keys(str(topo["cluster"]))
        topo_path.write_text(yaml.safe_dump(topo))
        print(f"topology: {topo_path}", flush=True)
        for r in REGIONS:
            print(
                f"starting region {r}: {REPLICAS_PER_REGION} vLLM simulators + agent ...",
                flush=True,
            )
            await asyncio.to_thread(demo.start_region, r, cp_targets, agent_ports[r])
        for rid, port in cp_ports.items():
            print(f"starting control-plane replica {rid} ...", flush=True)
            demo.cps[rid] = await asyncio.to_thread(
                start_controlplane, topo_path, rid, listen=f"127.0.0.1:{port}"
            )
            demo.procs.append(demo.cps[rid])
        print(f"starting one gateway per region ({', '.join(REGIONS)}) ...", flush=True)
        await asyncio.gather(
            *(asyncio.to_thread(demo.start_gateway, topo_path, r, cp_targets) for r in REGIONS)
        )

        channels = [grpc.aio.insecure_channel(t) for t in cp_targets]
        stubs = [pb_grpc.ControlPlaneStub(c) for c in channels]  # type: ignore[no-untyped-call]
        demo.traffic = Traffic({r: g.url for r, g in demo.gateways.items()}, interval_s=interval_s)
        try:
            return await story(demo, stubs, sessions)
        finally:
            await demo.traffic.stop()
            for c in channels:
                await c.close()
            if demo.store is not None:
                await demo.store.close()
    finally:
        demo.stop_all()
        await asyncio.to_thread(etcd.stop)


async def story(
    demo: Demo, stubs: list[pb_grpc.ControlPlaneStub], sessions: int
) -> dict[str, object]:
    """Steady state under traffic, blackout, leader kill, recovery; returns the figures."""
    traffic = demo.traffic
    assert traffic is not None
    figures: dict[str, object] = {}
    demo.say("waiting for steady state: every region HEALTHY under one leader")
    st = await demo.wait_for(
        stubs,
        "steady state",
        lambda s: bool(s.leader) and all(r.health == pb.HEALTHY for r in s.regions),
        30,
    )
    demo.say(f"steady: leader is {st.leader}")

    traffic.add(sessions, REGIONS)
    await traffic.start()
    demo.say(
        f"TRAFFIC: {sessions} chat sessions, each through its home region's gateway, one "
        f"turn every ~{traffic.interval_s:g} s (x-session-id; {traffic.group_size} sessions "
        "share a system prompt)"
    )
    await demo.wait_for(stubs, "every session answered", lambda s: traffic.answered(2), 30)
    demo.say(f"every session pinned and answered: {traffic.distribution()}")

    victim = VICTIM
    catalog = await _wait_catalog(demo, victim, 30)
    demo.say(
        f"PREFIXES: the leader's catalog of {victim} holds {len(catalog.entries)} prefixes "
        f"counted by {catalog.gateways} gateway(s); "
        f"{sum(e.payload is not None for e in catalog.entries)} may leave (seen from "
        f"{catalog.min_sessions}+ sessions)"
    )
    homed = [s for s in traffic.sessions if s.home == victim]
    demo.say(f"BLACKOUT {victim}: SIGKILL both of its vLLM replicas")
    t_kill = time.monotonic()
    for s in demo.sims[victim]:
        s.kill()
    st = await demo.wait_for(
        stubs, f"{victim} UNHEALTHY", lambda s: region(s, victim).health == pb.UNHEALTHY, 30
    )
    figures["detect_s"] = round(time.monotonic() - t_kill, 2)
    st = await demo.wait_for(
        stubs,
        f"{victim} routed away",
        lambda s: victim not in region(s, victim).routing,
        30,
    )
    figures["failover_s"] = round(time.monotonic() - t_kill, 2)
    routing = dict(region(st, victim).routing)
    demo.say(
        f"{victim} failed over in {figures['failover_s']}s: new sessions go to "
        + ", ".join(f"{k} {v:.0%}" for k, v in routing.items())
        + " (shares by headroom)"
    )
    await demo.wait_for(
        stubs,
        f"every {victim} session answered elsewhere",
        lambda s: all(x.region != victim for x in homed),
        30,
    )
    figures["sessions_moved_s"] = round(time.monotonic() - t_kill, 2)
    demo.say(
        f"all {len(homed)} {victim} sessions answered elsewhere "
        f"({figures['sessions_moved_s']}s after the kill): "
        + ", ".join(f"{r} {n}" for r, n in traffic.serving(homed).items())
        + f"; {len(traffic.failures)} requests failed meanwhile"
    )

    record = await _wait_prewarmed(demo, victim, 40)
    pre = record.failover.prewarm_result if record.failover else {}
    figures["prewarm"] = pre
    demo.say(prewarm_line(pre))

    leader = st.leader
    demo.say(f"KILL the control-plane leader {leader} (SIGKILL; its lease must expire)")
    t_kill = time.monotonic()
    demo.cps[leader].kill()
    st = await demo.wait_for(
        stubs, "a new leader", lambda s: bool(s.leader) and s.leader != leader, 30
    )
    figures["leader_takeover_s"] = round(time.monotonic() - t_kill, 2)
    demo.say(
        f"{st.leader} took over in {figures['leader_takeover_s']}s "
        "(lease TTL 3 s); routing untouched"
    )

    demo.say(f"RESTORE {victim}: its vLLM replicas come back")
    t_back = time.monotonic()
    await asyncio.to_thread(demo.restart_sims, victim)
    await demo.wait_for(
        stubs, f"{victim} RECOVERED", lambda s: region(s, victim).state == pb.RECOVERED, 60
    )
    demo.say(
        f"{victim} healthy for the dwell time: graduated recovery, 25 % of new sessions per step"
    )
    st = await demo.wait_for(
        stubs, f"{victim} NORMAL", lambda s: region(s, victim).state == pb.NORMAL, 60
    )
    figures["recovery_s"] = round(time.monotonic() - t_back, 2)
    demo.say(f"{victim} back to NORMAL {figures['recovery_s']}s after its replicas returned")

    late: list[Session] = traffic.add(5, [victim], prefix="new")
    demo.say(f"5 NEW sessions through the {victim} gateway; the moved sessions keep talking")
    await demo.wait_for(stubs, "the new sessions answered", lambda s: traffic.answered(4, late), 30)
    demo.say(
        f"new {victim} sessions served by "
        + ", ".join(f"{r} {n}" for r, n in traffic.serving(late).items())
        + f"; the moved ones by {', '.join(f'{r} {n}' for r, n in traffic.serving(homed).items())}"
    )
    await traffic.stop()
    figures.update(await gateway_counters(g.url for g in demo.gateways.values()))
    figures.update(analyse(traffic, victim, late, demo.t0))

    hist = await stubs[0 if st.leader == "cp-1" else 1].GetHistory(
        pb.HistoryRequest(region=victim, limit=100)
    )
    path = [
        f"{STATE[e.decision.from_state]}->{STATE[e.decision.to_state]}"
        for e in hist.events
        if e.action == "transition"
    ]
    figures["transitions"] = path
    figures["cp_sessions_repinned"] = sum(
        int(e.details.get("moved", "0")) for e in hist.events if e.action == "sessions_repinned"
    )
    figures["audit_entries"] = len(hist.events)
    return figures


def prewarm_line(pre: dict[str, float]) -> str:
    """One line on what the failover's pre-warm did, from its record."""
    if not pre.get("prefixes_total"):
        return "PRE-WARM: nothing to warm (no prefix may leave the region yet)"
    return (
        f"PRE-WARM: {pre.get('prefixes_warmed', 0):g} of {pre['prefixes_total']:g} top prefixes "
        f"replayed on the targets in {pre.get('elapsed_s', 0):.2f}s (budget "
        f"{pre.get('budget_s', 0):g}s, attainment {pre.get('attained_fraction', 0):.0%}); "
        + (
            f"hit rate of a second send, by vLLM: {pre['verified_hit_rate']:.0%} "
            f"({pre['verified']:g} prefixes)"
            if pre.get("verified")
            else "not verified (live traffic on the targets hides each request's hits)"
        )
    )


async def _store(demo: Demo) -> EtcdStore:
    if demo.store is None:
        demo.store = EtcdStore(EtcdConfig(endpoints=demo.etcd_endpoints))
        await demo.store.connect()
    return demo.store


async def _wait_catalog(demo: Demo, region: str, within: float) -> PrefixCatalog:
    store = await _store(demo)
    deadline = time.monotonic() + within
    while True:
        kv = await store.get(demo.keys.prefixes(region))
        if kv is not None:
            catalog = decode(PrefixCatalog, kv.value, kv.key)
            if any(e.payload is not None for e in catalog.entries):
                return catalog
        if time.monotonic() > deadline:
            raise TimeoutError(f"no prefix of {region} may leave after {within:g}s")
        await asyncio.sleep(0.2)


async def _wait_prewarmed(demo: Demo, region: str, within: float) -> RegionRecord:
    store = await _store(demo)
    deadline = time.monotonic() + within
    while True:
        kv = await store.get(demo.keys.region_state(region))
        rec = None if kv is None else decode(RegionRecord, kv.value, kv.key)
        if rec is not None and rec.failover and FailoverStep.PREWARM in rec.failover.done:
            return rec
        if time.monotonic() > deadline:
            raise TimeoutError(f"{region}'s failover did not pre-warm within {within:g}s")
        await asyncio.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m chaos.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    p.add_argument("--sessions", type=int, default=60, help="chat sessions (default 60)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between a session's turns")
    args = p.parse_args(argv)
    if args.sessions < len(REGIONS) or args.interval <= 0:
        p.error(f"--sessions must be at least {len(REGIONS)} and --interval positive")
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-demo-"))
    demo = Demo(workdir=workdir, json_out=args.json)
    try:
        figures = asyncio.run(run_demo(demo, args.sessions, args.interval))
    except (TimeoutError, RuntimeError) as e:
        print(f"\nDEMO FAILED: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; all demo processes stopped", file=sys.stderr)
        return 130
    failed = problems(figures, VICTIM)
    print_summary(demo.timeline, figures, failed, VICTIM)
    if args.json:
        print(json.dumps({"demo": "blackout", "passed": not failed, **figures}))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
