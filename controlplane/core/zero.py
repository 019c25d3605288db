"""Scale to zero, the scaler's part (docs/scaling.md, "Scale to zero"). PURE.

With ``scaling.idle_to_zero_s`` set (and ``min_active: 0``), a pool that had no demand
for that long may go to 0 ACTIVE: asleep on purpose. Demand is served load (a report
over ``IDLE_RPS``) or a wake request (``wake/<unit>``, written by a gateway or picker
that got a request for the pool while it had no ACTIVE replica). While the last demand
is within the idle window the pool keeps at least one ACTIVE replica; a wake request
newer than the last one honoured wakes a pool at zero at once (an up move waits for
nothing). The idle window is the step's stable window: going to zero does not wait
``stable_window_s`` again.

At zero the pool keeps what ``zero_state`` says: ``warm`` at least one WARM replica (a
wake in seconds), ``cold`` none (a launch, then a wake).
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.kernel.pool.scale import ScaleRecord, ScalingPolicy

IDLE_RPS = 1e-3  # served requests/s at or below this is no load


@dataclass(frozen=True, slots=True)
class Zero:
    floor: bool  # keep at least one ACTIVE replica (demand within the idle window)
    may_sleep: bool  # no demand for the idle window: 0 ACTIVE is allowed, at once
    demand_at: float | None
    woken_at: float | None
    reasons: tuple[str, ...]


def decide(
    base: ScaleRecord,
    wake_at: float | None,
    load_rps: float,
    now: float,
    policy: ScalingPolicy,
) -> Zero:
    """What scale to zero asks of this tick; off (no floor, no sleep) without an idle
    window. A pool first seen counts as having had demand now (never asleep blind)."""
    idle = policy.idle_to_zero_s
    if idle is None:
        return Zero(False, False, base.demand_at, base.woken_at, ())
    demand = base.demand_at if base.demand_at is not None else now
    if load_rps > IDLE_RPS:
        demand = now
    woken, reasons = base.woken_at, []
    if wake_at is not None and (woken is None or wake_at > woken):
        # a request asked since the last one honoured: demand (a skewed clock's future
        # time counts as now, so that it cannot hold a pool awake beyond its window)
        woken = wake_at
        demand = max(demand, min(wake_at, now))
        if base.active == 0:
            reasons.append("woken by a request -> 1 ACTIVE")
    quiet = now - demand
    if quiet < idle:
        return Zero(True, False, demand, woken, tuple(reasons))
    if base.active > 0:
        reasons.append(f"no load for {quiet:.0f} s (idle_to_zero_s {idle:g}): to zero")
    else:
        reasons.append(f"asleep: no load for {quiet:.0f} s")
    return Zero(False, True, demand, woken, tuple(reasons))


def warm_at_zero(active: int, warm: int, policy: ScalingPolicy) -> int:
    """WARM replicas a pool at zero keeps: one at least (``zero_state: warm``), none
    (``cold``); a pool awake keeps what the scaler asked."""
    if active > 0 or policy.idle_to_zero_s is None:
        return warm
    return max(warm, 1) if policy.zero_state == "warm" else 0
