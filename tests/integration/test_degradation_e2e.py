"""The degradation ladder end to end: a real latency fault on a simulator, the region
agent's first-token p99, the leader walking ``runbooks/degradation.yaml`` (its steps,
sped up) and writing ``degradation/<r>``, a gateway carrying the flags out, then
recovery in reverse once the fault is gone. The order is read from the audit trail."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from tectonic_api.v1 import controlplane_pb2 as pb

from chaos.lab.local_etcd import EtcdServer
from chaos.lab.procs import Proc, start_simulator, until
from controlplane.kernel.config import parse_topology
from controlplane.kernel.ladder.file import DEFAULT_PATH, load_ladder
from regions.agent.server import AgentConfig, serve_agent
from regions.gateway.app import AppConfig
from regions.gateway.server import GatewayOptions, GatewayServer
from tests.integration.cp_harness import fast_topology, running_replica

pytestmark = [pytest.mark.etcd, pytest.mark.slow]
BASELINE_S = 0.05  # every trigger (2x..4x baseline) fires under a 1 s added latency


@pytest.fixture
def sim() -> Iterator[Proc]:
    proc = start_simulator(extra_args=["--max-model-len", "32768"])
    yield proc
    proc.kill()


def fast_ladder(tmp_path: Path) -> Path:
    """The real file with a test baseline and short intervals: same steps, same order,
    but for those a latency fault cannot fire: shed-batch waits for the region to be
    past what it bears (``cbu_over``; tests/test_degradation_order.py walks it)."""
    data = yaml.safe_load(DEFAULT_PATH.read_text())
    data["steps"] = [s for s in data["steps"] if "cbu_over" not in s["trigger"]]
    assert len(data["steps"]) == 3
    data["baseline"]["ttft_p99_s"] = BASELINE_S
    data["degrade"]["step_interval_s"] = 1
    data["recovery"]["step_interval_s"] = 1
    path = tmp_path / "degradation.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


async def traffic(http: aiohttp.ClientSession, gw: GatewayServer, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        body = {"model": "tiny", "prompt": f"hello {n}", "max_tokens": 1}
        with contextlib.suppress(aiohttp.ClientError):
            async with http.post(gw.url + "/v1/completions", json=body) as r:
                await r.read()


async def test_a_latency_fault_walks_the_ladder_in_file_order_and_back(
    etcd: EtcdServer, cluster_name: str, sim: Proc, tmp_path: Path
) -> None:
    ladder = load_ladder(fast_ladder(tmp_path))
    data = fast_topology(etcd.endpoints, cluster_name).model_dump(mode="json")
    data["regions"][0]["replicas"] = [sim.url]  # east
    # The control plane hands the agent this threshold in the answers to its reports.
    data["regions"][0]["degraded_when"] = {"ttft_p99_over_s": 0.5}
    # The fault here is latency alone: room enough that the test's own traffic (four
    # senders, ~100 rps once the fault is gone) never fires a step by load.
    data["regions"][0]["capacity_rps"] = 100_000
    data["timing"]["quorum"] = 1
    topo = parse_topology(data)
    async with running_replica(topo, ladder=ladder) as cp, aiohttp.ClientSession() as http:
        agent = await serve_agent(
            AgentConfig(
                region="east",
                replicas=(sim.url,),
                control_planes=(cp.target,),
                interval=0.25,
                timeout=0.25,
            )
        )
        gw = GatewayServer(GatewayOptions(topology=topo, app=AppConfig(home="east")))
        await gw.start()
        stop = asyncio.Event()
        senders = [asyncio.create_task(traffic(http, gw, stop)) for _ in range(4)]
        try:
            async with http.post(sim.url + "/_sim/fault", json={"added_latency_s": 1.0}) as r:
                assert r.status == 200

            async def history() -> list[tuple[str, str]]:
                h = await cp.stub.GetHistory(pb.HistoryRequest(region="east", limit=200))
                return [
                    (e.action, e.details["step"])
                    for e in h.events
                    if e.action.startswith("ladder_")
                ]

            async def all_applied() -> bool:
                return [a for a, _ in await history()].count("ladder_apply") == len(ladder.names)

            await until(all_applied, within=60, every=0.25, what="every ladder step applied")
            # What on-call sees: the steps in status (failoverctl status, the dashboard).
            st = await cp.stub.GetStatus(pb.GetStatusRequest())
            east = next(r for r in st.regions if r.name == "east")
            assert list(east.degradation_steps) == list(ladder.names)
            # The gateway carries the context cap out: a ~20K-token chat (80K chars) is refused.
            long_chat = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "tell me everything. " * 4_000}],
            }
            async with http.post(gw.url + "/v1/chat/completions", json=long_chat) as r:
                assert r.status == 400 and "degraded" in (await r.text()).lower()

            async with http.delete(sim.url + "/_sim/fault") as r:
                assert r.status == 200

            async def all_restored() -> bool:
                return [a for a, _ in await history()].count("ladder_restore") == len(ladder.names)

            await until(all_restored, within=60, every=0.25, what="every step restored")
            steps = await history()
            applied = [s for a, s in steps if a == "ladder_apply"]
            restored = [s for a, s in steps if a == "ladder_restore"]
            assert applied == list(ladder.names)  # the file's order
            assert restored == list(reversed(ladder.names))  # and back
            async with http.post(gw.url + "/v1/chat/completions", json=long_chat) as r:
                assert r.status == 200, await r.text()  # every feature is back
        finally:
            stop.set()
            await asyncio.gather(*senders, return_exceptions=True)
            await gw.stop()
            await agent.stop(grace=0)
