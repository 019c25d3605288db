"""The failover bench's deployment: one simulator process per replica of three
regions, one region agent per region and two control-plane replica processes, on
one etcd, with the bench's topology. With ``pools`` above 1, every region holds that
many model pools (docs/models.md), each with its own simulators (serving its model's
name) and agent. ``Deployment.close()`` kills them all."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench._common import BenchError, kill_all, write_topology
from chaos.lab.procs import (
    Proc,
    launch_simulator,
    start_agent,
    start_controlplane,
    wait_ready,
)
from regions.pool.processes import free_port

REGIONS = ("us-east", "us-west", "us-central")
CONTROL_PLANES = ("cp-1", "cp-2")
CLUSTER = "bench"
PROBE_INTERVAL_S = 1.0
FAILURE_THRESHOLD = 3
LOOP_PERIOD_S = 1.0
AGENT_INTERVAL_S = 1.0
AGENT_TIMEOUT_S = 0.5


def units(pools: int) -> tuple[str, ...]:
    """The failover units: the regions, or with pools each region's ``p1``...``pN``."""
    if pools <= 1:
        return REGIONS
    return tuple(f"{r}.p{i}" for r in REGIONS for i in range(1, pools + 1))


def units_of(region: str, pools: int) -> tuple[str, ...]:
    return tuple(u for u in units(pools) if u.split(".", 1)[0] == region)


def model_of(unit: str) -> str:
    """A pool's model name (its pool's name with a prefix); "tiny" without pools."""
    return f"model-{unit.split('.', 1)[1]}" if "." in unit else "tiny"


def _region(
    region: str, pools: int, agents: dict[str, int], replicas: dict[str, list[str]]
) -> dict[str, object]:
    def serving(unit: str) -> dict[str, object]:
        return {
            "agent": f"127.0.0.1:{agents[unit]}",
            "capacity_rps": 100,
            "replicas": replicas[unit],
        }

    if pools <= 1:
        return {"name": region, "zone": "us", **serving(region)}
    return {
        "name": region,
        "zone": "us",
        "pools": [
            {"name": u.split(".", 1)[1], "models": [model_of(u)], **serving(u)}
            for u in units_of(region, pools)
        ],
    }


def topology_data(
    endpoint: str,
    agents: dict[str, int],
    replicas: dict[str, list[str]],
    lease_ttl_s: int,
    pools: int = 1,
) -> dict[str, object]:
    """The bench topology: detection as in production (1 s x 3), fast recovery."""
    retry_timeout = min(2.0, (lease_ttl_s - LOOP_PERIOD_S) / 2)
    return {
        "cluster": CLUSTER,
        "etcd": {"endpoints": [endpoint]},
        "regions": [_region(r, pools, agents, replicas) for r in REGIONS],
        "timing": {
            "probe_interval_s": PROBE_INTERVAL_S,
            "failure_threshold": FAILURE_THRESHOLD,
            "success_threshold": 2,
            "quorum": 2,
            "loop_period_s": LOOP_PERIOD_S,
            "retry_timeout_s": retry_timeout,
            "lease_ttl_s": lease_ttl_s,
            "degraded_dwell_s": 1.0,
            "recovery_dwell_s": 1.0,
            "failover_cooldown_s": 0.0,
        },
        "recovery": {"step_percent": 50, "step_interval_s": 0.5},
    }


def _start_all(starters: Sequence[Callable[[], Proc]]) -> list[Proc]:
    """Run blocking starters in parallel; if one fails, kill those that started."""
    with ThreadPoolExecutor(max_workers=max(1, len(starters))) as pool:
        futures = [pool.submit(s) for s in starters]
    started = [f.result() for f in futures if f.exception() is None]
    errors = [e for f in futures if (e := f.exception()) is not None]
    if errors:
        kill_all(started)
        raise BenchError(f"a process did not start: {errors[0]}") from errors[0]
    return started


def _start_simulators(ports: Sequence[int], unit: str) -> list[Proc]:
    procs = [
        launch_simulator(port=p, name=f"sim-{unit}-{i}", model=model_of(unit))
        for i, p in enumerate(ports)
    ]
    try:
        return [wait_ready(p) for p in procs]
    except BaseException:
        kill_all(procs)
        raise


@dataclass
class Deployment:
    """Simulators, agents and control-plane replicas on one etcd; ``close()`` kills all."""

    etcd_endpoint: str
    workdir: Path
    lease_ttl_s: int
    replicas: int = 1
    pools: int = 1  # model pools per region; 1: regions without pools
    sims: dict[str, list[Proc]] = field(default_factory=dict)
    sim_ports: dict[str, list[int]] = field(default_factory=dict)
    agents: dict[str, Proc] = field(default_factory=dict)
    cps: dict[str, Proc] = field(default_factory=dict)
    cp_ports: dict[str, int] = field(default_factory=dict)
    topology_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.topology_path = self.workdir / "topology.yaml"

    @property
    def units(self) -> tuple[str, ...]:
        return units(self.pools)

    def start(self) -> None:
        all_units = self.units
        for u in all_units:
            self.sims[u] = _start_simulators([0] * self.replicas, u)
            self.sim_ports[u] = [p.port for p in self.sims[u]]
        agent_ports = {u: free_port() for u in all_units}
        self.cp_ports = {c: free_port() for c in CONTROL_PLANES}
        urls = {u: [p.url for p in self.sims[u]] for u in all_units}
        data = topology_data(self.etcd_endpoint, agent_ports, urls, self.lease_ttl_s, self.pools)
        write_topology(self.topology_path, data)
        cp_targets = [f"127.0.0.1:{p}" for p in self.cp_ports.values()]
        starters = [self._agent_starter(u, agent_ports[u], cp_targets) for u in all_units]
        self.agents = dict(zip(all_units, _start_all(starters), strict=True))
        cps = _start_all([self._cp_starter(c) for c in CONTROL_PLANES])
        self.cps = dict(zip(CONTROL_PLANES, cps, strict=True))

    def _agent_starter(self, region: str, port: int, cps: list[str]) -> Callable[[], Proc]:
        replicas = [p.url for p in self.sims[region]]
        return lambda: start_agent(
            region=region,
            control_planes=cps,
            replicas=replicas,
            interval=AGENT_INTERVAL_S,
            timeout=AGENT_TIMEOUT_S,
            listen=f"127.0.0.1:{port}",
        )

    def _cp_starter(self, replica_id: str) -> Callable[[], Proc]:
        listen = f"127.0.0.1:{self.cp_ports[replica_id]}"
        return lambda: start_controlplane(self.topology_path, replica_id, listen=listen)

    def kill_region(self, region: str) -> float:
        """SIGKILL every simulator of ``region`` (all its pools); returns when the first
        signal left."""
        procs = [p for u in units_of(region, self.pools) for p in self.sims[u]]
        t0 = time.monotonic()
        for p in procs:
            p.popen.send_signal(signal.SIGKILL)
        for p in procs:
            p.kill()  # reap
        return t0

    def restore_region(self, region: str) -> None:
        """Restart the region's simulators on their old ports (its agents probe those)."""
        for u in units_of(region, self.pools):
            self.sims[u] = _start_simulators(self.sim_ports[u], u)

    def kill_cp(self, replica_id: str) -> float:
        proc = self.cps[replica_id]
        t0 = time.monotonic()
        proc.popen.send_signal(signal.SIGKILL)
        proc.kill()
        return t0

    def restart_cp(self, replica_id: str) -> None:
        self.cps[replica_id] = self._cp_starter(replica_id)()

    def log_tails(self, tail: int = 1500) -> str:
        procs = [*self.cps.values(), *self.agents.values()]
        return "\n".join(f"--- {p.name} (pid {p.pid})\n{p.log(tail)}" for p in procs)

    def close(self) -> None:
        procs = [*self.cps.values(), *self.agents.values()]
        kill_all(procs + [p for ps in self.sims.values() for p in ps])
