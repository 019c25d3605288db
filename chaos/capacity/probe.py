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
   single one's, at most 1 (see :func:`scaling`);
6. returns a ``CapacityRecord`` (the wasted-work share over every request it sent).

It stops with :class:`ProbeAborted` (a clear outcome, with the steps so far) when a
probe's lowest step already misses the SLA or meets the failure criteria, when the
replica is not idle before it starts (in rotation?), does not drain, restarts, or
exposes no prefix-cache counters.

Every step of a probe sends the same requests at the same unit arrivals scaled by
its rate (``chaos.capacity.workload``): steps differ only by the rate and length.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import aiohttp

from chaos.capacity.load import LoadGenerator, Planned
from chaos.capacity.replica_info import read_replica
from chaos.capacity.results import RequestResult, loaded, mean_inflight, workload_errors
from chaos.capacity.stats import (
    StepFigures,
    UnloadedTtft,
    fit_unloaded,
    recovery_time,
    saturation_rps,
    step_figures,
    sustained_figures,
    wasted_share,
)
from chaos.capacity.verdicts import (
    AbortCause,
    Phase,
    ProbeAborted,
    Progress,
    StepKind,
    StepReport,
    abort_for_lowest,
    fit_cache_effect,
    scaling,
    verdict,
)
from chaos.capacity.workload import (
    Workload,
    arrivals,
    fit_context,
    requests,
    warmup_requests,
)
from controlplane.kernel.capacity.bearing import (
    CapacitySLO,
    Curve,
    ProbePlan,
    Step,
    SustainedSearch,
    SustainedTiming,
    analyze,
    failed,
    meets_sla,
    sustained_timing,
)
from controlplane.kernel.capacity.record import CapacityRecord, HitProbe
from controlplane.kernel.vllm.metrics import RUNNING, WAITING, parse_metrics
from controlplane.kernel.vllm.signals import ReplicaMetrics

log = logging.getLogger("tectonic.capacity")


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    region: str
    slo: CapacitySLO
    factor_of_safety: float = 2.0
    step_s: float = 5.0
    start_rps: float = 1.0  # the lowest step: the knee's low-load baseline
    hint_rps: float | None = None  # a rate to try second (a former probe's ultimate)
    growth: float = 2.0
    precision: float = 0.05
    max_rps: float = 10_000.0
    max_steps: int = 24
    request_timeout_s: float = 30.0
    drain_timeout_s: float = 60.0
    poll_s: float = 0.05
    max_lag_s: float = 0.05  # a step whose generator's lag p99 is above is flagged,
    behind_retries: int = 1  # and run again up to this many times (its arrivals were late)
    # sustained steps (see controlplane.kernel.capacity.bearing.sustained_timing)
    min_requests: int = 400  # arrivals judged per sustained step: a p99 to read
    min_screen_requests: int = 20  # a screening step lasts long enough for these
    max_warmup_s: float = 120.0
    max_measure_s: float = 120.0
    saturation_factor: float = 2.0  # the saturation step: this x the rate screening broke at
    budget_s: float = 3600.0  # past it, no further sustained step: the bracket stands
    max_sustained: int = 16  # sustained steps per probe at most (the same)
    overload_factor: float = 1.5
    recover_s: float = 10.0  # the allowed load after the overload step
    recover_window_s: float = 1.0
    measure_recovery: bool = True
    min_hit_spread: float = 0.1  # warm minus cold hit rate below this: no beta fitted
    seed: int = 0
    model: str | None = None  # None: the first of the replica's /v1/models
    prober: str = ""
    active_replicas: int = 1

    def __post_init__(self) -> None:
        if self.step_s <= 0 or self.recover_s <= 0 or self.recover_window_s <= 0:
            raise ValueError("step_s, recover_s and recover_window_s must be positive")
        if self.recover_window_s >= self.recover_s:
            raise ValueError("the recovery window must be shorter than recover_s")
        if self.overload_factor <= 1 or self.factor_of_safety < 1:
            raise ValueError("overload_factor > 1 and factor_of_safety >= 1 are required")
        if self.behind_retries < 0 or self.max_lag_s <= 0:
            raise ValueError("behind_retries >= 0 and max_lag_s > 0 are required")
        if self.min_requests < 1 or self.max_warmup_s < 0 or self.max_measure_s < self.step_s:
            raise ValueError("min_requests >= 1, max_warmup_s >= 0, max_measure_s >= step_s")
        if self.saturation_factor <= 1 or self.budget_s <= 0 or self.max_sustained < 1:
            raise ValueError("saturation_factor > 1, budget_s > 0, max_sustained >= 1 required")
        ProbePlan(self.start_rps, self.growth, self.precision, self.max_rps, self.max_steps)

    def plan(self) -> ProbePlan:
        return ProbePlan(self.start_rps, self.growth, self.precision, self.max_rps, self.max_steps)


def recovery_offsets(config: ProbeConfig, ultimate_rps: float) -> tuple[list[float], list[float]]:
    """T_recover's arrivals: the overload step's (``overload_factor`` x the ultimate,
    ``step_s`` long) and the allowed load's after it (offsets from the overload's start)."""
    over = arrivals(config.overload_factor * ultimate_rps, config.step_s, config.seed)
    allowed_rps = ultimate_rps / config.factor_of_safety
    after = [config.step_s + t for t in arrivals(allowed_rps, config.recover_s, config.seed + 1)]
    return over, after


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


_CACHE_INFO = re.compile(r'^vllm:cache_config_info\{[^}]*enable_prefix_caching="(\w+)"', re.M)


def prefix_caching(metrics_text: str) -> bool | None:
    """Whether the server caches prefixes, from vLLM's ``cache_config_info``; None
    when it does not say."""
    found = _CACHE_INFO.search(metrics_text)
    return None if found is None else found.group(1).lower() == "true"


@dataclass(frozen=True, slots=True)
class _Scrape:
    gauges: dict[str, float]
    metrics: ReplicaMetrics
    prefix_caching: bool | None


def _hit_rate(before: Sequence[_Scrape], after: Sequence[_Scrape], phase: Phase) -> float:
    """Prefix-cache hits over queries (tokens) between two scrapes of each replica. A
    server that caches nothing counts no queries: its hit rate is 0 when its cache
    config says caching is off, and unknown (an abort) otherwise."""
    queries = hits = 0.0
    for b, a in zip(before, after, strict=True):
        queries += (a.metrics.prefix_queries or 0.0) - (b.metrics.prefix_queries or 0.0)
        hits += (a.metrics.prefix_hits or 0.0) - (b.metrics.prefix_hits or 0.0)
    if queries > 0:
        return min(1.0, max(0.0, hits / queries))
    if all(a.prefix_caching is False for a in after):
        return 0.0
    raise ProbeAborted(AbortCause.UNREADABLE, phase, "the prefix-cache query counter did not move")


@dataclass
class _PhaseResult:
    curve: Curve
    hit_rate: float
    inflight: dict[float, float] = field(default_factory=dict)  # per replica, by rate
    durations: dict[float, SustainedTiming] = field(default_factory=dict)  # sustained, by rate

    def hit_probe(self, step_s: float) -> HitProbe:
        timings = {r: (t.warmup_s, t.measure_s) for r, t in self.durations.items()}
        return HitProbe.of(self.hit_rate, self.curve, step_s, self.inflight, timings)


@dataclass
class _Prober:
    url: str
    config: ProbeConfig
    workload: Workload
    gen: LoadGenerator
    progress: Progress | None
    model: str = ""
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    results: list[RequestResult] = field(default_factory=list)
    _since: dict[str, float | None] = field(default_factory=dict)
    # each step's mean in-flight per replica (its last attempt), by phase and rate
    inflight: dict[tuple[Phase, float], float] = field(default_factory=dict)
    durations: dict[tuple[Phase, float], SustainedTiming] = field(default_factory=dict)
    # each phase's unloaded first-token line, fitted on its lowest step (the knee's limit)
    unloaded: dict[Phase, UnloadedTtft | None] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    @property
    def http(self) -> aiohttp.ClientSession:
        return self.gen.http

    # ---- the replica's /metrics ------------------------------------------------------

    async def _scrape(self, url: str) -> _Scrape:
        try:
            async with self.http.get(url + "/metrics") as r:
                if r.status != 200:
                    raise ProbeAborted(
                        AbortCause.UNREADABLE, None, f"{url}/metrics answered {r.status}"
                    )
                text = await r.text()
            gauges, metrics = parse_metrics(text, time.monotonic())
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise ProbeAborted(AbortCause.UNREADABLE, None, f"{url}/metrics: {e}") from e
        known = self._since.setdefault(url, metrics.since)
        if metrics.since is not None and known is not None and metrics.since != known:
            raise ProbeAborted(AbortCause.RESTARTED, None, f"{url} restarted during the probe")
        return _Scrape(gauges, metrics, prefix_caching(text))

    async def _drain(self, urls: Sequence[str], phase: Phase | None) -> float:
        """Wait until every replica in ``urls`` is idle; the seconds it took."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            busy = []
            for url in urls:
                gauges = (await self._scrape(url)).gauges
                if gauges.get(RUNNING, 0) + gauges.get(WAITING, 0) > 0:
                    busy.append(
                        f"{url} (running {gauges.get(RUNNING, 0):g}, "
                        f"waiting {gauges.get(WAITING, 0):g})"
                    )
            if not busy:
                return loop.time() - start
            if loop.time() - start > self.config.drain_timeout_s:
                # before the first step a busy replica serves someone else's requests
                cause, what = (
                    (AbortCause.BUSY, "is serving other requests: is it in rotation?")
                    if phase is None
                    else (AbortCause.STUCK, "did not drain")
                )
                raise ProbeAborted(
                    cause,
                    phase,
                    f"{', '.join(busy)} {what} (waited {self.config.drain_timeout_s:g} s)",
                )
            await asyncio.sleep(self.config.poll_s)

    async def _counters(self, url: str, phase: Phase) -> _Scrape:
        scrape = await self._scrape(url)
        m = scrape.metrics
        if m.prefix_queries is None or m.prefix_hits is None:
            raise ProbeAborted(
                AbortCause.UNREADABLE,
                phase,
                f"{url} exposes no prefix-cache counters: the hit rate cannot be read",
            )
        return scrape

    # ---- steps and probes ----------------------------------------------------------

    def _plan(
        self, urls: Sequence[str], offsets: Sequence[float], warm: bool, tag: str
    ) -> list[Planned]:
        return plan_requests(
            self.workload, self.model, self.config.seed, urls, offsets, warm=warm, tag=tag
        )

    def _report(
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

    def _behind(self, figs: StepFigures) -> bool:
        return figs.lag_p99_s > self.config.max_lag_s

    def _rerun(self, figs: StepFigures) -> bool:
        """Whether a step whose generator fell behind runs again: not when its verdict
        stands whatever the lag (the failure criteria, or p99 past twice the SLO): a
        rerun there only loads the replica past what it bears once more."""
        slo = self.config.slo
        clear = failed(figs.step, slo) or figs.step.p99_ttft_s >= 2 * slo.ttft_p99_s
        return self._behind(figs) and not clear

    async def _step(
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
            results = await self.gen.run(self._plan(urls, offsets, warm, tag))
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
            drain_s = await self._drain(urls, phase)
            step = replace(figs.step, throughput_rps=figs.step.throughput_rps / n)
            figs = StepFigures(step, figs.requests, figs.lag_p99_s, figs.lag_max_s)
            base = step if baseline is None else baseline
            self._report(phase, index, figs, drain_s, base, attempt, kind, timing)
            if not self._rerun(figs):
                break
        return step, results

    async def _warm_up(self, urls: Sequence[str], phase: Phase) -> None:
        """Cache the shared prefixes (one request each) before the warm probe counts."""
        reqs = warmup_requests(self.workload, seed=self.config.seed, tag=self.run_id)
        plan = [Planned(0.0, u, r.body(self.model), r.prompt_tokens) for u in urls for r in reqs]
        self.results += await self.gen.run(plan)
        await self._drain(urls, phase)

    def _timing(self, rate: float, saturation: float | None) -> SustainedTiming:
        c = self.config
        if saturation is None:  # nothing to derive it from: the longest allowed
            measure = min(c.max_measure_s, max(c.step_s, c.min_requests / rate))
            return SustainedTiming(c.max_warmup_s, measure)
        return sustained_timing(
            rate,
            saturation,
            min_s=c.step_s,
            min_requests=c.min_requests,
            max_warmup_s=c.max_warmup_s,
            max_measure_s=c.max_measure_s,
        )

    def _over_budget(self) -> bool:
        return time.monotonic() - self.started > self.config.budget_s

    async def _screen(
        self,
        phase: Phase,
        urls: Sequence[str],
        warm: bool,
        second_rps: float | None,
        ceiling_rps: float | None,
    ) -> list[Step]:
        """Short steps from an empty queue, climbing until one misses the SLA (or the
        ceiling): where the SLA breaks even before a backlog builds. Raises
        :class:`ProbeAborted` when the lowest step already misses it."""
        c = self.config
        plan = c.plan()
        if ceiling_rps is not None:
            plan = replace(plan, max_rps=min(plan.max_rps, ceiling_rps))
        steps: list[Step] = []
        forced = [c.start_rps]
        if second_rps is not None and second_rps > c.start_rps * c.growth:
            forced.append(min(second_rps, plan.max_rps))
        while True:
            rate = forced.pop(0) if forced else plan.next_rate(steps, c.slo)
            if rate is None:
                break
            baseline = steps[0] if steps else None
            # the lowest step sets the knee's baseline: a p99 read from as many requests
            # as half a sustained window (a handful would give the tail's floor)
            wanted = None if steps else max(c.min_screen_requests, c.min_requests // 2)
            step, _ = await self._step(
                phase, len(steps), urls, rate, warm, baseline, screen_requests=wanted
            )
            steps.append(step)
            if not meets_sla(step, c.slo):
                break
        if not meets_sla(steps[0], c.slo):
            raise abort_for_lowest(phase, steps, c.slo)
        return steps

    async def _saturation(
        self, phase: Phase, index: int, urls: Sequence[str], rate: float, warm: bool, base: Step
    ) -> float | None:
        """What each replica completes per second offered far more than it serves."""
        _, results = await self._step(
            phase, index, urls, rate, warm, base, kind=StepKind.SATURATION
        )
        measured = saturation_rps(results)
        return None if measured is None else measured / len(urls)

    async def run_phase(
        self,
        phase: Phase,
        urls: Sequence[str],
        warm: bool,
        second_rps: float | None,
        ceiling_rps: float | None = None,
        timing_saturation: float | None = None,
    ) -> _PhaseResult:
        """One probe: screening, the saturation, then sustained steps (see
        :class:`SustainedSearch`); its curve and the hit rate it saw. ``ceiling_rps``:
        offer nothing above it (the pair's: only its ultimate under the single one's
        counts); ``timing_saturation``: the saturation to time sustained steps by
        instead of measuring one (the pair's, per replica: the single one's)."""
        c = self.config
        if warm:
            await self._warm_up(urls, phase)
        before = [await self._counters(u, phase) for u in urls]
        screen = await self._screen(phase, urls, warm, second_rps, ceiling_rps)
        base, last = screen[0], screen[-1]
        broke = None if meets_sla(last, c.slo) else last.offered_rps
        saturation = None
        if timing_saturation is None and broke is not None and not failed(last, c.slo):
            saturation = await self._saturation(
                phase, len(screen), urls, c.saturation_factor * broke, warm, base
            )
        bounds = [r for r in (broke, saturation) if r is not None]
        search = SustainedSearch(base.offered_rps, min(bounds) if bounds else None, c.precision)
        held: list[Step] = []
        index = len(screen) + (saturation is not None)
        # screening never broke the SLA (up to the ceiling): hold its top rate first
        first = last.offered_rps if broke is None and last is not base else None
        while not self._over_budget() and len(held) < c.max_sustained:
            rate = first if first is not None else search.next_rate(held, c.slo, base)
            first = None
            if rate is None:
                break
            timing = self._timing(rate, timing_saturation or saturation)
            step, _ = await self._step(
                phase, index, urls, rate, warm, base, timing, StepKind.SUSTAINED
            )
            held.append(step)
            index += 1
        else:
            log.warning(
                "%s probe: past its budget (%.0f s, %d sustained steps); the ultimate is "
                "the highest rate sustained so far",
                phase.value,
                c.budget_s,
                c.max_sustained,
            )
        curve = analyze(
            [base, *held],
            c.slo,
            bound_rps=min(bounds) if bounds else None,
            saturation_rps=saturation,
        )
        after = [await self._counters(u, phase) for u in urls]
        inflight = {r: v for (p, r), v in self.inflight.items() if p is phase}
        durations = {r: t for (p, r), t in self.durations.items() if p is phase}
        return _PhaseResult(curve, _hit_rate(before, after, phase), inflight, durations)

    async def recovery(self, ultimate_rps: float, baseline: Step) -> float | None:
        """T_recover after a step at ``overload_factor`` x the ultimate (cold), run again
        (like a step) while the generator falls behind during the recovery."""
        c = self.config
        over, after = recovery_offsets(c, ultimate_rps)
        segments = (
            (Phase.OVERLOAD, c.overload_factor * ultimate_rps, c.step_s),
            (Phase.RECOVER, ultimate_rps / c.factor_of_safety, c.recover_s),
        )
        for attempt in range(c.behind_retries + 1):
            tag = f"{self.run_id}:recover:{attempt}"
            results = await self.gen.run(self._plan([self.url], [*over, *after], False, tag))
            self.results += results
            drain_s = await self._drain([self.url], Phase.RECOVER)
            parts = (results[: len(over)], [_shift(r, -c.step_s) for r in results[len(over) :]])
            behind = False
            for index, ((phase, rate, span), part) in enumerate(zip(segments, parts, strict=True)):
                figs = step_figures(part, rate, span, c.request_timeout_s)
                # the overload step is far over the SLA by design: only the recovery counts
                behind = behind or (phase is Phase.RECOVER and self._behind(figs))
                self._report(phase, index, figs, drain_s if index else 0.0, baseline, attempt)
            if not behind:
                break
        return recovery_time(results, c.step_s, c.step_s + c.recover_s, c.recover_window_s, c.slo)


async def _pair_scaling(
    prober: _Prober, cold: _PhaseResult, urls: Sequence[str]
) -> tuple[float, bool, str]:
    """The scaling efficiency, whether it was measured, and why not. A pair probe that
    aborts (the second replica restarts, will not drain, misses the SLA at once) costs
    only the efficiency: the single replica's figures stand, 1.0 is assumed and said."""
    if len(urls) < 2:
        return 1.0, False, ""
    single = cold.curve.ultimate_rps
    if not cold.curve.ultimate_bounded:
        why = (
            f"no step broke the SLA on one replica (its ultimate {single:.4g} rps is a lower "
            "bound): nothing to compare the pair to"
        )
    else:
        try:
            pair = await prober.run_phase(
                Phase.PAIR, urls, False, 0.5 * single, single, cold.curve.saturation_rps
            )
        except ProbeAborted as e:
            why = f"the pair's probe aborted: {e.reason}"
        else:
            return scaling(single, pair.curve), True, ""
    log.warning("%s; the scaling efficiency is assumed 1.0", why)
    return 1.0, False, why


def _shift(r: RequestResult, by: float) -> RequestResult:
    """A result with its times moved by ``by`` (a later segment read as its own step)."""
    first = None if r.first_token_s is None else r.first_token_s + by
    return replace(
        r,
        planned_s=r.planned_s + by,
        sent_s=r.sent_s + by,
        first_token_s=first,
        done_s=r.done_s + by,
    )


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
        prober = _Prober(url, config, workload, gen, progress, info.model, started=started)
        urls = [url] if pair_url is None else [url, pair_url]
        await prober._drain(urls, None)
        cold = await prober.run_phase(Phase.COLD, [url], False, config.hint_rps)
        warm = await prober.run_phase(Phase.WARM, [url], True, cold.curve.ultimate_rps)
        r_base, beta = fit_cache_effect(
            (cold.hit_rate, cold.curve.ultimate_rps),
            (warm.hit_rate, warm.curve.ultimate_rps),
            config.min_hit_spread,
        )
        t_recover = None
        if config.measure_recovery:
            t_recover = await prober.recovery(cold.curve.ultimate_rps, cold.curve.steps[0])
        efficiency, measured, unmeasured = await _pair_scaling(prober, cold, urls)
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
        workload_errors=workload_errors(prober.results),
        wasted_work_share=wasted_share(prober.results),
        scaling_efficiency=efficiency,
        scaling_measured=measured,
        scaling_unmeasured=unmeasured,
        active_replicas=config.active_replicas,
        profile=workload.profile,
        probe_s=time.monotonic() - started,
        prober=config.prober,
    )
