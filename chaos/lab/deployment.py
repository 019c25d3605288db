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
import os
import signal
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from chaos.lab.envoy import EnvoyProc, EnvoySpec, start_envoy
from chaos.lab.local_etcd import EtcdCluster
from chaos.lab.ports import LOCALHOST, reserved_port
from chaos.lab.procs import (
    Proc,
    launch_simulator,
    start_agent,
    start_controlplane,
    start_gateway,
    start_picker,
    wait_ready,
)
from chaos.lab.spec import (
    SIM_ARGS,
    SIM_MODEL,
    VLLM_START_TIMEOUT_S,
    DeploymentSpec,
    block_size,
    compressed_ladder,
    local_topology,
)
from chaos.lab.vllm_cpu import VllmProc, launch_vllm, wait_vllm
from controlplane.kernel.keys import Keys
from controlplane.kernel.prefix.sealing import generate_key

log = logging.getLogger("chaos.lab.deployment")

# Active-active: a drill through Envoy runs on the shipped shape, two pickers per Envoy.
PICKERS_PER_REGION = 2
# A picker must answer within Envoy's ext_proc message_timeout (1 s in the shipped file),
# or Envoy fails the request open: so it waits at most 0.5 s for etcd before serving from
# its cache (its default, 1 s, is the timeout itself). Seen on a loaded machine: requests
# failed open while etcd answered slowly, and one in a region that was down got a 503.
PICKER_ARGS = ("--report-interval", "0.5", "--store-timeout", "0.5")
# An agent with a warm pool launches its simulators before it serves (real vLLM servers:
# as long as they take to start).
POOL_AGENT_READY_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class PickerPorts:
    grpc: int  # ext_proc, what Envoy's picker cluster lists
    http: int  # /metrics and /health


@dataclass(frozen=True)
class EnvoyPorts:
    listen: int  # the region's entry: clients and the other regions' pickers
    admin: int  # /stats, /ready


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
        """Every configured server of ``region`` (or of a pool), running or not (their
        ports are fixed)."""
        return [f"http://127.0.0.1:{p}" for p in self._ports_of(region)]

    def _ports_of(self, name: str) -> list[int]:
        return [p for u in self.spec.units_of(name) for p in self.sim_ports[u]]

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
        units = self.spec.units

        def port() -> int:
            return reserved_port(taken)

        agent_ports = {u: port() for u in units}
        # warm pools: the agents launch their servers, none is the lab's
        replicas = range(0 if self.spec.warm_pool else self.spec.replicas_per_region)
        self.sim_ports = {u: [port() for _ in replicas] for u in units}
        self.cp_ports = {f"cp-{i + 1}": port() for i in range(self.spec.controlplanes)}
        self.cp_http_ports = {rid: port() for rid in self.cp_ports}
        self.agent_metrics_ports = {u: port() for u in units}
        if self.envoy:
            self._choose_envoy_ports()
        ladder = compressed_ladder(self.spec, self.workdir / "degradation.yaml")
        topo = local_topology(
            self.spec, self.etcd_endpoints, agent_ports, self.sim_ports, ladder, self.entries
        )
        self.keys = Keys(str(topo["cluster"]))
        self.topology_path.write_text(yaml.safe_dump(topo))
        if self.spec.sealed_payloads:
            for zone in {self.spec.zone_of(r) for r in self.spec.regions}:
                self.rotate_payload_key(zone)
        self._agent_ports = agent_ports

    # ---- sealed payloads (docs/residency.md) -------------------------------------------
    def payload_keys_dir(self, zone: str) -> Path:
        """``zone``'s key directory, as a Secret mounted only in its clusters would be."""
        return self.workdir / "payload-keys" / zone

    def payload_key_args(self, region: str) -> list[str]:
        """``--payload-keys`` for a process of ``region`` (none when nothing is sealed)."""
        if not self.spec.sealed_payloads:
            return []
        return ["--payload-keys", str(self.payload_keys_dir(self.spec.zone_of(region)))]

    def rotate_payload_key(self, zone: str) -> str:
        """A new key for ``zone``, made the active one (the older ones still open); its
        id. Processes read the directory on every use: no restart."""
        d = self.payload_keys_dir(zone)
        d.mkdir(parents=True, exist_ok=True)
        kid = f"{zone}-{sum(1 for f in d.iterdir() if f.name != 'active') + 1}"
        (d / kid).write_text(generate_key() + "\n")
        (d / "active").write_text(kid + "\n")
        return kid

    def remove_payload_key(self, zone: str, kid: str) -> None:
        (self.payload_keys_dir(zone) / kid).unlink()

    def _choose_envoy_ports(self) -> None:
        regions, taken = self.spec.regions, self._taken_ports

        def port() -> int:
            return reserved_port(taken)

        self.envoy_ports = {r: EnvoyPorts(port(), port()) for r in regions}
        self.picker_ports = {
            r: [PickerPorts(port(), port()) for _ in range(PICKERS_PER_REGION)] for r in regions
        }

    def start_region(self, region: str) -> None:
        """Its servers, then (the first time) its agent: with pools, each pool's."""
        self.start_servers(region)
        self._start_agents(region)

    def _start_agents(self, region: str) -> list[str]:
        """The agent of each unit of ``region`` that has none running; their units."""
        started = []
        for unit in self.spec.units_of(region):
            running = self.agents.get(unit)
            if running is not None and running.alive():
                continue
            started.append(unit)
            self.agents[unit] = start_agent(
                region=unit,
                control_planes=self.cp_targets,
                replicas=self.replica_urls(unit),
                interval=0.5,
                timeout=0.4,
                listen=f"127.0.0.1:{self._agent_ports[unit]}",
                extra_args=(
                    *self.spec.agent_args,
                    *self.payload_key_args(unit),
                    *self._pool_args(unit),
                    "--metrics-listen",
                    f"127.0.0.1:{self.agent_metrics_ports[unit]}",
                ),
                **(
                    {"ready_timeout": self._pool_ready_timeout(unit)} if self.spec.warm_pool else {}
                ),
            )
        return started

    def _pool_ready_timeout(self, unit: str) -> float:
        """How long ``unit``'s agent may take to launch its warm pool and serve."""
        pool = self.spec.warm_pool
        real = pool is not None and unit in pool.vllm_units
        return VLLM_START_TIMEOUT_S + 30.0 if real else POOL_AGENT_READY_TIMEOUT_S

    def _pool_args(self, unit: str) -> list[str]:
        """``--pool-config`` (written to the workdir), ``--etcd`` and ``--cluster`` for a
        unit's agent when the spec gives warm pools; none otherwise."""
        pool = self.spec.warm_pool
        if pool is None:
            return []
        config = pool.pool_config(
            self.spec.model_of(unit) or SIM_MODEL,
            block_size(self.spec),
            self.spec.sim_args,
            vllm=unit in pool.vllm_units,
        )
        path = self.workdir / f"pool-{unit}.yaml"
        path.write_text(yaml.safe_dump(config))
        endpoints = ",".join(self.etcd_endpoints)
        return ["--pool-config", str(path), "--etcd", endpoints, "--cluster", self.keys.cluster]

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
            extra_args=[
                "--retry-deadline",
                "2",
                "--report-interval",
                "0.5",
                *self.payload_key_args(region),
            ],
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
                    extra_args=[*PICKER_ARGS, *self.payload_key_args(region)],
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
            servers=[f"{LOCALHOST}:{p}" for p in self._ports_of(region)],
            remote_entry_points=[e for r, e in self.entries.items() if r != region],
        )
        self.envoys[region] = start_envoy(spec, self.workdir / "envoy", name=f"envoy-{region}")

    def stop(self) -> None:
        if self.spec.warm_pool is not None:
            self._stop_pool_agents()
        for p in self.every_process():
            with contextlib.suppress(Exception):
                p.kill()
        if self.etcd is not None:
            self.etcd.stop()

    def _stop_pool_agents(self) -> None:
        """A warm pool's simulators are its agent's children: SIGTERM lets the agent stop
        them; any left (the agent died first) are SIGKILLed by PID."""
        children = {pid for a in self.agents.values() for pid in _children(a.pid)}
        for agent in self.agents.values():
            with contextlib.suppress(Exception):
                agent.terminate(timeout=5.0)
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    # ---- faults and their undo ------------------------------------------------------------
    def start_servers(self, region: str) -> list[str]:
        """Start every server of ``region`` (or of a pool) that is not running; returns
        their URLs. A pool's servers serve its model's name. With warm pools: the agent
        of each unit whose agent a blackout killed (it launches its pool anew); returns
        those units."""
        if self.spec.warm_pool is not None:
            return self._start_agents(region) if self.agents else []
        launched: list[tuple[list[Proc | None], int, Proc]] = []
        for unit in self.spec.units_of(region):
            current = self.sims.setdefault(unit, [None] * len(self.sim_ports[unit]))
            model = self.spec.model_of(unit)
            for i, port in enumerate(self.sim_ports[unit]):
                proc = current[i]
                if proc is None or not proc.alive():
                    name = f"{unit}-vllm{i}"
                    if self.spec.server == "vllm":
                        proc = launch_vllm(port, name=name, extra_args=SIM_ARGS)
                    else:
                        proc = launch_simulator(
                            port=port,
                            name=name,
                            extra_args=self.spec.sim_args,
                            model=model or SIM_MODEL,
                        )
                    launched.append((current, i, proc))
        for current, i, proc in launched:  # all spawned first: they start in parallel
            if isinstance(proc, VllmProc):
                current[i] = wait_vllm(proc, timeout=VLLM_START_TIMEOUT_S)
            else:
                current[i] = wait_ready(proc)
        return [p.url for _, _, p in launched]

    def stop_servers(self, region: str, count: int | None = None) -> list[int]:
        """SIGKILL ``count`` (default all) running servers of ``region``; their PIDs."""
        if self.spec.warm_pool is not None:
            return self._stop_pools(region, count)
        pids: list[int] = []
        procs = [p for u in self.spec.units_of(region) for p in self.sims.get(u, [])]
        for proc in procs:
            if proc is not None and proc.alive() and (count is None or len(pids) < count):
                pids.append(proc.pid)
                proc.kill()
        return pids

    def _stop_pools(self, region: str, count: int | None) -> list[int]:
        """A warm pool's servers are its agent's children. All of them (a blackout): the
        agent is SIGKILLed with them, or it would launch them again at once; the unit
        goes dark as a region does (no server, no agent report) until start_servers.
        ``count``: that many of its servers, which the agent replaces."""
        pids: list[int] = []
        for unit in self.spec.units_of(region):
            agent = self.agents.get(unit)
            if agent is None or not agent.alive():
                continue
            children = _children(agent.pid)
            if count is None:
                pids.append(agent.pid)
                agent.kill()
            for pid in children[: None if count is None else max(0, count - len(pids))]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    pids.append(pid)
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
        for proc in (p for u in self.spec.units_of(region) for p in self.sims.get(u, [])):
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


def _children(pid: int) -> list[int]:
    """The PIDs of ``pid``'s children (Linux: /proc/<pid>/task/*/children)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found
