"""A gateway at N regions (issue 35, "the data plane at 512 pools"): ``bench scale``'s
gateway figures, from one real ``python -m regions.gateway`` on the topology the bench
wrote and the etcd it runs.

Every region gets ``routing/<r>`` (its traffic stays home), then the gateway starts:

- ``gateway_load_ms_<n>``: from spawning the process to its ``READY`` line (imports,
  the topology, balancers and metrics built, the first full read of ``routing/`` and
  ``pools/``, listening): what a supervisor waits for.
- ``gateway_rss_mb_<n>``: its resident memory (``VmRSS``) once loaded and polling;
  ``gateway_rss_mb_per_pool_<n>``: that less a one-region gateway's, per region.
- ``gateway_idle_cores_<n>``: CPU it uses with no request (the replica-load poller and
  the watches), over ``idle_s``.
- ``metrics_bytes_<n>``, ``metrics_samples_<n>``, ``metrics_ms_<n>``: one ``/metrics``
  scrape's size, sample lines and time (the client's, whole answer).
- ``health_ms_p50_<n>`` / ``health_ms_max_<n>``: ``/health`` idle (20 in a row);
  ``health_ms_during_scrape_<n>`` (p50) / ``..._max_<n>``: ``/health`` one after another
  while each of ``scrapes`` scrapes is under way, and ``health_answers_during_scrapes_<n>``
  how many were answered: a scrape that stalls the event loop leaves one answer per
  scrape, that waited for the whole render.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

from bench._common import cpu_seconds, percentile, write_topology
from chaos.lab.procs import Proc, spawn
from controlplane.kernel.codec import encode
from controlplane.kernel.config import load_topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Routing
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.settings import EtcdConfig
from regions.pool.processes import read_ready

READY_S = 120.0  # a gateway slower than this to load is broken, not slow
HEADLINE = ("gateway_load_ms_512", "gateway_rss_mb_512")


async def write_routings(etcd: str, cluster: str, regions: list[str]) -> None:
    """``routing/<r>`` for every region: what a gateway reads before it serves."""
    keys = Keys(cluster)
    async with EtcdStore(EtcdConfig(endpoints=(etcd,))) as store:
        for region in regions:
            await store.put(keys.routing(region), encode(Routing(targets={region: 1.0})))


def rss_mb(pid: int) -> float:
    """``VmRSS`` of ``pid`` in MB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _spawn(topology: Path, home: str) -> Proc:
    args = ["-m", "regions.gateway", "--topology", str(topology), "--region", home]
    args += ["--listen", "127.0.0.1:0", "--no-prefix-tracking", "--log-level", "WARNING"]
    return spawn(args, "bench-scale-gateway", stdout_pipe=True)


async def _get_ms(http: aiohttp.ClientSession, url: str) -> tuple[float, bytes]:
    started = time.monotonic()
    async with http.get(url) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status}")
    return (time.monotonic() - started) * 1000, body


async def _loaded(topology: Path, home: str) -> tuple[Proc, str, float]:
    """A started gateway, its URL and its load time (ms)."""
    started = time.monotonic()
    proc = _spawn(topology, home)
    try:
        url = await asyncio.to_thread(read_ready, proc, started + READY_S)
    except BaseException:
        proc.kill()
        raise
    return proc, url, (time.monotonic() - started) * 1000


async def _one_region_rss(topology: Path, etcd: str, idle_s: float) -> float:
    """RSS of a gateway of the same topology cut to its first region: the fixed cost."""
    data = yaml.safe_load(await asyncio.to_thread(topology.read_text))
    data["regions"] = data["regions"][:1]
    data["cluster"] = f"{data['cluster']}-one"
    with tempfile.TemporaryDirectory(prefix="bench-scale-gateway-") as tmp:
        path = write_topology(Path(tmp) / "topology.yaml", data)
        await write_routings(etcd, data["cluster"], [data["regions"][0]["name"]])
        proc, _, _ = await _loaded(path, data["regions"][0]["name"])
        try:
            await asyncio.sleep(idle_s)  # as long as the measured one idled
            return rss_mb(proc.pid)
        finally:
            proc.kill()


async def measure_gateway(
    n: int, topology_path: Path, etcd: str, *, idle_s: float = 5.0, scrapes: int = 3
) -> dict[str, object]:
    """The figures above (suffix ``_<n>``) for a gateway on ``topology_path`` (whose
    regions' routing this writes to ``etcd``), home its first region."""
    if idle_s <= 0 or scrapes < 1:
        raise ValueError("idle_s must be positive and scrapes at least 1")
    topo = load_topology(topology_path)
    names = [r.name for r in topo.regions]
    await write_routings(etcd, topo.cluster, names)
    proc, url, load_ms = await _loaded(topology_path, names[0])
    try:
        async with aiohttp.ClientSession() as http:
            await _get_ms(http, url + "/health")  # its first connection, out of the figures
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            await asyncio.sleep(idle_s)
            idle = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
            rss = rss_mb(proc.pid)
            health_ms = [(await _get_ms(http, url + "/health"))[0] for _ in range(20)]
            times, during, body = [], [], b""
            for _ in range(scrapes):
                scrape = asyncio.create_task(_get_ms(http, url + "/metrics"))
                await asyncio.sleep(0.02)  # the scrape's request is in, its render under way
                while not scrape.done():  # one /health after another until it is answered
                    during.append((await _get_ms(http, url + "/health"))[0])
                ms, body = await scrape
                times.append(ms)
    finally:
        proc.kill()
    one = await _one_region_rss(topology_path, etcd, idle_s)
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {
        f"gateway_load_ms_{n}": round(load_ms),
        f"gateway_rss_mb_{n}": rss,
        f"gateway_rss_mb_per_pool_{n}": round((rss - one) / max(1, n - 1), 3),
        f"gateway_idle_cores_{n}": round(idle, 3),
        f"metrics_bytes_{n}": len(body),
        f"metrics_samples_{n}": samples,
        f"metrics_ms_{n}": round(max(times), 1),
        f"health_ms_p50_{n}": _round(percentile(health_ms, 50)),
        f"health_ms_max_{n}": round(max(health_ms), 1),
        f"health_ms_during_scrape_{n}": _round(percentile(during, 50)),
        f"health_ms_during_scrape_max_{n}": _round(max(during, default=None)),
        f"health_answers_during_scrapes_{n}": len(during),
    }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


async def _main(n: int) -> dict[str, object]:
    """``python -m bench.scale_gateway N``: one size on its own etcd (bench scale's
    topology)."""
    # here, not at the top: bench/scale.py imports this module
    from bench.scale import _topology
    from chaos.lab.local_etcd import EtcdServer

    with EtcdServer() as etcd, tempfile.TemporaryDirectory(prefix="bench-scale-gw-") as tmp:
        path = write_topology(Path(tmp) / "topology.yaml", _topology(n, etcd.endpoint, 9, 9))
        return await measure_gateway(n, path, etcd.endpoint)


if __name__ == "__main__":
    import json
    import sys

    with contextlib.suppress(KeyboardInterrupt):
        print(json.dumps(asyncio.run(_main(int(sys.argv[1]) if len(sys.argv) > 1 else 512))))
