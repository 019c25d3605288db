"""Bearing capacity: what a replica sustains under its SLO, read from a step-load probe.

The model is a foundation engineer's load test. Offered load rises in steps while
first-token p99, the error rate and throughput are watched:

- **elastic** range: p99 grows slowly, errors are about 0;
- **knee** (the critical load): the offered rate where p99 first exceeds
  ``knee_factor`` (2) times its low-load baseline;
- **ultimate** load: the highest offered rate the replica **sustains** within the SLA
  (first-token p99 under the SLO, errors under ``error_rate``, and it keeps up:
  served about what was offered with no growing backlog);
- **saturation**: the most the replica completes per second however much it is offered;
  nothing at or above it is sustained (its queue only grows);
- **failure**: errors above ``failure_error_rate`` (5 %) or timeouts; the probe stops.

A step from an empty queue overstates all of these: a backlog needs far longer than a
few seconds to build near the limit. So the probe *screens* with short steps (where the
SLA first breaks from empty, and the saturation throughput), then judges **sustained
steps**: a warm-up long enough for the queue to reach its steady state
(:func:`sustained_timing`, from the measured saturation), then a judged window. Only a
sustained step counts for the knee and the ultimate (:class:`SustainedSearch`).

Decisions use the **allowed** load, ultimate / factor of safety. Capacity grows with
the prefix-cache hit rate h: ``R(h) = R_base / (1 - beta h)`` (R_base: cold prompts;
beta: the share of a request's cost a hit saves); probing at two hit rates fits both.
Capacity utilisation (CBU) is served load over allowed capacity at the hit rate now.

Everything here is pure: figures in, figures out; the probe's I/O is a loop around it.
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
    error_rate: Annotated[
        float, Field(ge=0, lt=1, description="share of errors a step may have within the SLA")
    ] = 0.005
    failure_error_rate: Annotated[
        float,
        Field(gt=0, le=1, description="share of errors at which the probe stops climbing"),
    ] = 0.05
    knee_factor: Annotated[
        float,
        Field(gt=1, description="the knee: where p99 passes this x the lowest step's"),
    ] = 2.0
    # A sustained step keeps up when it completes at least (1 - this) of what arrived in
    # its judged window and its backlog grows by at most this share of those arrivals.
    served_tolerance: Annotated[float, Field(gt=0, lt=0.5)] = 0.05

    @model_validator(mode="after")
    def _ordered(self) -> CapacitySLO:
        if self.failure_error_rate <= self.error_rate:
            raise ValueError("failure_error_rate must be above error_rate")
        return self


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the probe: what was offered and what came back. ``served_ratio``
    and ``backlog_growth`` are a sustained step's (None: a screening step from an empty
    queue, which cannot say whether the rate is sustained)."""

    offered_rps: float
    p99_ttft_s: float
    error_rate: float
    throughput_rps: float
    timeouts: int = 0
    served_ratio: float | None = None  # completions over arrivals in the judged window
    backlog_growth: float | None = None  # in-flight trend x window, over its arrivals
    judged: int = 0  # a sustained step's arrivals in its window
    mean_inflight: float = 0.0  # requests held at once on average in the window
    # the first-token p99 its own requests would have had on an idle replica (a line
    # fitted on the lowest step: prefill by uncached prompt tokens); None: not known
    unloaded_p99_s: float | None = None

    @property
    def sustained(self) -> bool:
        return self.served_ratio is not None


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
    saturation_rps: float | None = None  # the most it completes per second, when measured

    def allowed_rps(self, factor_of_safety: float) -> float:
        if factor_of_safety < 1:
            raise ValueError(f"the factor of safety must be at least 1, got {factor_of_safety}")
        return self.ultimate_rps / factor_of_safety


def backlog_slack(step: Step, slo: CapacitySLO) -> float:
    """How many requests a steady queue may gain over a sustained step's window by
    chance: ``served_tolerance`` of its arrivals, and at least 2 + 3 x the square root
    of its mean in-flight (the in-flight count of a steady queue moves by about its
    square root: a few requests at low rates, where a share would be less than one)."""
    return max(slo.served_tolerance * step.judged, 2.0 + 3.0 * math.sqrt(step.mean_inflight))


def keeps_up(step: Step, slo: CapacitySLO) -> bool:
    """Whether a sustained step reached a steady state: it served about what arrived
    (its arrivals less its completions within :func:`backlog_slack`) and its backlog did
    not grow (the in-flight trend over the window, the same bound). A screening step is
    not judged on this."""
    if step.served_ratio is None:
        return True
    slack = backlog_slack(step, slo)
    behind = (1.0 - step.served_ratio) * step.judged
    grown = (step.backlog_growth or 0.0) * step.judged
    return behind <= slack and grown <= slack


def meets_sla(step: Step, slo: CapacitySLO) -> bool:
    return (
        step.timeouts == 0
        and step.p99_ttft_s <= slo.ttft_p99_s
        and step.error_rate <= slo.error_rate
        and keeps_up(step, slo)
    )


def failed(step: Step, slo: CapacitySLO) -> bool:
    return step.timeouts > 0 or step.error_rate > slo.failure_error_rate


def knee_limit(step: Step, base: Step, slo: CapacitySLO) -> float:
    """The first-token p99 past which ``step`` is past the knee: ``knee_factor`` x the
    lowest step's (``base``), scaled by how much slower the step's own requests would be
    on an idle replica than the lowest step's. A p99 read from a few hundred requests of
    a long-tailed prompt mix swings by a quarter with which long prompts fell in, so
    comparing two steps' p99s alone would mistake a heavier sample for queueing."""
    limit = slo.knee_factor * base.p99_ttft_s
    if step.unloaded_p99_s and base.unloaded_p99_s:
        limit *= step.unloaded_p99_s / base.unloaded_p99_s
    return limit


def past_knee(step: Step, base: Step, slo: CapacitySLO) -> bool:
    return step.p99_ttft_s > knee_limit(step, base, slo)


def _crossing(lo: Step, hi: Step, value_lo: float, value_hi: float, limit: float) -> float:
    """The offered rate between ``lo`` and ``hi`` where a figure that was ``value_lo``
    and became ``value_hi`` crosses ``limit`` (linear between the two steps)."""
    if value_hi == value_lo:
        return hi.offered_rps
    t = (limit - value_lo) / (value_hi - value_lo)
    t = min(1.0, max(0.0, t))
    return lo.offered_rps + t * (hi.offered_rps - lo.offered_rps)


def analyze(
    steps: Sequence[Step],
    slo: CapacitySLO,
    *,
    bound_rps: float | None = None,
    saturation_rps: float | None = None,
) -> Curve:
    """The knee, ultimate and failure loads of a probe's steps (any order; one step per
    offered rate). ``bound_rps``: a rate known not to be sustained (screening broke the
    SLA there from an empty queue, or the saturation): the ultimate is below it even
    when every step met the SLA. The ultimate never passes ``saturation_rps``. Raises
    ValueError without a step that meets the SLA: the replica bears nothing under this
    SLO, or the probe started too high."""
    ordered = sorted(steps, key=lambda s: s.offered_rps)
    if not ordered:
        raise ValueError("no probe steps to analyze")
    if not meets_sla(ordered[0], slo):
        raise ValueError(
            f"the lowest step ({ordered[0].offered_rps:g} rps) already misses the SLA "
            f"(p99 {ordered[0].p99_ttft_s:.3f} s, errors {ordered[0].error_rate:.2%}): "
            "probe from a lower rate"
        )
    base = ordered[0]
    knee: float | None = None
    for lo, hi in itertools.pairwise(ordered):
        if past_knee(hi, base, slo):
            # where p99 over its limit crosses 1 (each step's limit its own)
            ratio_lo = lo.p99_ttft_s / knee_limit(lo, base, slo)
            ratio_hi = hi.p99_ttft_s / knee_limit(hi, base, slo)
            knee = _crossing(lo, hi, ratio_lo, ratio_hi, 1.0)
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
        if hi.timeouts or hi.sustained or not keeps_up(hi, slo):
            # a sustained step claims only what it held (a p99 near its limit is too
            # steep to interpolate), and a timeout or a growing backlog has no figure
            crossings.append(lo.offered_rps)
        ultimate, bounded = min(crossings), True
        break
    if not bounded and bound_rps is not None and bound_rps > ultimate:
        bounded = True  # every step held, and the next rate up is known not to
    if saturation_rps is not None and ultimate > saturation_rps:
        ultimate, bounded = saturation_rps, True
    if bounded and (knee is None or knee > ultimate):
        # the queue that breaks the SLA (or outgrows the slots) has begun by the ultimate:
        # no step between the two is claimed
        knee = ultimate
    failure = next((s.offered_rps for s in ordered if failed(s, slo)), None)
    return Curve(base.p99_ttft_s, knee, ultimate, bounded, failure, tuple(ordered), saturation_rps)


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


@dataclass(frozen=True, slots=True)
class SustainedSearch:
    """Which sustained rate to offer next, between ``floor_rps`` (the lowest step, which
    met the SLA) and ``bound_rps`` (not sustained: screening broke the SLA there from an
    empty queue, or the saturation; None: nothing known above). The first guess is
    ``first_fraction`` x the bound; then the bracket between the highest sustained step
    that met the SLA and the lowest above it that did not narrows (down by
    ``first_fraction`` while it is wide, then halved) until it is within ``precision``
    of its lower end; then the same around the knee. The ultimate is the
    bracket's lower end: the probe never claims a rate it did not see sustained."""

    floor_rps: float
    bound_rps: float | None
    precision: float = 0.05
    first_fraction: float = 0.85

    def __post_init__(self) -> None:
        if self.floor_rps <= 0 or not 0 < self.precision < 1:
            raise ValueError("floor_rps > 0 and 0 < precision < 1 are required")
        if not 0 < self.first_fraction < 1:
            raise ValueError("0 < first_fraction < 1 is required")

    def bracket(self, steps: Sequence[Step], slo: CapacitySLO) -> tuple[float, float | None]:
        """The highest rate sustained within the SLA and the lowest above it that is
        not (None: none known)."""
        lo = max([self.floor_rps, *(s.offered_rps for s in steps if meets_sla(s, slo))])
        above = [s.offered_rps for s in steps if not meets_sla(s, slo) and s.offered_rps > lo]
        if self.bound_rps is not None and self.bound_rps > lo:
            above.append(self.bound_rps)
        return lo, min(above) if above else None

    def next_rate(
        self, steps: Sequence[Step], slo: CapacitySLO, baseline: Step | float
    ) -> float | None:
        """The next sustained rate after ``steps`` (the sustained ones so far); None: done.
        ``baseline``: the lowest step (or its first-token p99), the knee's reference."""
        lo, hi = self.bracket(steps, slo)
        if hi is None:
            return None  # nothing above is known to fail: the ultimate is a lower bound
        if (hi - lo) / lo > self.precision:
            return self._between(lo, hi)
        base = baseline if isinstance(baseline, Step) else Step(self.floor_rps, baseline, 0, 0)
        return self._knee_rate(steps, slo, base, lo)

    def _between(self, lo: float, hi: float) -> float:
        """Down from ``hi`` by ``first_fraction`` while the bracket is wide (the limit
        lies near the top: each step there is one a bisection from the floor would take
        several to reach), halving once it is narrow."""
        return max((lo + hi) / 2, self.first_fraction * hi)

    def _knee_rate(
        self, steps: Sequence[Step], slo: CapacitySLO, base: Step, ultimate: float
    ) -> float | None:
        under = [self.floor_rps] + [
            s.offered_rps for s in steps if not past_knee(s, base, slo) and keeps_up(s, slo)
        ]
        lo = max(r for r in under if r <= ultimate)
        # the knee is at most the ultimate: a step above it bounds the knee too, whatever
        # its p99 (one under the knee's limit but over the SLO would be asked again)
        over = [
            s.offered_rps
            for s in steps
            if s.offered_rps > lo
            and (s.offered_rps > ultimate or past_knee(s, base, slo) or not keeps_up(s, slo))
        ]
        if not over:
            return None  # p99 stayed under the knee's limit up to the ultimate
        hi = min(over)
        if (hi - lo) / lo <= self.precision:
            return None
        return self._between(lo, hi)


@dataclass(frozen=True, slots=True)
class SustainedTiming:
    """How long a sustained step loads the replica before it is judged, and how long it
    is judged."""

    warmup_s: float
    measure_s: float

    @property
    def total_s(self) -> float:
        return self.warmup_s + self.measure_s


def relaxation_s(rate_rps: float, saturation_rps: float, max_utilization: float = 0.99) -> float:
    """How long a queue offered ``rate_rps`` takes to forget where it started: the
    relaxation time of a single-server queue with the replica's saturation throughput,
    ``1 / (mu (1 - sqrt(rho))^2)`` (rho = rate / mu, held under ``max_utilization``).
    A replica with c slots relaxes no slower than one server c times as fast (its
    arrivals are spread over c slots), so the figure errs long, the safe side."""
    if rate_rps <= 0 or saturation_rps <= 0:
        raise ValueError("rates must be positive")
    rho = min(rate_rps / saturation_rps, max_utilization)
    return 1.0 / (saturation_rps * (1.0 - math.sqrt(rho)) ** 2)


def sustained_timing(
    rate_rps: float,
    saturation_rps: float,
    *,
    min_s: float,
    min_requests: int,
    max_warmup_s: float,
    max_measure_s: float,
) -> SustainedTiming:
    """A sustained step at ``rate_rps``: a warm-up of three relaxation times (the queue
    within 5 % of its steady state), then a judged window of one relaxation time at
    least (the queue's ups and downs averaged), ``min_requests`` arrivals at least (a
    p99 to read) and ``min_s``; each capped (a probe must end). Near saturation the
    cap binds: the window then sees a backlog still growing, which fails the step (the
    safe side)."""
    tau = relaxation_s(rate_rps, saturation_rps)
    warmup = min(max_warmup_s, 3 * tau)
    measure = min(max_measure_s, max(min_s, tau, min_requests / rate_rps))
    return SustainedTiming(warmup, measure)


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
