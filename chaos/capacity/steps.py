"""One step of the capacity probe: its requests sent at one rate, its figures read, the
replicas drained after it, reported; run again while the load generator fell behind
(late arrivals do not measure the replica). Every step of a probe sends the same
requests at the same unit arrivals scaled by its rate (:mod:`chaos.capacity.workload`):
steps differ only by the rate and length. The phases that choose the rates are
:mod:`chaos.capacity.phases`."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from chaos.capacity.load import LoadGenerator, Planned
from chaos.capacity.probe_config import ProbeConfig
from chaos.capacity.replica_watch import ReplicaWatch
from chaos.capacity.results import RequestResult, loaded, mean_inflight
from chaos.capacity.stats import (
    StepFigures,
    UnloadedTtft,
    fit_unloaded,
    step_figures,
    sustained_figures,
)
from chaos.capacity.verdicts import Phase, Progress, StepKind, StepReport, verdict
from chaos.capacity.workload import Workload, arrivals, requests, warmup_requests
from controlplane.kernel.capacity.bearing import Step, SustainedTiming, failed


def plan_requests(
    workload: Workload,
    model: str,
    seed: int,
    urls: Sequence[str],
    offsets: Sequence[float],
    *,
    warm: bool,
    tag: str,
) -> list[Planned]:
    """A step's requests: every replica the same arrivals (``offsets``) and the same
    request lengths, so that two replicas at once are loaded as one alone was; with
    several, each its own nonces (the tag), so that cold stays cold even where the
    replicas share a cache tier."""
    out = []
    for i, url in enumerate(urls):
        own = tag if len(urls) == 1 else f"{tag}:{i}"
        reqs = requests(workload, len(offsets), warm=warm, seed=seed, tag=own)
        out += [
            Planned(at, url, r.body(model), r.prompt_tokens)
            for at, r in zip(offsets, reqs, strict=True)
        ]
    return out


@dataclass
class StepRunner:
    """Runs a probe's steps and keeps what they measured: every request sent (the
    wasted-work share is over all of them), each step's in-flight and timing, each
    phase's unloaded first-token line."""

    config: ProbeConfig
    workload: Workload
    gen: LoadGenerator
    watch: ReplicaWatch
    progress: Progress | None
    model: str = ""
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    results: list[RequestResult] = field(default_factory=list)
    # each step's mean in-flight per replica (its last attempt), by phase and rate
    inflight: dict[tuple[Phase, float], float] = field(default_factory=dict)
    durations: dict[tuple[Phase, float], SustainedTiming] = field(default_factory=dict)
    # each phase's unloaded first-token line, fitted on its lowest step (the knee's limit)
    unloaded: dict[Phase, UnloadedTtft | None] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def over_budget(self) -> bool:
        """Past ``budget_s`` since the probe started: no further sustained step."""
        return time.monotonic() - self.started > self.config.budget_s

    def plan(
        self, urls: Sequence[str], offsets: Sequence[float], warm: bool, tag: str
    ) -> list[Planned]:
        return plan_requests(
            self.workload, self.model, self.config.seed, urls, offsets, warm=warm, tag=tag
        )

    def report(
        self,
        phase: Phase,
        index: int,
        figs: StepFigures,
        drain_s: float,
        baseline: Step,
        attempt: int = 0,
        kind: StepKind = StepKind.SCREEN,
        timing: SustainedTiming | None = None,
    ) -> StepReport:
        """The step's report, handed to ``progress`` (the log, the drill's status line)."""
        s = figs.step
        report = StepReport(
            phase=phase,
            index=index,
            offered_rps=s.offered_rps,
            p99_ttft_s=s.p99_ttft_s,
            error_rate=s.error_rate,
            throughput_rps=s.throughput_rps,
            timeouts=s.timeouts,
            requests=figs.requests,
            lag_p99_s=figs.lag_p99_s,
            generator_behind=figs.lag_p99_s > self.config.max_lag_s,
            drain_s=drain_s,
            verdict=verdict(s, baseline, self.config.slo),
            attempt=attempt,
            kind=kind,
            served_ratio=s.served_ratio,
            backlog_growth=s.backlog_growth,
            warmup_s=0.0 if timing is None else timing.warmup_s,
            duration_s=self.config.step_s if timing is None else timing.measure_s,
        )
        if self.progress is not None:
            self.progress(report)
        return report

    def behind(self, figs: StepFigures) -> bool:
        return figs.lag_p99_s > self.config.max_lag_s

    def rerun(self, figs: StepFigures) -> bool:
        """Whether a step whose generator fell behind runs again: not when its verdict
        stands whatever the lag (the failure criteria, or p99 past twice the SLO): a
        rerun there only loads the replica past what it bears once more."""
        slo = self.config.slo
        clear = failed(figs.step, slo) or figs.step.p99_ttft_s >= 2 * slo.ttft_p99_s
        return self.behind(figs) and not clear

    async def step(
        self,
        phase: Phase,
        index: int,
        urls: Sequence[str],
        rate: float,
        warm: bool,
        baseline: Step | None,
        timing: SustainedTiming | None = None,
        kind: StepKind = StepKind.SCREEN,
        screen_requests: int | None = None,
    ) -> tuple[Step, list[RequestResult]]:
        """One step at ``rate`` per replica, run again (up to ``behind_retries`` times)
        while the generator falls behind: late arrivals do not measure the replica.
        Without ``timing`` a screening step (``step_s`` from an empty queue, longer
        where fewer than ``min_screen_requests`` would arrive; every request judged);
        with it a sustained step (its warm-up, then its judged window). The step and
        its last attempt's requests. ``baseline``: the phase's lowest step; None: this
        is it, and its requests fit the phase's unloaded first-token line."""
        c = self.config
        if timing is None:  # long enough for a few requests even at the lowest rate
            wanted = screen_requests or c.min_screen_requests
            timing = SustainedTiming(0.0, max(c.step_s, wanted / rate))
            screening = True
        else:
            screening = False
        offsets = arrivals(rate, timing.total_s, c.seed)
        n = len(urls)
        for attempt in range(c.behind_retries + 1):
            tag = f"{self.run_id}:{phase.value}:{index}:{attempt}"
            results = await self.gen.run(self.plan(urls, offsets, warm, tag))
            self.results += results
            self.durations[(phase, rate)] = timing
            if baseline is None:
                self.unloaded[phase] = fit_unloaded(results)
            unloaded = self.unloaded.get(phase)
            if screening:
                span = timing.measure_s
                figs = step_figures(results, rate, span, c.request_timeout_s, unloaded)
                self.inflight[(phase, rate)] = mean_inflight(loaded(results), span) / n
            else:
                held = sustained_figures(
                    results,
                    rate,
                    timing.warmup_s,
                    timing.measure_s,
                    c.request_timeout_s,
                    unloaded=unloaded,
                )
                figs = held.figures
                self.inflight[(phase, rate)] = held.mean_inflight / n
            drain_s = await self.watch.drain(urls, phase)
            # figures per replica: the pair's throughput is two replicas'
            step = replace(figs.step, throughput_rps=figs.step.throughput_rps / n)
            figs = StepFigures(step, figs.requests, figs.lag_p99_s, figs.lag_max_s)
            base = step if baseline is None else baseline
            self.report(phase, index, figs, drain_s, base, attempt, kind, timing)
            if not self.rerun(figs):
                break
        return step, results

    async def warm_up(self, urls: Sequence[str], phase: Phase) -> None:
        """Cache the shared prefixes (one request each) before the warm probe counts."""
        reqs = warmup_requests(self.workload, seed=self.config.seed, tag=self.run_id)
        plan = [Planned(0.0, u, r.body(self.model), r.prompt_tokens) for u in urls for r in reqs]
        self.results += await self.gen.run(plan)
        await self.watch.drain(urls, phase)
