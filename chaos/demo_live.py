"""The demo's processes and its live view: who runs, and what the on-call sees.

``Demo`` owns every process the demo starts (simulators, agents, gateways, control
planes), its timeline of events, and the live view: region states, health, steps and
routing from the control plane, plus one line on the traffic (requests ok/failed,
sessions per serving region) when a traffic driver runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from tectonic_api.v1 import controlplane_pb2 as pb
from tectonic_api.v1 import controlplane_pb2_grpc as pb_grpc

from chaos.demo_traffic import Traffic
from chaos.procs import Proc, start_agent, start_gateway, start_simulator
from controlplane.keys import Keys
from controlplane.store.etcd import EtcdStore

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


# vLLM's flag too: each answer says how many prompt tokens hit the prefix cache, which
# is how the pre-warm is verified while live traffic runs on the same replicas.
SIM_ARGS = ("--enable-prompt-tokens-details",)


@dataclass
class Demo:
    workdir: Path
    json_out: bool = False
    t0: float = field(default_factory=time.monotonic)
    procs: list[Proc] = field(default_factory=list)
    sims: dict[str, list[Proc]] = field(default_factory=dict)
    sim_ports: dict[str, list[int]] = field(default_factory=dict)
    cps: dict[str, Proc] = field(default_factory=dict)
    gateways: dict[str, Proc] = field(default_factory=dict)
    traffic: Traffic | None = None
    timeline: list[tuple[float, str]] = field(default_factory=list)
    last_view: str = ""
    last_spread: str = ""
    last_traffic_print: float = 0.0
    etcd_endpoints: tuple[str, ...] = ()
    keys: Keys = field(default_factory=Keys)
    store: EtcdStore | None = None  # read-only: catalogs and records for the story

    def t(self) -> float:
        return time.monotonic() - self.t0

    def say(self, msg: str) -> None:
        self.timeline.append((round(self.t(), 2), msg))
        print(f"\n[t+{self.t():5.1f}s] == {msg}", flush=True)

    # ---- processes ---------------------------------------------------------------------
    def start_region(self, region: str, cp_targets: list[str], agent_port: int) -> None:
        ports = self.sim_ports[region]
        sims = [
            start_simulator(port=p, name=f"{region}-vllm{i}", extra_args=SIM_ARGS)
            for i, p in enumerate(ports)
        ]
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
            start_simulator(port=p, name=f"{region}-vllm{i}", extra_args=SIM_ARGS)
            for i, p in enumerate(self.sim_ports[region])
        ]
        self.sims[region] = sims
        self.procs += sims

    def start_gateway(self, topology: Path, region: str, cp_targets: list[str]) -> None:
        gw = start_gateway(
            topology,
            region,
            control_planes=cp_targets,
            extra_args=["--retry-deadline", "2", "--report-interval", "0.5"],
        )
        self.gateways[region] = gw
        self.procs.append(gw)

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
        """Print the live view whenever it changed; the traffic line with it, and on
        its own (at most once a second) when sessions moved or 3 s went by."""
        view = self.render(st)
        traffic = "" if self.traffic is None else self.traffic.line()
        spread = "" if self.traffic is None else self.traffic.distribution()
        now = time.monotonic()
        if view != self.last_view:
            print(f"[t+{self.t():5.1f}s] {view}", flush=True)
            if traffic:
                print(f"  {traffic}", flush=True)
            self.last_view = view
        elif traffic and (
            (spread != self.last_spread and now - self.last_traffic_print >= 1.0)
            or now - self.last_traffic_print >= 3.0
        ):
            print(f"[t+{self.t():5.1f}s] {traffic}", flush=True)
        else:
            return
        self.last_spread = spread
        self.last_traffic_print = now

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
