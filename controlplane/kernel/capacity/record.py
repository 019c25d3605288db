"""A region's measured bearing capacity, as stored at ``capacity/<region>`` (docs/capacity.md).

A capacity probe (``chaos/capacity/``) step-loads one replica that is out of rotation at
two hit rates or more; what it finds is kept here: the curve of each probe (its steps,
knee, ultimate), the cache effect fitted over them (``R(h) = R_base / (1 - beta h)``,
per replica), the overload recovery time, the wasted work, the workload it was shaped
like, and the engine it ran on. The region's capacity is the replica's times its ACTIVE
replicas times the scaling efficiency (measured by probing two replicas at once, or
assumed: ``scaling_measured`` says which).

:func:`resolve` is how the planner and the status read it: the allowed capacity at a hit
rate, from the record when it is fresh and from the same engine, else from the
topology's typed ``capacity_rps`` (the fallback), with the reason; a record of another
serving configuration (``capacity/serving.py``: max_num_seqs, max_model_len, the KV
cache...) than the region runs now is stale as one of another engine is. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from controlplane.kernel.capacity.bearing import CapacitySLO, Curve, HitEffect, Step
from controlplane.kernel.capacity.serving import ServingConfig, differences
from controlplane.kernel.model import Frozen


class ProbeStep(Frozen):
    """One step of a probe as stored: what was offered, what came back."""

    offered_rps: Annotated[float, Field(gt=0)]
    p99_ttft_s: Annotated[float, Field(ge=0)]
    error_rate: Annotated[float, Field(ge=0, le=1)]
    throughput_rps: Annotated[float, Field(ge=0)]
    timeouts: Annotated[int, Field(ge=0)] = 0
    duration_s: Annotated[float, Field(gt=0)] = 1.0
    # Requests held at once on average over the step (their send-to-end times over its
    # span): admission control's bound (regions/dataplane/admission_bound.py). None:
    # probed before it was recorded.
    mean_inflight: Annotated[float | None, Field(ge=0, exclude_if=lambda v: v is None)] = None
    # A sustained step's (absent: a screening step from an empty queue): its warm-up
    # before the judged window (``duration_s``), completions over arrivals in the window
    # and its backlog's growth over those arrivals.
    warmup_s: Annotated[float | None, Field(ge=0, exclude_if=lambda v: v is None)] = None
    served_ratio: Annotated[float | None, Field(ge=0, exclude_if=lambda v: v is None)] = None
    backlog_growth: Annotated[float | None, Field(exclude_if=lambda v: v is None)] = None
    judged: Annotated[int | None, Field(ge=0, exclude_if=lambda v: v is None)] = None
    # the first-token p99 its requests would have had on an idle replica: the knee's
    # limit scales with it (kernel/capacity.knee_limit); absent: not fitted
    unloaded_p99_s: Annotated[float | None, Field(ge=0, exclude_if=lambda v: v is None)] = None

    @classmethod
    def of(
        cls,
        step: Step,
        duration_s: float,
        mean_inflight: float | None = None,
        warmup_s: float | None = None,
    ) -> ProbeStep:
        return cls(
            offered_rps=step.offered_rps,
            p99_ttft_s=step.p99_ttft_s,
            error_rate=step.error_rate,
            throughput_rps=step.throughput_rps,
            timeouts=step.timeouts,
            duration_s=duration_s,
            mean_inflight=mean_inflight,
            warmup_s=warmup_s if step.sustained else None,
            served_ratio=step.served_ratio,
            backlog_growth=step.backlog_growth,
            judged=step.judged if step.sustained else None,
            unloaded_p99_s=step.unloaded_p99_s,
        )

    def step(self) -> Step:
        return Step(
            self.offered_rps,
            self.p99_ttft_s,
            self.error_rate,
            self.throughput_rps,
            self.timeouts,
            self.served_ratio,
            self.backlog_growth,
            self.judged or 0,
            self.mean_inflight or 0.0,
            self.unloaded_p99_s,
        )


class HitProbe(Frozen):
    """The curve of one probe at one hit rate (read from the replica's own counters)."""

    hit_rate: Annotated[float, Field(ge=0, le=1)]
    baseline_p99_s: Annotated[float, Field(ge=0)]
    knee_rps: Annotated[float | None, Field(gt=0)] = None
    ultimate_rps: Annotated[float, Field(gt=0)]
    ultimate_bounded: bool  # False: no step broke the SLA, the ultimate is a lower bound
    failure_rps: Annotated[float | None, Field(gt=0)] = None
    steps: tuple[ProbeStep, ...] = ()
    # what the replica completed per second offered far more (None: not measured)
    saturation_rps: Annotated[float | None, Field(gt=0, exclude_if=lambda v: v is None)] = None

    @classmethod
    def of(
        cls,
        hit_rate: float,
        curve: Curve,
        step_s: float,
        inflight: Mapping[float, float] | None = None,
        timings: Mapping[float, tuple[float, float]] | None = None,
    ) -> HitProbe:
        """``inflight``: each step's mean in-flight, by its offered rate; ``timings``:
        each sustained step's (warm-up, judged window), by its offered rate."""
        inflight = inflight or {}
        timings = timings or {}

        def stored(s: Step) -> ProbeStep:
            warmup, window = timings.get(s.offered_rps, (None, step_s))
            return ProbeStep.of(s, window, inflight.get(s.offered_rps), warmup)

        return cls(
            hit_rate=hit_rate,
            baseline_p99_s=curve.baseline_p99_s,
            knee_rps=curve.knee_rps,
            ultimate_rps=curve.ultimate_rps,
            ultimate_bounded=curve.ultimate_bounded,
            failure_rps=curve.failure_rps,
            steps=tuple(stored(s) for s in curve.steps),
            saturation_rps=curve.saturation_rps,
        )


class WorkloadProfile(Frozen):
    """What the probe's requests looked like, shaped like the region's own traffic."""

    prompt_tokens_p50: Annotated[int, Field(ge=1)]
    prompt_tokens_p90: Annotated[int, Field(ge=1)]
    output_tokens: Annotated[int, Field(ge=1)]
    shared_prefix_share: Annotated[float, Field(ge=0, le=1)]  # of requests, in the warm probe
    stream_share: Annotated[float, Field(ge=0, le=1)] = 1.0
    source: str = "default"  # "exports": from the region's prefix catalog
    # The longest prompt sent (the workload's estimate, template included), when the
    # replica's max_model_len capped it below the workload's own bound.
    max_prompt_tokens: Annotated[int | None, Field(ge=1, exclude_if=lambda v: v is None)] = None


class CapacityRecord(Frozen):
    """``capacity/<region>``: the last probe's findings (per replica unless named region)."""

    region: str
    measured_at: float  # seconds since the epoch, the prober's clock
    engine_version: str  # vLLM's /version of the probed replica ("" when it has none)
    model: str = ""
    replica: str  # the probed replica's URL
    slo: CapacitySLO
    factor_of_safety: Annotated[float, Field(ge=1, le=10)]
    probes: Annotated[tuple[HitProbe, ...], Field(min_length=1)]
    r_base_rps: Annotated[float, Field(gt=0)]  # one replica, cold prompts
    beta: Annotated[float, Field(ge=0, lt=1)]
    t_recover_s: Annotated[float | None, Field(ge=0)] = None  # None: see t_recover_window_s
    # how long recovery was watched: with t_recover_s None, it did not recover within
    # it (absent: recovery not measured)
    t_recover_window_s: Annotated[float | None, Field(gt=0, exclude_if=lambda v: v is None)] = None
    wasted_work_share: Annotated[float | None, Field(ge=0, le=1)] = None
    scaling_efficiency: Annotated[float, Field(gt=0, le=1)] = 1.0
    scaling_measured: bool = False  # False: assumed (one replica probed)
    scaling_unmeasured: str = Field("", exclude_if=lambda v: not v)  # why not, when two lent
    active_replicas: Annotated[int, Field(ge=0)] = 1  # ACTIVE when it was measured
    profile: WorkloadProfile
    probe_s: Annotated[float, Field(ge=0)] = 0.0  # how long the probe ran
    prober: str = ""  # who ran it (the drill service's id, or failoverctl's user)
    # The probed replica's serving configuration (model, max_model_len, max_num_seqs,
    # KV cache): a region serving with another is stale, as one on another engine is.
    # None: probed before it was recorded (not judged).
    serving: ServingConfig | None = Field(None, exclude_if=lambda v: v is None)
    # Requests the replica refused as too long for its context (chaos/capacity/results.py:
    # the workload's fault, not counted as errors): 0 when the workload fit.
    workload_errors: Annotated[int, Field(ge=0, exclude_if=lambda v: not v)] = 0

    @model_validator(mode="after")
    def _consistent(self) -> CapacityRecord:
        if not math.isfinite(self.r_base_rps):
            raise ValueError("r_base_rps must be finite")
        return self

    @property
    def effect(self) -> HitEffect:
        """One replica's capacity as a function of the hit rate."""
        return HitEffect(self.r_base_rps, self.beta)

    def region_effect(self, active_replicas: int) -> HitEffect:
        """The region's: the replica's x ACTIVE replicas x the scaling efficiency (one
        replica scales at 1.0 by definition)."""
        n = max(0, active_replicas)
        eff = 1.0 if n <= 1 else self.scaling_efficiency
        return HitEffect(self.r_base_rps * n * eff, self.beta)

    def allowed_rps(self, hit_rate: float, active_replicas: int) -> float:
        return self.region_effect(active_replicas).capacity(hit_rate) / self.factor_of_safety


def critical_hit_rate(record: CapacityRecord, active_replicas: int, load_rps: float) -> float:
    """The prefix-cache hit rate under which what ``record`` says the region bears (its
    ``active_replicas``, after the factor of safety) falls below ``load_rps``: ``h`` in
    ``allowed(h) = load``, ``(1 - allowed(0) / load) / beta``. At or under 0 the region
    bears its load even fully cold (-inf without a load: it bears none at any hit rate);
    over 1, at no hit rate. With beta 0 the hit rate changes nothing: -inf when it bears
    the load, +inf when not. The hit-rate alert (TectonicHitRateNearCritical) fires near
    it."""
    cold = record.allowed_rps(0.0, active_replicas)
    if load_rps <= 0:
        return -math.inf
    if record.beta <= 0:
        return -math.inf if cold >= load_rps else math.inf
    return (1.0 - cold / load_rps) / record.beta


class CapacityPolicy(Frozen):
    """The topology's ``capacity`` section: when a measurement may be used, and the CBU
    thresholds of the status, alerts and the ladder trigger."""

    max_age_s: Annotated[float, Field(gt=0)] = 14 * 86400.0  # two weekly probe windows
    warn_cbu: Annotated[float, Field(gt=0, description="capacity utilisation (CBU) that warns")] = (
        0.8
    )
    page_cbu: Annotated[float, Field(gt=0, description="capacity utilisation (CBU) that pages")] = (
        1.0
    )

    @model_validator(mode="after")
    def _ordered(self) -> CapacityPolicy:
        if self.page_cbu <= self.warn_cbu:
            raise ValueError("page_cbu must be above warn_cbu")
        return self


class CapacitySource(StrEnum):
    MEASURED = "measured"  # a fresh probe of this engine
    STALE = "stale"  # a probe exists but is too old, of another engine or serving config
    TYPED = "typed"  # no probe: the topology's capacity_rps


@dataclass(frozen=True, slots=True)
class Bearing:
    """What a region bears, as the planner reads it: ``effect`` is the region's whole
    capacity (before the factor of safety) as a function of the hit rate."""

    region: str
    source: CapacitySource
    effect: HitEffect
    factor_of_safety: float
    reason: str  # why this source (the stale measurement's age or engine, ...)
    record: CapacityRecord | None = None

    def allowed(self, hit_rate: float) -> float:
        return self.effect.capacity(hit_rate) / self.factor_of_safety

    @property
    def stale(self) -> bool:
        return self.source is CapacitySource.STALE


MAX_ENGINE_VERSION = 128  # characters; the control plane refuses longer ones


def clean_engine_version(raw: object) -> str:
    """An engine's ``/version`` as Tectonic stores and compares it: printable characters
    only, stripped, at most ``MAX_ENGINE_VERSION``. The agent's report and the probe's
    record both go through it, so that one engine's answer always matches itself."""
    return "".join(c for c in str(raw) if c.isprintable()).strip()[:MAX_ENGINE_VERSION]


def resolve(
    region: str,
    record: CapacityRecord | None,
    *,
    capacity_rps: float,
    policy: CapacityPolicy,
    now: float,
    active_replicas: int | None,
    engine_version: str | None = None,
    serving_config: str | None = None,
) -> Bearing:
    """The region's bearing capacity: measured when ``record`` is fresh (younger than
    ``policy.max_age_s``), of the engine the region runs now (``engine_version``;
    None or "", or a record that does not know its engine: not judged) and with the
    serving configuration it runs now (``serving_config``, the region's fingerprint:
    ``serving_config.differences`` over the figures both know; None or "", or a record
    without one: not judged); otherwise the typed ``capacity_rps``, stale when a record
    exists. ``active_replicas`` None: as many as when it was measured."""
    fallback = HitEffect(capacity_rps, 0.0)
    if record is None:
        return Bearing(region, CapacitySource.TYPED, fallback, 1.0, "no capacity probe yet")
    age = now - record.measured_at
    why_stale = None
    if age > policy.max_age_s:
        why_stale = f"measured {age / 86400:.1f} days ago (max {policy.max_age_s / 86400:g})"
    elif engine_version and record.engine_version and engine_version != record.engine_version:
        why_stale = (
            f"measured on engine {record.engine_version!r}, the region runs {engine_version!r}"
        )
    elif serving_config and record.serving is not None:
        changed = differences(record.serving.fingerprint(), serving_config)
        if changed:
            why_stale = f"measured on another serving configuration: {', '.join(changed)}"
    if why_stale is not None:
        return Bearing(region, CapacitySource.STALE, fallback, 1.0, why_stale, record)
    n = record.active_replicas if active_replicas is None else active_replicas
    how = "measured" if record.scaling_measured else "assumed"
    return Bearing(
        region,
        CapacitySource.MEASURED,
        record.region_effect(n),
        record.factor_of_safety,
        f"probed {age / 3600:.1f} h ago; {n} ACTIVE replica(s), scaling efficiency "
        f"{record.scaling_efficiency:g} ({how})",
        record,
    )
