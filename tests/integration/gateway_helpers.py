"""The harness of the gateway's process tests (tests/integration/test_gateway_*.py): a
deployment on a real etcd (a topology file, simulator processes per region, gateways
started as processes) and the requests and reads those tests make.

Fixtures: ``procs_cleanup`` (kills every process of the deployments made), ``deployment``
(two simulators per region, east and west, no gateway yet), ``http`` (a client
session). A test module imports the ones it uses (and those they use), so that pytest
finds them there.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import yaml

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, spawn, start_simulators, until
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.resolve import SessionPin
from controlplane.kernel.store.port import Store
from regions.pool.processes import read_ready

REGIONS = ("east", "west")
HALF = Routing(targets={"east": 0.5, "west": 0.5}, epoch=1)  # new east sessions split


# ---- deployment helpers ----------------------------------------------------------------


@dataclass
class Deployment:
    cluster: str
    topology: Path
    etcd_endpoints: tuple[str, ...]
    sims: dict[str, list[Proc]] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    def gateway(self, region: str, *args: str) -> Proc:
        proc = spawn(
            [
                "-m",
                "regions.gateway",
                "--topology",
                str(self.topology),
                "--region",
                region,
                "--listen",
                "127.0.0.1:0",
                "--etcd-timeout",
                "0.3",
                "--store-timeout",
                "0.5",
                "--retry-deadline",
                "2",
                *args,
            ],
            f"gw-{region}",
            stdout_pipe=True,
        )
        self.procs.append(proc)
        proc.url = read_ready(proc, time.monotonic() + 30)
        return proc


def write_topology(
    path: Path,
    cluster: str,
    endpoints: Sequence[str],
    replicas: dict[str, list[str]],
    agent_ports: dict[str, int] | None = None,
    **extra: object,
) -> Path:
    topo = {
        "cluster": cluster,
        "etcd": {"endpoints": list(endpoints)},
        "regions": [
            {
                "name": r,
                "zone": "us",
                "capacity_rps": 100,
                "replicas": urls,
                "agent": f"127.0.0.1:{(agent_ports or {}).get(r, 9)}",
            }
            for r, urls in replicas.items()
        ],
        **extra,
    }
    path.write_text(yaml.safe_dump(topo))
    return path


def deploy(
    tmp: Path,
    cluster: str,
    endpoints: Sequence[str],
    per_region: int = 2,
    sim_args: Sequence[str] = (),
) -> Deployment:
    sims = start_simulators(per_region * len(REGIONS), extra_args=sim_args)
    by_region = {r: sims[i * per_region : (i + 1) * per_region] for i, r in enumerate(REGIONS)}
    path = write_topology(
        tmp / "topology.yaml",
        cluster,
        endpoints,
        {r: [p.url for p in ps] for r, ps in by_region.items()},
    )
    return Deployment(cluster, path, tuple(endpoints), by_region, list(sims))


@pytest.fixture
def procs_cleanup() -> Iterator[list[Deployment]]:
    made: list[Deployment] = []
    yield made
    for d in made:
        for p in d.procs:
            p.kill()


@pytest.fixture
def deployment(
    etcd: EtcdServer, cluster_name: str, tmp_path: Path, procs_cleanup: list[Deployment]
) -> Deployment:
    d = deploy(tmp_path, cluster_name, etcd.endpoints)
    procs_cleanup.append(d)
    return d


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


# ---- request helpers -------------------------------------------------------------------


async def complete(
    http: aiohttp.ClientSession, gw: str, session: str, prompt: str = "hello there"
) -> tuple[int, str]:
    """One small completion for ``session``: (status, serving region)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2}
    async with http.post(
        gw + "/v1/completions", json=body, headers={"x-session-id": session}
    ) as resp:
        await resp.read()
        return resp.status, resp.headers.get("x-tectonic-region", "")


async def health(http: aiohttp.ClientSession, gw: str) -> dict[str, object]:
    async with http.get(gw + "/health") as resp:
        data: dict[str, object] = await resp.json()
        return data


async def metric(http: aiohttp.ClientSession, gw: str, name: str) -> float:
    """Sum of a metric's samples (all label sets) on the gateway's /metrics."""
    async with http.get(gw + "/metrics") as resp:
        text = await resp.text()
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


async def pin_of(store: Store, keys: Keys, session: str) -> SessionPin | None:
    kv = await store.get(keys.session(session))
    return decode(SessionPin, kv.value, kv.key) if kv else None


async def set_routing(store: Store, keys: Keys, region: str, routing: Routing) -> int:
    return await store.put(keys.routing(region), encode(routing))


async def gateway_at(http: aiohttp.ClientSession, gw: str, revision: int) -> None:
    async def seen() -> bool:
        return int(str((await health(http, gw))["routing_revision"])) >= revision

    await until(seen, within=20, what=f"gateway {gw} at routing revision {revision}")
