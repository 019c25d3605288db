"""Warm-pool sizing: how many WARM replicas absorb a burst within a budget. PURE.

Inputs (:class:`BurstProfile`), with units:

- ``burst_rps``     R  [requests/s]  extra load above what the ACTIVE replicas serve
- ``replica_rps``   c  [requests/s]  what one replica sustains within its latency SLO
- ``cold_start_s``  Tc [s]           launch -> healthy and asleep (COLD -> WARM)
- ``activation_s``  Ta [s]           ``/wake_up`` + ``/reset_prefix_cache`` -> serving
- ``budget_s``      B  [s]           the burst must be absorbed within B of its start
- ``activation_rate`` a [replicas/s] wakes the region can carry out per second (wakes
  share host memory bandwidth); None = all at once

Formula:

1. Replicas the burst needs:  N = ceil(R / c).
2. Wakes that finish within the budget:  K = floor((B - Ta) * a) + 1 when Ta <= B
   (the k-th wake starts at (k-1)/a), K = 0 when Ta > B, unbounded when a is None.
   N > K means no warm pool can meet the budget: change B, a or Ta, or over-provision
   ACTIVE replicas instead (``feasible`` is False).
3. Cold starts help only when Tc + Ta <= B (launched in parallel, then woken); then up
   to ``cold_slots`` of the N may come from COLD. Otherwise every one must be WARM:
   W = N - (cold_slots if Tc + Ta <= B else 0), at least 0.

A pool with fewer WARM replicas than W is too small: it absorbs (warm + usable cold) * c
requests/s of the burst within B and leaves the rest queued or rejected.

Worked example: R = 100 req/s, c = 30 req/s -> N = ceil(3.33) = 4. Tc = 120 s, Ta = 8 s,
B = 30 s: 128 s > 30 s, so cold starts are too slow and W = 4. With a = 0.5 replicas/s,
K = floor(22 * 0.5) + 1 = 12 >= 4: feasible. A pool configured with warm = 2 is 2 short
and leaves 100 - 2 * 30 = 40 req/s unabsorbed.
"""

from __future__ import annotations

import math

from pydantic import Field

from controlplane.kernel.model import Frozen

_EPS = 1e-9  # so that 90 / 30 is 3 replicas, not 4, after float rounding


class BurstProfile(Frozen):
    """The burst a region's pool must absorb, and how fast replicas come up."""

    burst_rps: float = Field(ge=0)
    replica_rps: float = Field(gt=0)
    cold_start_s: float = Field(ge=0)
    activation_s: float = Field(ge=0)
    budget_s: float = Field(gt=0)
    activation_rate: float | None = Field(None, gt=0)


class PoolSizeReport(Frozen):
    """Whether a configured pool absorbs the burst within budget, by how much it falls
    short and why (``reason`` is for an operator)."""

    needed_replicas: int  # N
    needed_warm: int  # W
    configured_warm: int
    shortfall: int  # WARM replicas missing (0 when the pool is big enough)
    too_small: bool  # fewer WARM than needed; more WARM would help
    feasible: bool  # False when no WARM pool can meet the budget
    absorbed_rps: float  # of the burst, within the budget
    unabsorbed_rps: float
    reason: str


def replicas_for_burst(p: BurstProfile) -> int:
    """N = ceil(R / c) [replicas]."""
    return max(0, math.ceil(p.burst_rps / p.replica_rps - _EPS))


def wakes_within_budget(p: BurstProfile) -> int | None:
    """K: wakes that are serving within the budget; None when unbounded."""
    if p.activation_s > p.budget_s:
        return 0
    if p.activation_rate is None:
        return None
    return math.floor((p.budget_s - p.activation_s) * p.activation_rate + _EPS) + 1


def cold_fits(p: BurstProfile) -> bool:
    """Whether a COLD replica launched at the burst's start serves within the budget."""
    return p.cold_start_s + p.activation_s <= p.budget_s


def warm_needed(p: BurstProfile, cold_slots: int | None = None) -> int:
    """W [replicas]: WARM replicas needed; ``cold_slots`` (None: unlimited) is how many
    COLD slots the pool may launch when cold starts fit the budget."""
    n = replicas_for_burst(p)
    if not cold_fits(p):
        return n
    return 0 if cold_slots is None else max(0, n - cold_slots)


def check_pool(
    p: BurstProfile, configured_warm: int, cold_slots: int | None = None
) -> PoolSizeReport:
    """Compare a pool's WARM count (plus ``cold_slots`` launchable) with the burst."""
    n = replicas_for_burst(p)
    w = warm_needed(p, cold_slots)
    k = wakes_within_budget(p)
    feasible = k is None or n <= k
    usable_cold = 0
    if cold_fits(p):
        usable_cold = n if cold_slots is None else min(cold_slots, n)
    in_time = min(configured_warm + usable_cold, n)
    if k is not None:
        in_time = min(in_time, k)
    absorbed = min(p.burst_rps, in_time * p.replica_rps)
    shortfall = max(0, w - configured_warm)
    path = (
        f"Tc {p.cold_start_s:g} s + Ta {p.activation_s:g} s "
        f"{'<=' if cold_fits(p) else '>'} budget {p.budget_s:g} s"
    )
    why = [
        f"burst {p.burst_rps:g} req/s at {p.replica_rps:g} req/s per replica needs "
        f"{n} replica(s) serving within {p.budget_s:g} s",
        f"{path}: {'cold starts may cover' if cold_fits(p) else 'all must be WARM'}",
    ]
    if not feasible:
        why.append(
            f"only {k} wake(s) finish within the budget at "
            f"{p.activation_rate:g} replicas/s: no WARM pool meets it"
        )
    if shortfall:
        why.append(
            f"{configured_warm} WARM configured, {w} needed: {shortfall} short, "
            f"{p.burst_rps - absorbed:g} req/s unabsorbed"
        )
    else:
        why.append(f"{configured_warm} WARM configured, {w} needed")
    return PoolSizeReport(
        needed_replicas=n,
        needed_warm=w,
        configured_warm=configured_warm,
        shortfall=shortfall,
        too_small=shortfall > 0,
        feasible=feasible,
        absorbed_rps=absorbed,
        unabsorbed_rps=p.burst_rps - absorbed,
        reason="; ".join(why),
    )
