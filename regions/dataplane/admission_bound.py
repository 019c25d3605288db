"""The upper bound of admission control's per-replica in-flight limit, from the measured
capacity (``capacity/<region>``, :class:`CapacityRecord`). Pure.

Little's law: a replica carrying ``R`` requests/s whose requests each hold a slot for
``W`` seconds holds ``R x W`` at once on average. The probe records each step's mean
in-flight (``ProbeStep.mean_inflight``); at a probe's target rate (its ultimate, or the
allowed rate: the ultimate over the factor of safety) the in-flight there, interpolated
between the two steps around it, over that rate is ``W`` at that probe's hit rate. At
the hit rate ``h`` asked for, ``R`` is the fitted ``R_base / (1 - beta h)`` (or over the
factor of safety) and ``W`` is interpolated linearly between the probes' hit rates
(clamped to the measured range). The bound is ``ceil(R x W)``, at least 1: a fraction
of a request still takes a slot.

Why the ultimate by default: the adaptive limit keeps first tokens under target below
the bound; the bound is the measured ceiling past which the SLA broke. The factor of
safety is a planning margin (``at="allowed"`` applies it here too, for an operator who
wants admission to refuse at what the planner counts on).

None (no bound) when the record predates the field (no step says its in-flight), or no
probe's steps reach its target rate; the reason says which.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from controlplane.kernel.capacity.record import CapacityRecord, HitProbe, ProbeStep


class BoundAt(StrEnum):
    ULTIMATE = "ultimate"
    ALLOWED = "allowed"


@dataclass(frozen=True, slots=True)
class InflightBound:
    """What bounds each replica's limit, and the figures it came from (for the log)."""

    limit: int
    hit_rate: float
    rate_rps: float  # per replica, at ``hit_rate`` (ultimate or allowed)
    hold_s: float  # the time a request holds its slot there

    def describe(self) -> str:
        return (
            f"{self.limit} in flight per replica ({self.rate_rps:.3g} rps x "
            f"{self.hold_s:.3g} s held, at hit rate {self.hit_rate:.2f})"
        )


def inflight_at(steps: Sequence[ProbeStep], rate_rps: float) -> float | None:
    """The mean in-flight at ``rate_rps``, linear between the steps around it (the
    nearest step's beyond the ends only down to the lowest rate: below it in-flight
    scales with the rate); None when no step measured it or the rate is above them."""
    known = sorted(
        ((s.offered_rps, s.mean_inflight) for s in steps if s.mean_inflight is not None),
        key=lambda p: p[0],
    )
    if not known or rate_rps > known[-1][0] * (1 + 1e-9):
        return None
    lo_rate, lo_inflight = known[0]
    if rate_rps <= lo_rate:
        return lo_inflight * rate_rps / lo_rate
    for (r0, l0), (r1, l1) in itertools.pairwise(known):
        if r0 <= rate_rps <= r1:
            if r1 == r0:
                return max(l0, l1)
            return l0 + (l1 - l0) * (rate_rps - r0) / (r1 - r0)
    return known[-1][1]


def _hold(probe: HitProbe, fos: float, at: BoundAt) -> float | None:
    """The slot-hold time at ``probe``'s target rate, or None without the figures."""
    rate = probe.ultimate_rps / (fos if at is BoundAt.ALLOWED else 1.0)
    inflight = inflight_at(probe.steps, rate)
    if inflight is None or inflight <= 0:
        return None
    return inflight / rate


def inflight_bound(
    record: CapacityRecord, *, hit_rate: float | None = None, at: BoundAt = BoundAt.ULTIMATE
) -> InflightBound | str:
    """The per-replica bound at ``hit_rate`` (None: the lowest hit rate probed, what a
    failover's moved traffic has), or why there is none."""
    holds = sorted(
        (p.hit_rate, w) for p in record.probes if (w := _hold(p, record.factor_of_safety, at))
    )
    if not holds:
        if not any(s.mean_inflight is not None for p in record.probes for s in p.steps):
            return "the capacity record has no in-flight figures (probed before they were recorded)"
        return f"no probe step reached its {at.value} rate with an in-flight figure"
    h = holds[0][0] if hit_rate is None else min(1.0, max(0.0, hit_rate))
    hold = _interpolate(holds, h)
    rate = record.effect.capacity(h)
    if at is BoundAt.ALLOWED:
        rate /= record.factor_of_safety
    limit = max(1, math.ceil(rate * hold - 1e-9))
    return InflightBound(limit, h, rate, hold)


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Linear in ``x`` between sorted (x, y) points, clamped to the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]
