"""One probe of a workload (cold, warm, or the pair's): which rates its steps run at.

- **screening**: steps from an empty queue climbing by ``growth`` until one misses the
  SLA: the lowest is the knee's baseline; where the SLA breaks bounds the ultimate;
- **saturation**: one step far over that rate: what the replica completes per second
  when it cannot keep up; nothing at or above it is sustained;
- **sustained steps** at the rates ``SustainedSearch`` asks for, each timed by that
  saturation (``sustained_timing``), until the bracket is narrow enough or the probe's
  budget is spent (the bracket so far stands, said in the log).

The steps themselves are :mod:`chaos.capacity.steps`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from chaos.capacity.prefix_cache import hit_rate
from chaos.capacity.stats import saturation_rps
from chaos.capacity.steps import StepRunner
from chaos.capacity.verdicts import Phase, StepKind, abort_for_lowest
from controlplane.kernel.capacity.bearing import (
    Curve,
    Step,
    SustainedSearch,
    SustainedTiming,
    analyze,
    failed,
    meets_sla,
    sustained_timing,
)
from controlplane.kernel.capacity.record import HitProbe

log = logging.getLogger("tectonic.capacity")


@dataclass
class PhaseResult:
    """A probe's curve, the hit rate it saw, and per rate its in-flight and timings."""

    curve: Curve
    hit_rate: float
    inflight: dict[float, float] = field(default_factory=dict)  # per replica, by rate
    durations: dict[float, SustainedTiming] = field(default_factory=dict)  # sustained, by rate

    def hit_probe(self, step_s: float) -> HitProbe:
        timings = {r: (t.warmup_s, t.measure_s) for r, t in self.durations.items()}
        return HitProbe.of(self.hit_rate, self.curve, step_s, self.inflight, timings)


def _sustained_timing(runner: StepRunner, rate: float, saturation: float | None) -> SustainedTiming:
    """A sustained step's warm-up and judged window at ``rate``: three queue relaxation
    times derived from the saturation, or the longest allowed without one."""
    c = runner.config
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


async def screen(
    runner: StepRunner,
    phase: Phase,
    urls: Sequence[str],
    warm: bool,
    second_rps: float | None,
    ceiling_rps: float | None,
) -> list[Step]:
    """Short steps from an empty queue, climbing until one misses the SLA (or the
    ceiling): where the SLA breaks even before a backlog builds. Raises
    :class:`ProbeAborted` when the lowest step already misses it."""
    c = runner.config
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
        step, _ = await runner.step(
            phase, len(steps), urls, rate, warm, baseline, screen_requests=wanted
        )
        steps.append(step)
        if not meets_sla(step, c.slo):
            break
    if not meets_sla(steps[0], c.slo):
        raise abort_for_lowest(phase, steps, c.slo)
    return steps


async def saturation(
    runner: StepRunner,
    phase: Phase,
    index: int,
    urls: Sequence[str],
    rate: float,
    warm: bool,
    base: Step,
) -> float | None:
    """What each replica completes per second offered far more than it serves."""
    _, results = await runner.step(phase, index, urls, rate, warm, base, kind=StepKind.SATURATION)
    measured = saturation_rps(results)
    return None if measured is None else measured / len(urls)


async def _sustain(
    runner: StepRunner,
    phase: Phase,
    urls: Sequence[str],
    warm: bool,
    search: SustainedSearch,
    base: Step,
    first_rps: float | None,
    index: int,
    timing_saturation: float | None,
) -> list[Step]:
    """The sustained steps ``search`` asks for (``first_rps`` before them, if any),
    until it has its bracket or the probe's budget is spent."""
    c = runner.config
    held: list[Step] = []
    while not runner.over_budget() and len(held) < c.max_sustained:
        rate = first_rps if first_rps is not None else search.next_rate(held, c.slo, base)
        first_rps = None
        if rate is None:
            break
        timing = _sustained_timing(runner, rate, timing_saturation)
        step, _ = await runner.step(
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
    return held


async def run_phase(
    runner: StepRunner,
    phase: Phase,
    urls: Sequence[str],
    warm: bool,
    second_rps: float | None,
    ceiling_rps: float | None = None,
    timing_saturation: float | None = None,
) -> PhaseResult:
    """One probe: screening, the saturation, then sustained steps (see
    :class:`SustainedSearch`); its curve and the hit rate it saw. ``ceiling_rps``:
    offer nothing above it (the pair's: only its ultimate under the single one's
    counts); ``timing_saturation``: the saturation to time sustained steps by
    instead of measuring one (the pair's, per replica: the single one's)."""
    c = runner.config
    if warm:
        await runner.warm_up(urls, phase)
    before = [await runner.watch.counters(u, phase) for u in urls]
    screened = await screen(runner, phase, urls, warm, second_rps, ceiling_rps)
    base, last = screened[0], screened[-1]
    broke = None if meets_sla(last, c.slo) else last.offered_rps
    measured = None
    if timing_saturation is None and broke is not None and not failed(last, c.slo):
        measured = await saturation(
            runner, phase, len(screened), urls, c.saturation_factor * broke, warm, base
        )
    bounds = [r for r in (broke, measured) if r is not None]
    bound = min(bounds) if bounds else None
    search = SustainedSearch(base.offered_rps, bound, c.precision)
    # screening never broke the SLA (up to the ceiling): hold its top rate first
    first = last.offered_rps if broke is None and last is not base else None
    index = len(screened) + (measured is not None)
    held = await _sustain(
        runner, phase, urls, warm, search, base, first, index, timing_saturation or measured
    )
    curve = analyze([base, *held], c.slo, bound_rps=bound, saturation_rps=measured)
    after = [await runner.watch.counters(u, phase) for u in urls]
    inflight = {r: v for (p, r), v in runner.inflight.items() if p is phase}
    durations = {r: t for (p, r), t in runner.durations.items() if p is phase}
    return PhaseResult(curve, hit_rate(before, after, phase), inflight, durations)
