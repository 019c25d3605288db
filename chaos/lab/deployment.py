"""A whole Tectonic deployment on one machine, as real processes on 127.0.0.1.

etcd (one member or three), per region a few vLLM-compatible simulators (or real
vLLM servers started elsewhere and passed in), a region agent and a session-affinity
gateway, and several control-plane replicas electing a leader through etcd. The demo
and the drills run on it, and its methods are the faults a drill may inject: they
stop and start real processes by PID, or call the simulator's own fault endpoint.

Every process serves Prometheus ``/metrics`` over HTTP: control planes on
``--http-listen`` (with the live dashboard at ``/``), agents on ``--metrics-listen``,
gateways and vLLM servers on their own port. The ports are chosen once, so a process
restarted by a drill comes back where a scraper looks for it: ``metrics_targets``
lists them by job, ``dashboard_urls`` gives each control plane's dashboard.
"""

from __future__ import annotations

import contextlib
import json
import logging
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from chaos.lab.local_etcd import EtcdCluster
from chaos.lab.procs import (
    Proc,
    launch_simulator,
    start_agent,
    start_controlplane,
    start_gateway,
    wait_ready,
)
from chaos.lab.vllm_cpu import VllmProc, launch_vllm, wait_vllm
from controlplane.kernel.config import DegradedWhen
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder_file import DEFAULT_PATH as LADDER_PATH
from regions.pool.processes import free_port

log = logging.getLogger("chaos.lab.deployment")

REGIONS = ("us-east", "us-west", "us-central")
# vLLM's flag too: each answer says how many prompt tokens hit the prefix cache, which
# is how the pre-warm is verified while live traffic runs on the same replicas.
SIM_ARGS = ("--enable-prompt-tokens-details",)
LAB_DEGRADED_WHEN = DegradedWhen(error_rate_over=0.05, ttft_p99_over_s=1.5)
# Real vLLM start-up: ~20 s alone, but three at once, or one beside two busy ones, on two
# cores have taken over 110 s here.
VLLM_START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DeploymentSpec:
    # "simulator": the vLLM-compatible simulator; "vllm": a real vLLM server (the CPU
    # build from .venv-vllm here; scripts/setup_vllm_cpu.sh installs it).
    server: Literal["simulator", "vllm"] = "simulator"
    regions: tuple[str, ...] = REGIONS
    replicas_per_region: int = 2
    etcd_members: int = 1
    controlplanes: int = 2
    sim_args: tuple[str, ...] = SIM_ARGS
    # The regions' DEGRADED thresholds (the topology's degraded_when, which the control
    # plane hands each agent): without them a region is DEGRADED only for a replica
    # down, and the ladder only acts for failover targets short of headroom.
    degraded_when: DegradedWhen = LAB_DEGRADED_WHEN
    agent_args: tuple[str, ...] = ()  # more flags for every agent
    # The ladder the control plane walks: the runbook's own steps in its own order,
    # with timings compressed for a drill on one machine (None: no ladder).
    ladder_from: Path | None = LADDER_PATH
    ladder_step_interval_s: float = 1.0
    ladder_baseline_ttft_p99_s: float = 0.25
    ladder_reorder: tuple[int, ...] = ()  # tests only: a misbehaving ladder (indices)
    lease_ttl_s: int = 3  # the leader's lease
    prewarm_hold_s: float = 0.0  # benches only: hold each failover in its pre-warm step


def local_topology(
    spec: DeploymentSpec,
    etcd_endpoints: tuple[str, ...],
    agent_ports: dict[str, int],
    sim_ports: dict[str, list[int]],
    ladder: Path | None,
) -> dict[str, object]:
    """The production shape, compressed so that a failover and its recovery take a
    minute: short probe intervals, a 3 s leader lease, 25 % recovery steps."""
    topo: dict[str, object] = {
        "cluster": f"local-{uuid.uuid4().hex[:6]}",
        "etcd": {"endpoints": list(etcd_endpoints)},
        "regions": [
            {
                "name": r,
                "zone": "us",
                "agent": f"127.0.0.1:{agent_ports[r]}",
                "capacity_rps": 60 if i == 2 else 120,
                "replicas": [f"http://127.0.0.1:{p}" for p in sim_ports[r]],
                "degraded_when": spec.degraded_when.model_dump(exclude_none=True),
            }
            for i, r in enumerate(spec.regions)
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
            "lease_ttl_s": spec.lease_ttl_s,
        },
        "recovery": {"step_percent": 25, "step_interval_s": 1.0},
        # A dozen shared system prompts make a few dozen prefix levels: the top 1 % of
        # so few is one prefix, so a local deployment warms the top quarter.
        "prewarm": {
            "budget_s": 30,
            "top_fraction": 0.25,
            "verify": 4,
        },
        # The traffic's system prompts are ~400 characters: a level every 32 tokens
        # (real vLLM on CPU caches whole 128-token blocks: a level per block).
        "prefixes": {
            "block_size": 128 if spec.server == "vllm" else 16,
            "level_tokens": 128 if spec.server == "vllm" else 32,
            "export_interval_s": 1.0,
            "aggregate_interval_s": 1.0,
        },
    }
    if ladder is not None:
        topo["degradation_ladder"] = str(ladder)
    return topo


def compressed_ladder(spec: DeploymentSpec, out: Path) -> Path | None:
    """A copy of the runbook's ladder with drill timings (and, for tests that must see
    a drill fail, its steps reordered)."""
    if spec.ladder_from is None:
        return None
    data = yaml.safe_load(spec.ladder_from.read_text())
    data["degrade"]["step_interval_s"] = spec.ladder_step_interval_s
    data["recovery"]["step_interval_s"] = spec.ladder_step_interval_s
    data["recovery"]["step_percent"] = 25
    data["baseline"]["ttft_p99_s"] = spec.ladder_baseline_ttft_p99_s
    if spec.ladder_reorder:
        data["steps"] = [data["steps"][i] for i in spec.ladder_reorder]
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


@dataclass
class LocalDeployment:
    spec: DeploymentSpec
    workdir: Path
    etcd: EtcdCluster | None = None
    topology_path: Path = field(init=False)
    keys: Keys = field(default_factory=Keys)
    sim_ports: dict[str, list[int]] = field(default_factory=dict)
    sims: dict[str, list[Proc | None]] = field(default_factory=dict)
    agents: dict[str, Proc] = field(default_factory=dict)
    gateways: dict[str, Proc] = field(default_factory=dict)
    cp_ports: dict[str, int] = field(default_factory=dict)
    cp_http_ports: dict[str, int] = field(default_factory=dict)  # --http-listen
    agent_metrics_ports: dict[str, int] = field(default_factory=dict)  # --metrics-listen
    cps: dict[str, Proc | None] = field(default_factory=dict)
    killed_etcd: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.topology_path = self.workdir / "topology.yaml"

    # ---- inventory ---------------------------------------------------------------------
    @property
    def etcd_endpoints(self) -> tuple[str, ...]:
        assert self.etcd is not None
        return self.etcd.endpoints

    @property
    def cp_targets(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.cp_ports.values()]

    @property
    def gateway_urls(self) -> dict[str, str]:
        return {r: g.url for r, g in self.gateways.items()}

    @property
    def dashboard_urls(self) -> dict[str, str]:
        """Each control-plane replica's live dashboard (any replica serves it)."""
        return {rid: f"http://127.0.0.1:{p}/" for rid, p in self.cp_http_ports.items()}

    def metrics_targets(self) -> dict[str, list[str]]:
        """``host:port`` of every ``/metrics`` endpoint, by job (controlplane, agent,
        gateway, vllm), running or not: the ports stay the same across restarts."""
        host = "127.0.0.1"
        return {
            "controlplane": [f"{host}:{p}" for p in self.cp_http_ports.values()],
            "agent": [f"{host}:{p}" for p in self.agent_metrics_ports.values()],
            "gateway": [f"{host}:{g.port}" for g in self.gateways.values()],
            "vllm": [f"{host}:{p}" for ports in self.sim_ports.values() for p in ports],
        }

    def replica_urls(self, region: str) -> list[str]:
        """Every configured server of ``region``, running or not (their ports are fixed)."""
        return [f"http://127.0.0.1:{p}" for p in self.sim_ports[region]]

    def every_process(self) -> list[Proc]:
        procs = [p for sims in self.sims.values() for p in sims if p is not None]
        procs += [*self.agents.values(), *self.gateways.values()]
        return procs + [p for p in self.cps.values() if p is not None]

    # ---- start and stop ------------------------------------------------------------------
    def start_etcd(self) -> None:
        self.etcd = EtcdCluster(self.spec.etcd_members).start()

    def write_topology(self) -> None:
        agent_ports = {r: free_port() for r in self.spec.regions}
        self.sim_ports = {
            r: [free_port() for _ in range(self.spec.replicas_per_region)]
            for r in self.spec.regions
        }
        self.cp_ports = {f"cp-{i + 1}": free_port() for i in range(self.spec.controlplanes)}
        self.cp_http_ports = {rid: free_port() for rid in self.cp_ports}
        self.agent_metrics_ports = {r: free_port() for r in self.spec.regions}
        ladder = compressed_ladder(self.spec, self.workdir / "degradation.yaml")
        topo = local_topology(self.spec, self.etcd_endpoints, agent_ports, self.sim_ports, ladder)
        self.keys = Keys(str(topo["cluster"]))
        self.topology_path.write_text(yaml.safe_dump(topo))
        self._agent_ports = agent_ports

    def start_region(self, region: str) -> None:
        """Its servers, then (the first time) its agent."""
        self.start_servers(region)
        if region not in self.agents:
            self.agents[region] = start_agent(
                region=region,
                control_planes=self.cp_targets,
                replicas=self.replica_urls(region),
                interval=0.5,
                timeout=0.4,
                listen=f"127.0.0.1:{self._agent_ports[region]}",
                extra_args=(
                    *self.spec.agent_args,
                    "--metrics-listen",
                    f"127.0.0.1:{self.agent_metrics_ports[region]}",
                ),
            )

    def start_controlplane(self, rid: str) -> None:
        self.cps[rid] = start_controlplane(
            self.topology_path,
            rid,
            listen=f"127.0.0.1:{self.cp_ports[rid]}",
            extra_args=["--http-listen", f"127.0.0.1:{self.cp_http_ports[rid]}"],
            prewarm_hold_s=self.spec.prewarm_hold_s,
        )

    def start_gateway(self, region: str) -> None:
        self.gateways[region] = start_gateway(
            self.topology_path,
            region,
            control_planes=self.cp_targets,
            extra_args=["--retry-deadline", "2", "--report-interval", "0.5"],
        )

    def stop(self) -> None:
        for p in self.every_process():
            with contextlib.suppress(Exception):
                p.kill()
        if self.etcd is not None:
            self.etcd.stop()

    # ---- faults and their undo ------------------------------------------------------------
    def start_servers(self, region: str) -> list[str]:
        """Start every server of ``region`` that is not running; returns their URLs."""
        current = self.sims.setdefault(region, [None] * len(self.sim_ports[region]))
        launched: list[tuple[int, Proc]] = []
        for i, port in enumerate(self.sim_ports[region]):
            proc = current[i]
            if proc is None or not proc.alive():
                name = f"{region}-vllm{i}"
                if self.spec.server == "vllm":
                    launched.append((i, launch_vllm(port, name=name, extra_args=SIM_ARGS)))
                else:
                    sim = launch_simulator(port=port, name=name, extra_args=self.spec.sim_args)
                    launched.append((i, sim))
        for i, proc in launched:  # all spawned first: they start in parallel
            if isinstance(proc, VllmProc):
                current[i] = wait_vllm(proc, timeout=VLLM_START_TIMEOUT_S)
            else:
                current[i] = wait_ready(proc)
        return [p.url for _, p in launched]

    def stop_servers(self, region: str, count: int | None = None) -> list[int]:
        """SIGKILL ``count`` (default all) running servers of ``region``; their PIDs."""
        pids: list[int] = []
        for proc in self.sims.get(region, []):
            if proc is not None and proc.alive() and (count is None or len(pids) < count):
                pids.append(proc.pid)
                proc.kill()
        return pids

    def inject(self, region: str, fault: dict[str, object]) -> list[str]:
        """The simulator's fault endpoint on every running server of ``region``."""
        return self._each_server(region, "POST", json.dumps(fault).encode())

    def clear_faults(self, region: str) -> list[str]:
        return self._each_server(region, "DELETE", None)

    def _each_server(self, region: str, method: str, body: bytes | None) -> list[str]:
        if self.spec.server != "simulator":
            raise RuntimeError(
                "fault injection is the simulator's /_sim/fault endpoint; a real vLLM has "
                "none (drills on real vLLM can stop and kill servers)"
            )
        done = []
        for proc in self.sims.get(region, []):
            if proc is None or not proc.alive():
                continue
            req = urllib.request.Request(
                proc.url + "/_sim/fault",
                data=body,
                method=method,
                headers={"content-type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=3) as r:
                r.read()
            done.append(proc.url)
        return done

    def kill_controlplane(self, rid: str) -> int:
        proc = self.cps.get(rid)
        if proc is None:
            raise KeyError(f"no control-plane replica {rid!r} (have {', '.join(self.cps)})")
        pid = proc.pid
        proc.kill()
        return pid

    def start_controlplanes(self) -> list[str]:
        """Start again every control-plane replica that is not running."""
        started = []
        for rid, proc in self.cps.items():
            if proc is None or not proc.alive():
                self.start_controlplane(rid)
                started.append(rid)
        return started

    def kill_etcd_member(self) -> int:
        """SIGKILL one etcd member, the raft leader when it can be told (the harder
        case: the survivors must elect); returns its index."""
        assert self.etcd is not None
        if len(self.etcd.members) < 3:
            raise RuntimeError("killing an etcd member needs a cluster of 3 (etcd_members=3)")
        live = [i for i, m in enumerate(self.etcd.members) if m.running()]
        leader = self.etcd.leader_index()
        i = leader if leader is not None else live[0]
        self.etcd.kill_member(i)
        self.killed_etcd.append(i)
        return i

    def start_etcd_members(self) -> list[int]:
        assert self.etcd is not None
        started = []
        for i in sorted(set(self.killed_etcd)):
            self.etcd.restart_member(i)
            started.append(i)
        self.killed_etcd.clear()
        return started
