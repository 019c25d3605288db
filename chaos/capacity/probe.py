"""The capacity probe: the I/O loop around the pure parts of
``controlplane.kernel.capacity.bearing`` (``ProbePlan``, ``SustainedSearch``, ``analyze``).

Given one replica's URL (out of rotation: this module neither picks, wakes nor parks
it), :func:`probe_capacity`

0. reads the replica (``replica_info``: model, engine version, ``max_model_len``, the
   serving configuration) and fits the workload to its context (prompts capped so a
   request never draws a context-length 400; one that does is a workload error,
   counted apart, never an overload error);
1. probes the **cold** workload (every prompt unique) in three parts:

   - **screening**: steps of ``step_s`` from an empty queue (longer where fewer than
     ``min_screen_requests`` would arrive), climbing by ``growth`` until one misses
     the SLA: the lowest is the knee's baseline; where the SLA breaks even before a
     backlog builds bounds the ultimate from above;
   - **saturation**: one step at ``saturation_factor`` x that rate: what the replica
     completes per second when it cannot keep up (``stats.saturation_rps``). Nothing
     at or above it is sustained;
   - **sustained steps** at the rates ``SustainedSearch`` asks for: a warm-up of three
     queue relaxation times at that rate (derived from the measured saturation:
     ``sustained_timing``), then a judged window; within the SLA only when the
     first-token p99 and errors over the window meet it **and** the replica kept up
     (served about what arrived, no growing backlog: ``keeps_up``). The ultimate is
     the highest rate held so, never above the saturation; the knee the same way;

   between steps the replica drains to idle (``running`` and ``waiting`` from its
   ``/metrics``), timed; a failure step ends the climb; a step whose load generator
   fell behind (its lag p99 over ``max_lag_s``: it shares the cores) runs again, up to
   ``behind_retries`` times, every attempt reported, unless its verdict stands anyway
   (failure, or p99 past twice the SLO); past ``budget_s`` or ``max_sustained`` steps
   no further sustained step runs (the bracket so far stands, said in the log);
2. probes the **warm** workload (shared prefixes) the same way, once one request per
   prefix has cached them, screening from the same low rate and then the cold
   ultimate;
3. reads each probe's hit rate from the replica's own prefix-cache counters (their
   deltas over the probe) and fits ``R(h) = R_base / (1 - beta h)`` over the two
   ultimates (``fit_hit_effect``);
4. measures **T_recover**: one step at ``overload_factor`` x the cold ultimate, then
   the allowed rate (ultimate / factor of safety) for ``recover_s``, timed until
   sliding windows of first-token p99 and errors are within the SLA again (None, with
   ``t_recover_window_s`` set: it did not recover within ``recover_s``);
5. with a second URL, probes both replicas at once for the scaling efficiency: cold,
   each replica offered the same arrivals at the same per-replica rate (its own unique
   prompts), the SLA judged over both, up to the single ultimate (sustained steps
   timed by the single replica's saturation); the pair's ultimate per replica over the
   single one's, at most 1 (see :func:`chaos.capacity.verdicts.scaling`);
6. returns a ``CapacityRecord`` (the wasted-work share over every request it sent).

It stops with :class:`ProbeAborted` (a clear outcome, with the steps so far) when a
probe's lowest step already misses the SLA or meets the failure criteria, when the
replica is not idle before it starts (in rotation?), does not drain, restarts, or
exposes no prefix-cache counters.

Every step of a probe sends the same requests at the same unit arrivals scaled by
its rate (``chaos.capacity.workload``): steps differ only by the rate and length.

Where each part lives: the settings :mod:`chaos.capacity.probe_config`; a step
:mod:`chaos.capacity.steps`; a phase's screening, saturation and sustained steps
:mod:`chaos.capacity.phases`; T_recover :mod:`chaos.capacity.recovery`; the pair
:mod:`chaos.capacity.pair`; the replicas' ``/metrics`` :mod:`chaos.capacity.replica_watch`
and :mod:`chaos.capacity.prefix_cache`. This module runs them in order.
"""

from __future__ import annotations

import time

from chaos.capacity.load import LoadGenerator
from chaos.capacity.pair import pair_scaling
from chaos.capacity.phases import run_phase
from chaos.capacity.probe_config import ProbeConfig
from chaos.capacity.recovery import measure_recovery
from chaos.capacity.replica_info import read_replica
from chaos.capacity.replica_watch import ReplicaWatch
from chaos.capacity.results import workload_errors
from chaos.capacity.stats import wasted_share
from chaos.capacity.steps import StepRunner
from chaos.capacity.verdicts import AbortCause, Phase, ProbeAborted, Progress, fit_cache_effect
from chaos.capacity.workload import Workload, fit_context
from controlplane.kernel.capacity.record import CapacityRecord


async def probe_capacity(
    url: str,
    config: ProbeConfig,
    workload: Workload,
    *,
    pair_url: str | None = None,
    progress: Progress | None = None,
) -> CapacityRecord:
    """Probe the replica at ``url`` (see the module doc); raises :class:`ProbeAborted`."""
    if pair_url is not None and pair_url.rstrip("/") == url.rstrip("/"):
        raise ValueError(f"pair_url must be another replica than {url}")
    started = time.monotonic()
    async with LoadGenerator(config.request_timeout_s) as gen:
        info = await read_replica(gen.http, url, config.model)
        limits = [info.max_model_len]
        if pair_url is not None:
            limits.append((await read_replica(gen.http, pair_url, info.model)).max_model_len)
        known = [n for n in limits if n is not None]
        try:
            workload = fit_context(workload, min(known) if known else None)
        except ValueError as e:
            raise ProbeAborted(AbortCause.UNREADABLE, None, f"the workload: {e}") from e
        watch = ReplicaWatch(gen.http, config.drain_timeout_s, config.poll_s)
        runner = StepRunner(config, workload, gen, watch, progress, info.model, started=started)
        urls = [url] if pair_url is None else [url, pair_url]
        await watch.drain(urls, None)
        cold = await run_phase(runner, Phase.COLD, [url], False, config.hint_rps)
        warm = await run_phase(runner, Phase.WARM, [url], True, cold.curve.ultimate_rps)
        r_base, beta = fit_cache_effect(
            (cold.hit_rate, cold.curve.ultimate_rps),
            (warm.hit_rate, warm.curve.ultimate_rps),
            config.min_hit_spread,
        )
        t_recover = None
        if config.measure_recovery:
            t_recover = await measure_recovery(
                runner, url, cold.curve.ultimate_rps, cold.curve.steps[0]
            )
        efficiency, measured, unmeasured = await pair_scaling(runner, cold, urls)
    return CapacityRecord(
        region=config.region,
        measured_at=time.time(),
        engine_version=info.engine_version,
        model=info.model,
        serving=info.serving,
        replica=url,
        slo=config.slo,
        factor_of_safety=config.factor_of_safety,
        probes=(cold.hit_probe(config.step_s), warm.hit_probe(config.step_s)),
        r_base_rps=r_base,
        beta=beta,
        t_recover_s=t_recover,
        t_recover_window_s=config.recover_s if config.measure_recovery else None,
        workload_errors=workload_errors(runner.results),
        wasted_work_share=wasted_share(runner.results),
        scaling_efficiency=efficiency,
        scaling_measured=measured,
        scaling_unmeasured=unmeasured,
        active_replicas=config.active_replicas,
        profile=workload.profile,
        probe_s=time.monotonic() - started,
        prober=config.prober,
    )
