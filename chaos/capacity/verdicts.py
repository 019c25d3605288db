"""What the capacity probe concludes from its steps, pure: each step's verdict, why a
probe aborts, whether the ultimate is bracketed, the scaling efficiency of a pair and
the cache effect fitted over the cold and warm probes. The I/O loop that runs the steps
is :mod:`chaos.capacity.probe`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from controlplane.kernel.capacity.bearing import (
    CapacitySLO,
    Curve,
    ProbePlan,
    Step,
    failed,
    fit_hit_effect,
    keeps_up,
    meets_sla,
    past_knee,
)

log = logging.getLogger("tectonic.capacity")


class Phase(StrEnum):
    COLD = "cold"
    WARM = "warm"
    PAIR = "pair"  # two replicas at once, cold
    OVERLOAD = "overload"  # T_recover's step over the ultimate
    RECOVER = "recover"  # then the allowed load


class Verdict(StrEnum):
    ELASTIC = "elastic"
    PAST_KNEE = "past the knee"
    OVER_SLA = "over the SLA"
    BEHIND = "not keeping up"  # a sustained step served less than arrived, or its backlog grew
    FAILURE = "failure"


class StepKind(StrEnum):
    SCREEN = "screen"  # a short step from an empty queue: where the SLA breaks before a backlog
    SATURATION = "saturation"  # offered far more than it serves: what it completes per second
    SUSTAINED = "sustained"  # a warm-up, then a judged window: what it sustains


@dataclass(frozen=True, slots=True)
class StepReport:
    """What the progress callback gets after each step."""

    phase: Phase
    index: int  # within the phase
    offered_rps: float  # per replica
    p99_ttft_s: float
    error_rate: float
    throughput_rps: float  # per replica
    timeouts: int
    requests: int
    lag_p99_s: float
    generator_behind: bool  # lag p99 over max_lag_s: the step's arrivals were late
    drain_s: float  # until the replica was idle again
    verdict: Verdict
    attempt: int = 0  # > 0: the step ran again, the generator was behind before
    kind: StepKind = StepKind.SCREEN
    served_ratio: float | None = None  # a sustained step's completions over arrivals
    backlog_growth: float | None = None  # a sustained step's backlog trend over arrivals
    warmup_s: float = 0.0  # a sustained step's load before its judged window
    duration_s: float = 0.0  # the judged window (a screening step: the whole step)


Progress = Callable[[StepReport], None]


class AbortCause(StrEnum):
    FAILURE = "failure"  # the failure criteria (errors, timeouts) at the lowest step
    SLA = "sla"  # the lowest step already misses the SLA
    BUSY = "busy"  # the replica serves other requests
    STUCK = "stuck"  # it did not drain
    RESTARTED = "restarted"
    UNREADABLE = "unreadable"  # no model, metrics or prefix-cache counters


class ProbeAborted(RuntimeError):
    """The probe stopped without a result; ``steps`` are those of ``phase`` so far."""

    def __init__(
        self, cause: AbortCause, phase: Phase | None, reason: str, steps: Sequence[Step] = ()
    ) -> None:
        where = f" ({phase.value} probe)" if phase is not None else ""
        super().__init__(f"capacity probe aborted{where}: {reason}")
        self.cause = cause
        self.phase = phase
        self.reason = reason
        self.steps = tuple(steps)


def verdict(step: Step, base: Step, slo: CapacitySLO) -> Verdict:
    """``base``: the phase's lowest step (the knee's reference)."""
    if failed(step, slo):
        return Verdict.FAILURE
    if not keeps_up(step, slo):
        return Verdict.BEHIND
    if not meets_sla(step, slo):
        return Verdict.OVER_SLA
    if past_knee(step, base, slo):
        return Verdict.PAST_KNEE
    return Verdict.ELASTIC


def abort_for_lowest(phase: Phase, steps: Sequence[Step], slo: CapacitySLO) -> ProbeAborted:
    lowest = min(steps, key=lambda s: s.offered_rps)
    figures = (
        f"{lowest.offered_rps:g} rps: first-token p99 {lowest.p99_ttft_s:.3f} s, errors "
        f"{lowest.error_rate:.1%}, {lowest.timeouts} timeout(s)"
    )
    if failed(lowest, slo):
        return ProbeAborted(
            AbortCause.FAILURE,
            phase,
            f"the failure criteria hold at the lowest step ({figures}; errors over "
            f"{slo.failure_error_rate:.0%} or timeouts)",
            steps,
        )
    return ProbeAborted(
        AbortCause.SLA,
        phase,
        f"the lowest step already misses the SLA ({figures}; SLO p99 {slo.ttft_p99_s:g} s, "
        f"errors {slo.error_rate:.1%}): probe from a lower rate",
        steps,
    )


def scaling(single_ultimate_rps: float, pair: Curve) -> float:
    """The scaling efficiency: the pair's ultimate per replica (both loaded at once,
    each at the same rate and arrivals the single probe offered, the SLA over both)
    over one replica's alone. The pair's plan stops at the single ultimate: a pair that
    still met the SLA there (no step broke it: ``ultimate_bounded`` False) scales at
    1.0; one bracketed below it at the ratio. It is kept within (0, 1]: two replicas
    carry at most twice one (what they share, a node, a link, only takes away), so a
    ratio over 1 is the two ultimates' bracketing error, not capacity."""
    return min(1.0, pair.ultimate_rps / single_ultimate_rps)


def ultimate_bracketed(steps: Sequence[Step], plan: ProbePlan, slo: CapacitySLO) -> bool:
    """Whether the ultimate is bracketed within the plan's precision (the plan would
    go on around the knee next)."""
    passing = [s.offered_rps for s in steps if meets_sla(s, slo)]
    if not passing:
        return False
    lo = max(passing)
    above = [s.offered_rps for s in steps if not meets_sla(s, slo) and s.offered_rps > lo]
    return bool(above) and (min(above) - lo) / lo <= plan.precision


def fit_cache_effect(
    cold: tuple[float, float], warm: tuple[float, float], min_spread: float
) -> tuple[float, float]:
    """R_base and beta over the two probes' (hit rate, ultimate rps); with too close hit
    rates (caching off, a workload without shared prefixes) beta is not measurable: 0,
    the cold ultimate."""
    if warm[0] - cold[0] < min_spread:
        log.warning(
            "hit rates %.2f (cold) and %.2f (warm) are too close to fit the cache effect",
            cold[0],
            warm[0],
        )
        return cold[1], 0.0
    try:
        effect = fit_hit_effect([cold, warm])
    except ValueError as e:
        log.warning("the cache effect does not fit (%s): beta 0", e)
        return cold[1], 0.0
    return effect.r_base, effect.beta
