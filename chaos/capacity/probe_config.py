"""The capacity probe's settings, and the arrivals they plan for T_recover: pure, so a
caller (the drill service, the bench) can build and check a probe's settings without
the I/O that runs it (:mod:`chaos.capacity.probe`)."""

from __future__ import annotations

from dataclasses import dataclass

from chaos.capacity.workload import arrivals
from controlplane.kernel.capacity.bearing import CapacitySLO, ProbePlan


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
