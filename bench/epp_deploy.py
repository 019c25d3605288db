"""``python -m bench epp``'s deployment: a real etcd holding one region's ``routing/``,
two fast simulators, one endpoint picker, one Envoy per path (``direct``: Envoy alone;
``header``, ``body``, ``full_duplex``: Envoy and the picker in that body mode) and
Tectonic's gateway; and the check, from Envoy's counters, that the picker routed every
request of its paths."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._common import BenchError, Reporter, kill_all, write_routing, write_topology
from bench.gateway import FAST_SIM
from chaos.lab.envoy import BodyMode, EnvoyProc, EnvoySpec, start_envoy, stats
from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_gateway, start_picker, start_simulators
from regions.pool.processes import free_port

REGION = "bench"
CLUSTER = "bench-epp"
QUIET = ("--log-level", "WARNING")
# Envoy in front of the picker, by path; "gateway" has no Envoy.
PICKER_MODES: dict[str, BodyMode] = {
    "header": "none",
    "body": "buffered",
    "full_duplex": "full_duplex",
}
# Envoy's counters that say a request was routed by the picker, or went around it.
PICKED = "cluster.tectonic_picked.upstream_rq_total"
UNPICKED = "http.tectonic_inference.ext_proc.failure_mode_allowed"


@dataclass
class Deployed:
    urls: dict[str, str]  # path -> base URL
    envoys: dict[str, EnvoyProc]  # path -> its Envoy (every path but "gateway")
    pids: dict[str, int]  # "picker", "gateway", "sim0", "sim1" -> pid
    picker: Proc


def _topology(etcd: str, servers: Sequence[str]) -> dict[str, object]:
    return {
        "cluster": CLUSTER,
        "etcd": {"endpoints": [etcd]},
        "regions": [
            {
                "name": REGION,
                "zone": "z",
                "agent": "127.0.0.1:9",
                "capacity_rps": 100_000,
                "replicas": list(servers),
            }
        ],
    }


def _envoy(path: str, servers: Sequence[str], picker: str, workdir: Path) -> EnvoyProc:
    spec = EnvoySpec(
        listen_port=free_port(),
        admin_port=free_port(),
        pickers=[picker],
        servers=servers,
        body_mode=PICKER_MODES.get(path, "buffered"),
        direct=path == "direct",
    )
    return start_envoy(spec, workdir, name=f"envoy-{path}")


@contextlib.contextmanager
def deployment(tmp: Path, full_duplex: bool, say: Reporter) -> Iterator[Deployed]:
    """etcd, two simulators, a picker, one Envoy per path and a gateway."""
    procs: list[Proc] = []
    with EtcdServer() as etcd:
        try:
            sims = start_simulators(2, extra_args=FAST_SIM)
            procs += sims
            servers = [f"127.0.0.1:{s.port}" for s in sims]
            topo = write_topology(
                tmp / "topology.yaml", _topology(etcd.endpoint, [s.url for s in sims])
            )
            asyncio.run(write_routing(etcd.endpoint, CLUSTER, REGION))
            say.progress("starting the picker, the Envoys and the gateway")
            picker = start_picker(topo, REGION, extra_args=QUIET)
            procs.append(picker)
            paths = ["direct", "header", "body", *(["full_duplex"] if full_duplex else [])]
            envoys: dict[str, EnvoyProc] = {}
            for path in paths:
                envoys[path] = _envoy(path, servers, f"127.0.0.1:{picker.port}", tmp)
                procs.append(envoys[path])
            gateway = start_gateway(topo, REGION, extra_args=QUIET)
            procs.append(gateway)
            urls = {path: e.url for path, e in envoys.items()} | {"gateway": gateway.url}
            pids = {"picker": picker.pid, "gateway": gateway.pid}
            pids |= {f"sim{i}": s.pid for i, s in enumerate(sims)}
            yield Deployed(urls, envoys, pids, picker)
        finally:
            kill_all(procs)


def routed_by_the_picker(deployed: Deployed, before: Mapping[str, dict[str, int]]) -> None:
    """Every request on a picker path went where the picker said: none failed open."""
    for path, envoy in deployed.envoys.items():
        if path == "direct":
            continue
        now = stats(envoy.admin_url)
        unpicked = now.get(UNPICKED, 0) - before[path].get(UNPICKED, 0)
        picked = now.get(PICKED, 0) - before[path].get(PICKED, 0)
        if unpicked or not picked:
            raise BenchError(
                f"{path}: {unpicked} requests failed open around the picker, {picked} "
                f"routed by it; picker log:\n{deployed.picker.log(3000)}"
            )
