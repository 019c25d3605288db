"""Against real simulator processes (which answer as vLLM 0.32 does): the probe's
reader finds the replica's context and serving configuration, the workload fitted to a
4,096-token context is served without one 400 while the unfitted one's long prompts
come back as workload errors (never overload errors), and the agent's reading of a
replica's configuration makes a record stale once ``max_num_seqs`` changes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import aiohttp
import pytest

from chaos.capacity.load import LoadGenerator, Planned
from chaos.capacity.replica_info import read_replica
from chaos.capacity.results import Outcome, RequestResult, workload_errors
from chaos.capacity.workload import Workload, fit_context, requests
from chaos.lab.procs import Proc, start_simulator, start_simulators
from controlplane.kernel.capacity.bearing import CapacitySLO
from controlplane.kernel.capacity.record import (
    CapacityPolicy,
    CapacityRecord,
    CapacitySource,
    HitProbe,
    WorkloadProfile,
    resolve,
)
from regions.agent.engine_version import EngineVersions, refresh_versions
from regions.agent.probe_vllm import ReplicaProbe
from regions.simulator.server import VERSION

pytestmark = pytest.mark.timeout(60)

PROFILE = WorkloadProfile(
    prompt_tokens_p50=2500, prompt_tokens_p90=6000, output_tokens=4, shared_prefix_share=0.5
)
WORKLOAD = Workload(PROFILE, prefix_tokens=1000, prefixes=2)
FAST = ["--max-model-len", "4096", "--prefill-tokens-per-s", "1000000"]


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Proc]]:
    """Two replicas of one model, as before and after a restart with more slots."""
    procs = start_simulators(2, extra_args=FAST)
    yield procs
    for p in procs:
        p.kill()


@pytest.fixture(scope="module")
def sim16() -> Iterator[Proc]:
    proc = start_simulator(extra_args=[*FAST, "--max-num-seqs", "16"], name="sim16")
    yield proc
    proc.kill()


async def send(
    gen: LoadGenerator, url: str, workload: Workload, model: str, n: int
) -> list[RequestResult]:
    reqs = requests(workload, n, warm=True, seed=7, tag=f"ctx{time.monotonic_ns()}")
    plan = [Planned(0.01 * i, url, r.body(model), r.prompt_tokens) for i, r in enumerate(reqs)]
    return await gen.run(plan)


async def test_the_fitted_workload_is_served_without_one_400(sims: list[Proc]) -> None:
    url = sims[0].url
    async with LoadGenerator(20.0) as gen:
        info = await read_replica(gen.http, url, None)
        assert info.model == "tiny" and info.engine_version == VERSION
        assert info.max_model_len == 4096
        assert info.serving.max_num_seqs == 8  # the simulator's default, from /server_info
        assert info.serving.cache["block_size"] == "16"
        fitted = fit_context(WORKLOAD, info.max_model_len)
        results = await send(gen, url, fitted, info.model, 40)
        assert [r.status for r in results if r.status != 200] == []
        assert all(r.ok for r in results), [r.detail for r in results if not r.ok][:3]
        # What the replica counted (usage) fits its context with the output.
        assert max(r.prompt_tokens for r in results) + PROFILE.output_tokens <= 4096

        # Unfitted, the long prompts are refused: workload errors, not overload.
        results = await send(gen, url, WORKLOAD, info.model, 40)
    refused = [r for r in results if r.status == 400]
    assert refused and workload_errors(results) == len(refused)
    assert all(r.outcome is Outcome.WORKLOAD and not r.overload_error for r in refused)
    assert "maximum context length" in refused[0].detail
    assert not any(r.overload_error for r in results)


async def test_the_agent_reports_a_changed_max_num_seqs_and_the_record_goes_stale(
    sims: list[Proc], sim16: Proc
) -> None:
    async with aiohttp.ClientSession() as http:
        measured = await read_replica(http, sims[0].url, None)
        probe = HitProbe(hit_rate=0, baseline_p99_s=0.1, ultimate_rps=5, ultimate_bounded=True)
        record = CapacityRecord(
            region="east",
            measured_at=time.time(),
            engine_version=measured.engine_version,
            model=measured.model,
            replica=sims[0].url,
            slo=CapacitySLO(ttft_p99_s=1.0),
            factor_of_safety=2.0,
            probes=(probe,),
            r_base_rps=5.0,
            beta=0.0,
            profile=PROFILE,
            serving=measured.serving,
        )

        async def region(urls: list[str]) -> tuple[str, str]:
            versions = EngineVersions()
            probes = [ReplicaProbe(url=u, up=True) for u in urls]
            await refresh_versions(versions, http, probes, time.monotonic(), 2.0)
            return versions.region_version(probes), versions.region_serving(probes)

        def judged(engine: str, serving: str) -> tuple[CapacitySource, str]:
            b = resolve(
                "east",
                record,
                capacity_rps=1.0,
                policy=CapacityPolicy(),
                now=time.time(),
                active_replicas=None,
                engine_version=engine,
                serving_config=serving,
            )
            return b.source, b.reason

        engine, serving = await region([s.url for s in sims])  # as probed
        assert engine == VERSION and "max_num_seqs=8" in serving
        assert serving == measured.fingerprint
        assert judged(engine, serving)[0] is CapacitySource.MEASURED
        # The same engine, restarted with more slots: stale, and the reason says why.
        engine, serving = await region([sim16.url])
        assert engine == VERSION and "max_num_seqs=16" in serving
        source, reason = judged(engine, serving)
        assert source is CapacitySource.STALE and "max_num_seqs 8 -> 16" in reason
        # Mid-rollout (one of each) no probe's single value matches either.
        engine, serving = await region([sims[1].url, sim16.url])
        source, reason = judged(engine, serving)
        assert source is CapacitySource.STALE and "max_num_seqs 8 -> 16|8" in reason
