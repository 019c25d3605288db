"""The demo: a local etcd, three simulated regions, two control-plane replicas, and a
region blackout you can watch fail over, survive a leader kill, and recover.

Everything runs as real processes on 127.0.0.1: etcd, vLLM-compatible simulators
(two replicas per region), one region agent per region, and two control-plane
replicas that elect a leader through etcd. Faults are real: processes are SIGKILLed.

    python -m chaos.demo            # about a minute; prints states as they change
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import yaml
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.local_etcd import EtcdServer
from chaos.procs import Proc, free_port, start_agent, start_controlplane, start_simulator

REGIONS = ("us-east", "us-west", "us-central")
REPLICAS_PER_REGION = 2
STATE = {
    pb.NORMAL: "NORMAL",
    pb.DEGRADED: "DEGRADED",
    pb.FAILING_OVER: "FAILING_OVER",
    pb.RECOVERED: "RECOVERED",
}
HEALTH = {
    pb.HEALTHY: "HEALTHY",
    pb.HEALTH_DEGRADED: "DEGRADED",
    pb.UNHEALTHY: "UNHEALTHY",
    pb.UNKNOWN: "UNKNOWN",
}


def demo_topology(
    etcd_endpoints: tuple[str, ...], agent_ports: dict[str, int]
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
        "prewarm": {"budget_s": 30},
    }


@dataclass
class Demo:
    workdir: Path
    json_out: bool = False
    t0: float = field(default_factory=time.monotonic)
    procs: list[Proc] = field(default_factory=list)
    sims: dict[str, list[Proc]] = field(default_factory=dict)
    sim_ports: dict[str, list[int]] = field(default_factory=dict)
    cps: dict[str, Proc] = field(default_factory=dict)
    timeline: list[tuple[float, str]] = field(default_factory=list)
    last_view: str = ""

    def t(self) -> float:
        return time.monotonic() - self.t0

    def say(self, msg: str) -> None:
        self.timeline.append((round(self.t(), 2), msg))
        print(f"\n[t+{self.t():5.1f}s] == {msg}", flush=True)

    # ---- processes ---------------------------------------------------------------------
    def start_region(self, region: str, cp_targets: list[str], agent_port: int) -> None:
        ports = self.sim_ports.setdefault(region, [free_port() for _ in range(REPLICAS_PER_REGION)])
        sims = [start_simulator(port=p, name=f"{region}-vllm{i}") for i, p in enumerate(ports)]
        self.sims[region] = sims
        self.procs += sims
        agent = start_agent(
            region=region,
            control_planes=cp_targets,
            replicas=[s.url for s in sims],
            interval=0.5,
            timeout=0.4,
            listen=f"127.0.0.1:{agent_port}",
        )
        self.procs.append(agent)

    def restart_sims(self, region: str) -> None:
        sims = [
            start_simulator(port=p, name=f"{region}-vllm{i}")
            for i, p in enumerate(self.sim_ports[region])
        ]
        self.sims[region] = sims
        self.procs += sims

    def stop_all(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.kill()

    # ---- view ----------------------------------------------------------------------------
    def render(self, st: pb.StatusResponse) -> str:
        lines = [f"leader={st.leader or '-'}  paused={'yes' if st.paused else 'no'}"]
        lines.append(f"  {'region':<11} {'state':<13} {'health':<10} {'steps':<15} routing")
        for r in st.regions:
            routing = " ".join(
                f"{k} {v:.0%}" for k, v in sorted(r.routing.items(), key=lambda kv: -kv[1])
            )
            steps = r.failover_steps_done or (
                f"recovery {r.recovery_step}/{r.recovery_steps}" if r.recovery_steps else ""
            )
            lines.append(
                f"  {r.name:<11} {STATE.get(r.state, '?'):<13} "
                f"{HEALTH.get(r.health, '?'):<10} {steps:<15} {routing}"
            )
        return "\n".join(lines)

    async def status(self, stubs: list[pb_grpc.ControlPlaneStub]) -> pb.StatusResponse:
        """Ask any replica that answers: the on-call view survives a dead replica."""
        last: Exception | None = None
        for stub in stubs:
            try:
                st: pb.StatusResponse = await stub.GetStatus(pb.GetStatusRequest(), timeout=1.0)
                return st
            except grpc.aio.AioRpcError as e:
                last = e
        raise RuntimeError(f"no control-plane replica answers: {last}")

    def show(self, st: pb.StatusResponse) -> None:
        """Print the live view whenever it changed."""
        view = self.render(st)
        if view != self.last_view:
            print(f"[t+{self.t():5.1f}s] {view}", flush=True)
            self.last_view = view

    async def wait_for(
        self, stubs: list[pb_grpc.ControlPlaneStub], what: str, pred: object, within: float
    ) -> pb.StatusResponse:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError):
                st = await self.status(stubs)
                self.show(st)
                if pred(st):  # type: ignore[operator]
                    return st
            await asyncio.sleep(0.05)
        raise TimeoutError(f"timed out after {within:.0f}s waiting for: {what}")


def region(st: pb.StatusResponse, name: str) -> pb.RegionStatus:
    found: pb.RegionStatus = next(r for r in st.regions if r.name == name)
    return found


async def run_demo(demo: Demo) -> dict[str, object]:
    print("starting etcd ...", flush=True)
    etcd = EtcdServer()
    await asyncio.to_thread(etcd.start)
    try:
        agent_ports = {r: free_port() for r in REGIONS}
        cp_ports = {"cp-1": free_port(), "cp-2": free_port()}
        cp_targets = [f"127.0.0.1:{p}" for p in cp_ports.values()]
        topo_path = demo.workdir / "topology.yaml"
        topo_path.write_text(yaml.safe_dump(demo_topology(etcd.endpoints, agent_ports)))
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

        channels = [grpc.aio.insecure_channel(t) for t in cp_targets]
        stubs = [pb_grpc.ControlPlaneStub(c) for c in channels]  # type: ignore[no-untyped-call]
        figures: dict[str, object] = {}
        try:
            demo.say("waiting for steady state: every region HEALTHY under one leader")
            st = await demo.wait_for(
                stubs,
                "steady state",
                lambda s: bool(s.leader) and all(r.health == pb.HEALTHY for r in s.regions),
                30,
            )
            demo.say(f"steady: leader is {st.leader}")

            victim = "us-east"
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
                f"{victim} healthy for the dwell time: graduated recovery, 25 % of new "
                "sessions per step"
            )
            st = await demo.wait_for(
                stubs, f"{victim} NORMAL", lambda s: region(s, victim).state == pb.NORMAL, 60
            )
            figures["recovery_s"] = round(time.monotonic() - t_back, 2)
            demo.say(
                f"{victim} back to NORMAL {figures['recovery_s']}s after its replicas returned"
            )

            hist = await stubs[0 if st.leader == "cp-1" else 1].GetHistory(
                pb.HistoryRequest(region=victim, limit=100)
            )
            path = [
                f"{STATE[e.decision.from_state]}->{STATE[e.decision.to_state]}"
                for e in hist.events
                if e.action == "transition"
            ]
            figures["transitions"] = path
            figures["audit_entries"] = len(hist.events)
            return figures
        finally:
            for c in channels:
                await c.close()
    finally:
        demo.stop_all()
        await asyncio.to_thread(etcd.stop)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m chaos.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tectonic-demo-"))
    demo = Demo(workdir=workdir, json_out=args.json)
    try:
        figures = asyncio.run(run_demo(demo))
    except (TimeoutError, RuntimeError) as e:
        print(f"\nDEMO FAILED: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; all demo processes stopped", file=sys.stderr)
        return 130
    expected = ["NORMAL->FAILING_OVER", "FAILING_OVER->RECOVERED", "RECOVERED->NORMAL"]
    ok = figures.get("transitions") == expected
    print("\n== summary")
    for t, msg in demo.timeline:
        print(f"  t+{t:5.1f}s  {msg}")
    print(
        f"  figures: detect {figures['detect_s']}s, failover {figures['failover_s']}s, "
        f"leader takeover {figures['leader_takeover_s']}s, recovery {figures['recovery_s']}s"
    )
    print(
        f"  us-east path: {' , '.join(figures['transitions'])}"  # type: ignore[arg-type]
        f"  ({figures['audit_entries']} audit entries)"
    )
    print(f"  verdict: {'PASS' if ok else 'FAIL'}")
    if args.json:
        print(json.dumps({"demo": "blackout", "passed": ok, **figures}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
