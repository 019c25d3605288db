"""A pool at zero on purpose is asleep, not down (scale to zero, docs/scaling.md). PURE.

With no ACTIVE replica, :func:`regions.agent.verdict.fold_verdict` says UNHEALTHY: none
is up. That is right for a pool whose replicas died, and wrong for one the leader put
to sleep (its ``scale/<unit>`` asks 0 ACTIVE) or is waking from there (it asks one, the
wake is under way). Then the agent says HEALTHY with the ``asleep`` signal, which the
leader's health fold reads as "asleep on purpose": never failed over. A wake that has
not produced an ACTIVE replica ``WAKE_GRACE_S`` after the pool was last asleep is no
longer a wake: the verdict is the probes' again.
"""

from __future__ import annotations

from controlplane.kernel.model import Health
from controlplane.kernel.pool.scale import ASLEEP_SIGNAL
from regions.agent.verdict import RegionVerdict

# Long enough for a launch and a wake from zero_state cold on the simulator or a small
# model; a pool that has not served this long after asking to is down.
WAKE_GRACE_S = 300.0


def asleep_since(
    last: float | None, active: int, desired_active: float | None, now: float
) -> float | None:
    """When the pool was last asleep on purpose (no ACTIVE replica, the leader asks
    none): ``now`` while it is, the last time while it wakes, None once it serves."""
    if active > 0:
        return None
    if desired_active is not None and desired_active <= 0:
        return now
    return last


def asleep_view(view: RegionVerdict, since: float | None, now: float) -> RegionVerdict:
    """``view`` as the pool's sleep makes it: HEALTHY and ``asleep`` while asleep or
    waking within the grace; the probes' verdict otherwise."""
    if since is None or now - since > WAKE_GRACE_S or view.probes:
        return view
    waking = now > since
    detail = (
        f"waking from zero ({now - since:.0f} s)"
        if waking
        else "asleep on purpose: scaled to zero by the leader"
    )
    return view.model_copy(
        update={
            "health": Health.HEALTHY,
            "signals": {**view.signals, ASLEEP_SIGNAL: 1.0},
            "detail": detail,
        }
    )
