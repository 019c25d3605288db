"""The capacity probe (chaos/capacity/probe.py) against real simulator processes.

The simulator's latency model fixes what a replica sustains: 4 slots, FIFO, prefill at
1,000 tokens/s, 3 more output tokens at 100 tokens/s. The probe must find an ultimate
load near, and never far above, what the replica sustains (the bench's steady-state
model of that scheduler, ``bench.capacity.compute_truth``; a loose band: sustained
steps cut short for a test on a shared machine), and a replica then loaded for 60 s at
its ultimate and at its allowed load must keep the SLA and serve what is offered. It
reads each probe's hit rate from the replica's counters (0 where caching is off: never
assumed), and stops with a clear outcome at the failure criteria. Probed together with
a replica of half the slots, a replica scales below 1.0, measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from bench.capacity import Options, compute_truth, services
from chaos.capacity.load import LoadGenerator, RequestResult
from chaos.capacity.probe import probe_capacity
from chaos.capacity.probe_config import ProbeConfig
from chaos.capacity.stats import sustained_figures
from chaos.capacity.steps import plan_requests
from chaos.capacity.verdicts import AbortCause, Phase, ProbeAborted, StepReport
from chaos.capacity.workload import Workload, arrivals
from chaos.lab.procs import Proc, start_simulator
from controlplane.kernel.capacity.bearing import CapacitySLO, keeps_up
from controlplane.kernel.capacity.record import CapacityRecord, WorkloadProfile
from regions.dataplane.admission_bound import InflightBound, inflight_bound

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SLOTS, PREFILL, DECODE = 4, 1000.0, 100.0
PROFILE = WorkloadProfile(
    prompt_tokens_p50=200,
    prompt_tokens_p90=200,
    output_tokens=4,
    shared_prefix_share=0.9,
    source="test",
)
WORKLOAD = Workload(PROFILE, prefix_tokens=150, prefixes=2)
SLO = CapacitySLO(ttft_p99_s=0.6)
MODEL = Options(
    step_s=0.8, slots=SLOTS, prefill_rate=PREFILL, decode_rate=DECODE, prompt_p50=200,
    prompt_p90=200, output_tokens=4, shared_share=0.9, prefix_tokens=150, prefixes=2,
    slo_s=SLO.ttft_p99_s, seed=7, start_rps=4.0, truth_requests=100_000,
)  # fmt: skip
HOLD_S, HOLD_WARMUP_S = 60.0, 10.0
# A p99 read from ~500 requests moves by a few per cent between runs of one rate.
P99_SAMPLING = 1.05


def sim_args(*extra: str) -> list[str]:
    return [
        "--max-num-seqs", str(SLOTS),
        "--prefill-tokens-per-s", str(PREFILL),
        "--decode-tokens-per-s", str(DECODE),
        "--log-level", "WARNING",
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, Proc]]:
    procs = {
        "cache": start_simulator(extra_args=sim_args(), name="sim-cache"),
        "nocache": start_simulator(
            extra_args=sim_args("--no-enable-prefix-caching"), name="sim-nocache"
        ),
        # the same model on half the slots: a pair with it bears less per replica
        "half": start_simulator(
            extra_args=[*sim_args(), "--max-num-seqs", str(SLOTS // 2)], name="sim-half"
        ),
    }
    yield procs
    for p in procs.values():
        p.terminate()


def config(**changes: object) -> ProbeConfig:
    base: dict[str, object] = {
        "region": "r",
        "slo": SLO,
        "step_s": 0.8,
        "start_rps": 4.0,
        "precision": 0.2,
        "max_steps": 8,
        "request_timeout_s": 10.0,
        "drain_timeout_s": 20.0,
        "recover_s": 2.0,
        "recover_window_s": 0.5,
        "seed": 7,
        "prober": "test",
        "min_requests": 60,  # sustained steps of a few seconds: a test's, not a drill's
        "max_warmup_s": 4.0,
        "max_measure_s": 5.0,
    }
    return ProbeConfig(**{**base, **changes})  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def failing_half(url: str) -> AsyncIterator[None]:
    """The simulator at ``url`` fails half its requests while the block runs."""
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/_sim/fault", json={"error_rate": 0.5}) as r:
            assert r.status == 200
        try:
            yield
        finally:
            async with http.delete(url + "/_sim/fault") as r:
                assert r.status == 200


@pytest.fixture(scope="module")
async def probed(sims: dict[str, Proc]) -> AsyncIterator[tuple[CapacityRecord, list[StepReport]]]:
    reports: list[StepReport] = []
    # longer sustained steps here: its figures are judged against the truth. Probed
    # together with the half-slot replica: the pair's steps come last, after the single
    # replica's (and its recovery), so they change none of its figures
    tuned = config(min_requests=100, max_warmup_s=6.0, max_measure_s=8.0)
    record = await probe_capacity(
        sims["cache"].url,
        tuned,
        WORKLOAD,
        pair_url=sims["half"].url,
        progress=reports.append,
    )
    yield record, reports


async def test_the_probe_finds_what_the_replica_sustains_never_far_above(
    probed: tuple[CapacityRecord, list[StepReport]],
) -> None:
    record, reports = probed
    cold, warm = record.probes
    truth = compute_truth(MODEL)
    for measured, true in ((cold, truth.cold), (warm, truth.warm)):
        assert measured.ultimate_bounded
        # a probe that errs errs low: never far above what the replica sustains
        assert 0.6 * true.ultimate_rps <= measured.ultimate_rps <= 1.1 * true.ultimate_rps
        assert measured.saturation_rps == pytest.approx(true.saturation_rps, rel=0.2)
        assert measured.ultimate_rps <= measured.saturation_rps
        assert measured.knee_rps is None or measured.knee_rps <= measured.ultimate_rps * 1.0001
        # only sustained steps (a warm-up, then a judged window) decide
        held = [s for s in measured.steps if s.warmup_s is not None]
        assert held and all(s.served_ratio is not None for s in held)
        # each step's knee limit follows its own requests' unloaded p99 (a fitted line)
        assert all(s.unloaded_p99_s is not None and s.unloaded_p99_s > 0 for s in measured.steps)
    assert warm.ultimate_rps > cold.ultimate_rps
    assert 0.3 < record.beta <= 0.99
    assert record.r_base_rps == pytest.approx(cold.ultimate_rps, rel=0.2)
    assert record.allowed_rps(0.0, 1) == pytest.approx(record.r_base_rps / 2)
    assert record.t_recover_s is not None and record.t_recover_s >= 0
    assert record.wasted_work_share == 0.0  # nothing failed
    assert record.engine_version == "0.32.0+sim" and record.model == "tiny"
    # the workload as sent: the prompts capped to fit the replica's 4,096-token context
    assert record.profile == PROFILE.model_copy(update={"max_prompt_tokens": 3625})
    assert record.probe_s > 0 and record.workload_errors == 0
    # progress: every step of every phase, in order, with its verdict; the curve keeps
    # the lowest step and the sustained ones (screening and saturation only bound it)
    first = [r for r in reports if r.attempt == 0]  # not the steps run again
    phases = [r.phase for r in first if r.phase is not Phase.PAIR]
    assert phases[0] is Phase.COLD and phases[-2:] == [Phase.OVERLOAD, Phase.RECOVER]
    assert all(r.phase is Phase.PAIR for r in first[len(phases) :])  # the pair's, last
    for phase, probe in ((Phase.COLD, cold), (Phase.WARM, warm)):
        kinds = [r.kind.value for r in first if r.phase is phase]
        assert kinds[0] == "screen" and "saturation" in kinds
        assert kinds.count("sustained") + 1 == len(probe.steps)
    assert {r.verdict.value for r in reports} >= {"over the SLA"}
    assert record.t_recover_window_s == 2.0
    # what etcd would store reads back the same
    assert CapacityRecord.model_validate_json(record.model_dump_json()) == record
    json.dumps(record.model_dump(mode="json"))


async def hold(url: str, rate: float, seed: int) -> list[RequestResult]:
    """HOLD_S seconds of cold Poisson arrivals at ``rate``."""
    offsets = arrivals(rate, HOLD_S, seed)
    plan = plan_requests(WORKLOAD, "tiny", seed, [url], offsets, warm=False, tag=f"hold{seed}")
    async with LoadGenerator(10.0) as gen:
        return await gen.run(plan)


async def test_a_replica_held_60_s_at_the_ultimate_and_at_the_allowed_load_keeps_the_sla(
    probed: tuple[CapacityRecord, list[StepReport]], sims: dict[str, Proc]
) -> None:
    """What the probe claims, held for a minute: the cold ultimate on the probed
    replica, the allowed load on its twin (the same slots and speeds; cold prompts hit
    no cache either way), at once. Judged after a warm-up of HOLD_WARMUP_S."""
    record, _ = probed
    cold = record.probes[0]
    rates = {"ultimate": cold.ultimate_rps, "allowed": record.allowed_rps(0.0, 1)}
    urls = {"ultimate": sims["cache"].url, "allowed": sims["nocache"].url}
    results = await asyncio.gather(
        *(hold(urls[k], rates[k], seed=40 + i) for i, k in enumerate(rates))
    )
    for (what, rate), rs in zip(rates.items(), results, strict=True):
        step = sustained_figures(rs, rate, HOLD_WARMUP_S, HOLD_S - HOLD_WARMUP_S, 10.0)
        s = step.figures.step
        assert s.error_rate == 0.0 and s.timeouts == 0, (what, s)
        assert s.p99_ttft_s <= SLO.ttft_p99_s * P99_SAMPLING, (what, rate, s)
        assert keeps_up(s, SLO), (what, rate, s)  # served what was offered, no backlog


async def test_each_step_records_its_mean_in_flight_for_admissions_bound(
    probed: tuple[CapacityRecord, list[StepReport]],
) -> None:
    record, _ = probed
    for probe in record.probes:
        ordered = sorted(probe.steps, key=lambda s: s.offered_rps)
        held = [s.mean_inflight for s in ordered if s.mean_inflight is not None]
        assert len(held) == len(ordered) and all(h > 0 for h in held)
        # Little's law: in flight ~ rate x a request's time, so the highest step holds
        # more than the lowest
        assert held[-1] > held[0]
    bound = inflight_bound(record)
    assert isinstance(bound, InflightBound) and bound.limit >= 1
    assert bound.rate_rps == pytest.approx(record.r_base_rps)


async def test_the_hit_rates_are_read_from_the_replicas_counters(
    probed: tuple[CapacityRecord, list[StepReport]], sims: dict[str, Proc]
) -> None:
    record, _ = probed
    cold, warm = record.probes
    expected = services(MODEL, WORKLOAD, 400, warm=True, tag="m")
    share = sum(s.hit_tokens for s in expected) / sum(s.prompt_tokens for s in expected)
    assert cold.hit_rate < 0.02  # unique prompts
    assert warm.hit_rate == pytest.approx(share, abs=0.05)
    # the same workload on a replica that caches nothing: 0 at both, no cache effect. Only
    # the counters matter here, so screening starts a step up (8 rps: its lowest step
    # is half as long, and still well within the SLA)
    flat = await probe_capacity(
        sims["nocache"].url,
        config(step_s=0.4, start_rps=8.0, max_steps=3, measure_recovery=False, budget_s=0.1),
        WORKLOAD,
    )
    assert [p.hit_rate for p in flat.probes] == [0.0, 0.0]
    assert flat.beta == 0.0 and flat.r_base_rps == flat.probes[0].ultimate_rps


async def test_the_probe_aborts_at_the_failure_criteria(sims: dict[str, Proc]) -> None:
    url = sims["nocache"].url
    reports: list[StepReport] = []
    async with failing_half(url):
        with pytest.raises(ProbeAborted) as caught:
            await probe_capacity(url, config(step_s=2.0), WORKLOAD, progress=reports.append)
    aborted = caught.value
    assert aborted.cause is AbortCause.FAILURE and aborted.phase is Phase.COLD
    assert "failure criteria" in str(aborted)
    # it stopped at the first step: nothing higher was offered
    assert [s.offered_rps for s in aborted.steps] == [4.0]
    assert aborted.steps[0].error_rate > 0.05
    assert {r.verdict.value for r in reports} == {"failure"}  # each attempt of that step


async def test_a_pair_with_a_weaker_replica_scales_below_one(
    probed: tuple[CapacityRecord, list[StepReport]], sims: dict[str, Proc]
) -> None:
    """Both loaded at once at the single probe's per-replica rates, the SLA judged over
    both: the half-slot replica's queue breaks it below the single ultimate."""
    with pytest.raises(ValueError, match="another replica"):
        await probe_capacity(sims["cache"].url, config(), WORKLOAD, pair_url=sims["cache"].url)
    record, reports = probed
    cold = record.probes[0]
    assert record.scaling_measured and 0 < record.scaling_efficiency < 0.9
    pair = [r for r in reports if r.phase is Phase.PAIR]
    assert pair and max(r.offered_rps for r in pair) <= cold.ultimate_rps  # its ceiling
    # bracketed below it: a step there missed the SLA or fell behind
    assert any(r.verdict.value in ("over the SLA", "not keeping up") for r in pair)
    assert record.replica == sims["cache"].url


async def test_a_pair_probe_that_aborts_costs_only_the_scaling_efficiency(
    sims: dict[str, Proc],
) -> None:
    """The second replica fails half its requests: the pair's first step meets the
    failure criteria. Before, that abort threw away the single replica's whole probe."""
    pair_url = sims["nocache"].url
    reports: list[StepReport] = []
    async with failing_half(pair_url):
        record = await probe_capacity(
            sims["cache"].url,
            # the single probe's figures do not matter here: screening bounds them, from a
            # step up (8 rps: each phase's lowest step, the pair's too, is half as long)
            config(start_rps=8.0, measure_recovery=False, budget_s=0.1),
            WORKLOAD,
            pair_url=pair_url,
            progress=reports.append,
        )
    pair = [r.verdict.value for r in reports if r.phase is Phase.PAIR]
    assert pair and set(pair) == {"failure"}  # its lowest step (each attempt), no higher
    assert not record.scaling_measured and record.scaling_efficiency == 1.0
    assert "pair's probe aborted" in record.scaling_unmeasured
    assert "failure criteria" in record.scaling_unmeasured
    cold, warm = record.probes
    assert cold.ultimate_rps > 0 and warm.hit_rate > cold.hit_rate  # the single probe stands
