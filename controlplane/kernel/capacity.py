"""Bearing capacity: what a replica carries under its SLO, read from a step-load probe.

The model is a foundation engineer's load test. Offered load rises in steps of fixed
duration while first-token p99, the error rate and throughput are watched:

- **elastic** range: p99 grows slowly, errors are about 0;
- **knee** (the critical load): the offered rate where p99 first exceeds
  ``knee_factor`` (2) times its low-load baseline;
- **ultimate** load: the highest offered rate that still meets the SLA (first-token
  p99 under the SLO, errors under ``error_rate``);
- **failure**: errors above ``failure_error_rate`` (5 %) or timeouts; the probe stops.

Decisions use the **allowed** load, ultimate / factor of safety. Capacity grows with
the prefix-cache hit rate h: ``R(h) = R_base / (1 - beta h)`` (R_base: cold prompts;
beta: the share of a request's cost a hit saves); probing at two hit rates fits both.
Capacity utilisation (CBU) is served load over allowed capacity at the hit rate now.

Everything here is pure: figures in, figures out. ``ProbePlan`` says which rate to
offer next (coarse steps up, then halving the bracket around the ultimate load), so
the probe's I/O is a loop around it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field, model_validator

from controlplane.kernel.model import Frozen


class CapacitySLO(Frozen):
    """What a step must meet to count as within the SLA, and the probe's criteria."""

    ttft_p99_s: Annotated[float, Field(gt=0, description="first-token p99 the SLO allows")]
    error_rate: Annotated[float, Field(ge=0, lt=1)] = 0.005
    failure_error_rate: Annotated[float, Field(gt=0, le=1)] = 0.05
    knee_factor: Annotated[float, Field(gt=1)] = 2.0

    @model_validator(mode="after")
    def _ordered(self) -> CapacitySLO:
        if self.failure_error_rate <= self.error_rate:
            raise ValueError("failure_error_rate must be above error_rate")
        return self


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the probe: what was offered and what came back."""

    offered_rps: float
    p99_ttft_s: float
    error_rate: float
    throughput_rps: float
    timeouts: int = 0


@dataclass(frozen=True, slots=True)
class Curve:
    """What a probe's steps say. ``ultimate_bounded`` is False when no step failed the
    SLA: the ultimate load is then at least ``ultimate_rps``, not a measured limit."""

    baseline_p99_s: float
    knee_rps: float | None
    ultimate_rps: float
    ultimate_bounded: bool
    failure_rps: float | None
    steps: tuple[Step, ...] = field(default=(), repr=False)

    def allowed_rps(self, factor_of_safety: float) -> float:
        if factor_of_safety < 1:
            raise ValueError(f"the factor of safety must be at least 1, got {factor_of_safety}")
        return self.ultimate_rps / factor_of_safety


def meets_sla(step: Step, slo: CapacitySLO) -> bool:
    return (
        step.timeouts == 0
        and step.p99_ttft_s <= slo.ttft_p99_s
        and step.error_rate <= slo.error_rate
    )


def failed(step: Step, slo: CapacitySLO) -> bool:
    return step.timeouts > 0 or step.error_rate > slo.failure_error_rate


def _crossing(lo: Step, hi: Step, value_lo: float, value_hi: float, limit: float) -> float:
    """The offered rate between ``lo`` and ``hi`` where a figure that was ``value_lo``
    and became ``value_hi`` crosses ``limit`` (linear between the two steps)."""
    if value_hi == value_lo:
        return hi.offered_rps
    t = (limit - value_lo) / (value_hi - value_lo)
    t = min(1.0, max(0.0, t))
    return lo.offered_rps + t * (hi.offered_rps - lo.offered_rps)


def analyze(steps: Sequence[Step], slo: CapacitySLO) -> Curve:
    """The knee, ultimate and failure loads of a probe's steps (any order; one step per
    offered rate). Raises ValueError without a step that meets the SLA: the replica
    bears nothing under this SLO, or the probe started too high."""
    ordered = sorted(steps, key=lambda s: s.offered_rps)
    if not ordered:
        raise ValueError("no probe steps to analyze")
    if not meets_sla(ordered[0], slo):
        raise ValueError(
            f"the lowest step ({ordered[0].offered_rps:g} rps) already misses the SLA "
            f"(p99 {ordered[0].p99_ttft_s:.3f} s, errors {ordered[0].error_rate:.2%}): "
            "probe from a lower rate"
        )
    baseline = ordered[0].p99_ttft_s
    knee_limit = slo.knee_factor * baseline
    knee: float | None = None
    for lo, hi in itertools.pairwise(ordered):
        if hi.p99_ttft_s > knee_limit:
            knee = _crossing(lo, hi, lo.p99_ttft_s, hi.p99_ttft_s, knee_limit)
            break
    ultimate, bounded = ordered[-1].offered_rps, False
    for lo, hi in itertools.pairwise(ordered):
        if meets_sla(hi, slo):
            continue
        crossings = [hi.offered_rps]
        if hi.p99_ttft_s > slo.ttft_p99_s:
            crossings.append(_crossing(lo, hi, lo.p99_ttft_s, hi.p99_ttft_s, slo.ttft_p99_s))
        if hi.error_rate > slo.error_rate:
            crossings.append(_crossing(lo, hi, lo.error_rate, hi.error_rate, slo.error_rate))
        if hi.timeouts:
            crossings.append(lo.offered_rps)
        ultimate, bounded = min(crossings), True
        break
    failure = next((s.offered_rps for s in ordered if failed(s, slo)), None)
    return Curve(baseline, knee, ultimate, bounded, failure, tuple(ordered))


# ---- the probe's plan --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """Which rates to offer: from ``start_rps`` up by ``growth`` per step until a step
    misses the SLA (or ``max_rps``), then halve the bracket between the last step
    that met it and the first that did not until it is within ``precision`` (relative)
    of its lower end; then the same around the knee. A failure step ends the climb:
    nothing at or above it is offered again (the probe's runner lets the replica
    recover, timing it, before the next)."""

    start_rps: float
    growth: float = 1.5
    precision: float = 0.05
    max_rps: float = math.inf
    max_steps: int = 24

    def __post_init__(self) -> None:
        if self.start_rps <= 0 or self.growth <= 1 or not 0 < self.precision < 1:
            raise ValueError("start_rps > 0, growth > 1 and 0 < precision < 1 are required")

    def next_rate(self, steps: Sequence[Step], slo: CapacitySLO) -> float | None:
        """The next rate to offer after ``steps`` (in the order they ran); None: done."""
        if not steps:
            return self.start_rps
        if len(steps) >= self.max_steps:
            return None
        passing = [s.offered_rps for s in steps if meets_sla(s, slo)]
        missing = [s.offered_rps for s in steps if not meets_sla(s, slo)]
        if not passing:
            return None  # the first step missed: nothing to bracket (analyze says so)
        lo = max(passing)
        above = [r for r in missing if r > lo]
        if not above:  # still climbing
            nxt = lo * self.growth
            if lo >= self.max_rps:
                return None
            return min(nxt, self.max_rps)
        hi = min(above)
        if (hi - lo) / lo > self.precision:
            return (lo + hi) / 2
        return self._knee_rate(steps, slo)

    def _knee_rate(self, steps: Sequence[Step], slo: CapacitySLO) -> float | None:
        """Once the ultimate is bracketed: halve the bracket around the knee too (where
        p99 passes ``knee_factor`` x the lowest step's), if it lies below the ultimate."""
        ordered = sorted(steps, key=lambda s: s.offered_rps)
        limit = slo.knee_factor * ordered[0].p99_ttft_s
        under = [s.offered_rps for s in ordered if s.p99_ttft_s <= limit and not failed(s, slo)]
        over = [
            s.offered_rps for s in ordered if s.p99_ttft_s > limit and s.offered_rps > max(under)
        ]
        if not over:
            return None
        lo, hi = max(under), min(over)
        if (hi - lo) / lo <= self.precision:
            return None
        return (lo + hi) / 2


# ---- capacity as a function of the hit rate ----------------------------------------


@dataclass(frozen=True, slots=True)
class HitEffect:
    """``R(h) = r_base / (1 - beta h)``: capacity at prefix-cache hit rate h."""

    r_base: float
    beta: float

    def capacity(self, hit_rate: float) -> float:
        h = min(1.0, max(0.0, hit_rate))
        return self.r_base / (1.0 - self.beta * h)


def fit_hit_effect(points: Sequence[tuple[float, float]]) -> HitEffect:
    """Fit ``R(h) = r_base / (1 - beta h)`` to (hit rate, capacity) points, two at least
    at different hit rates: ``1/R`` is linear in h (intercept ``1/r_base``, slope
    ``-beta/r_base``), fitted by least squares. beta is kept within [0, 0.99]."""
    if len({round(h, 6) for h, _ in points}) < 2:
        raise ValueError("fitting the cache effect needs capacities at two hit rates at least")
    if any(r <= 0 for _, r in points):
        raise ValueError("capacities must be positive")
    xs = [h for h, _ in points]
    ys = [1.0 / r for _, r in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    if intercept <= 0:
        raise ValueError("the points do not fit R(h) = R_base / (1 - beta h): check the probe")
    r_base = 1.0 / intercept
    beta = min(0.99, max(0.0, -slope * r_base))
    return HitEffect(r_base, beta)


def utilization(load_rps: float, allowed_rps: float) -> float:
    """Capacity utilisation (CBU): served load over allowed capacity at the hit rate
    now. Above 0.8 warn; above 1.0 the region is past what it bears."""
    if allowed_rps <= 0:
        return math.inf if load_rps > 0 else 0.0
    return load_rps / allowed_rps
