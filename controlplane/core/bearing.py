"""Splitting a failover's load by what each target bears (docs: bearing capacity).

A target's capacity depends on the prefix-cache hit rate of what it serves
(``HitEffect``: ``R(h) = R_base / (1 - beta h)``), and moved traffic arrives cold
unless the pre-warm warmed its prefixes. So the unit of account is the share of a
target's allowed capacity a load uses: ``load / (R(h) / fos)``, summed over the loads
it serves at their own hit rates. That sum is the target's capacity utilisation (CBU).

``split`` gives each target as much of the moved load as keeps its CBU at or under
``max_cbu`` (1.0), in proportion to the room each has; what none can take is the
shortfall, for the plan to say and the degradation ladder to act on (shedding low
priority first) instead of overloading the targets. Pure: numbers in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.kernel.capacity.bearing import HitEffect, utilization
from controlplane.kernel.capacity.record import Bearing, resolve
from controlplane.kernel.config import Topology
from controlplane.kernel.ladder.model import LOAD_SIGNAL
from controlplane.kernel.snapshot import RegionView

HIT_RATE_SIGNAL = "prefix_hit_rate"  # the agent's, from vLLM's prefix-cache counters


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    effect: HitEffect  # the region's measured capacity (all its ACTIVE replicas)
    factor_of_safety: float
    load_rps: float  # what it serves now
    hit_rate: float  # of what it serves now

    def allowed(self, hit_rate: float) -> float:
        return self.effect.capacity(hit_rate) / self.factor_of_safety

    def cbu(self, moved_rps: float = 0.0, moved_hit_rate: float = 0.0) -> float:
        used = self.load_rps / self.allowed(self.hit_rate)
        return used + moved_rps / self.allowed(moved_hit_rate)


@dataclass(frozen=True, slots=True)
class Split:
    moved_rps: dict[str, float]  # target -> rps it takes
    rooms: dict[str, float]  # target -> rps it could take at that hit rate
    cbu_after: dict[str, float]  # target -> CBU once it carries its part
    shortfall_rps: float  # moved load no target can bear

    @property
    def fits(self) -> bool:
        return self.shortfall_rps <= 1e-9


def moved_hit_rate(source_hit_rate: float, prewarm_attainment: float | None) -> float:
    """The hit rate moved traffic will have at its target: cold, unless the pre-warm
    warmed its prefixes (its verified attainment: the share of the chosen prefixes
    warmed) - then the source's own hit rate on that share."""
    if prewarm_attainment is None:
        return 0.0
    a = min(1.0, max(0.0, prewarm_attainment))
    return min(1.0, max(0.0, source_hit_rate)) * a


def split(
    moved_rps: float,
    hit_rate: float,
    targets: Sequence[Target],
    *,
    max_cbu: float = 1.0,
) -> Split:
    """Share ``moved_rps`` (arriving at ``hit_rate`` on every target) among ``targets``
    so that none passes ``max_cbu``: each gets ``room x weight``, its room being the
    load it can still take at that hit rate, in proportion to the rooms."""
    if moved_rps < 0:
        raise ValueError(f"moved load must be >= 0, got {moved_rps}")
    rooms = {t.name: max(0.0, (max_cbu - t.cbu()) * t.allowed(hit_rate)) for t in targets}
    total_room = sum(rooms.values())
    take = min(moved_rps, total_room)
    moved = {
        name: (take * room / total_room if total_room > 0 else 0.0) for name, room in rooms.items()
    }
    cbu_after = {t.name: t.cbu(moved[t.name], hit_rate) for t in targets}
    return Split(moved, rooms, cbu_after, max(0.0, moved_rps - take))


# ---- a region as the planner reads it ------------------------------------------------


def load_of(view: RegionView) -> float:
    return max(0.0, view.health.signals.get(LOAD_SIGNAL, 0.0))


def hit_rate_of(view: RegionView) -> float:
    return min(1.0, max(0.0, view.health.signals.get(HIT_RATE_SIGNAL, 0.0)))


def region_bearing(view: RegionView, topology: Topology, now: float) -> Bearing:
    """The region's capacity: its probe's when fresh, else the typed ``capacity_rps``."""
    return resolve(
        view.name,
        view.capacity,
        capacity_rps=topology.region(view.name).capacity_rps,
        policy=topology.capacity,
        now=now,
        active_replicas=view.active_replicas,
        engine_version=view.health.engine_version or None,
        serving_config=view.health.serving_config or None,
    )


def allowed_now(view: RegionView, topology: Topology, now: float) -> float:
    """The load the region bears now, at the hit rate of what it serves."""
    return region_bearing(view, topology, now).allowed(hit_rate_of(view))


def cbu_now(view: RegionView, topology: Topology, now: float) -> float:
    """Capacity utilisation: served load over what the region bears at its hit rate."""
    return utilization(load_of(view), allowed_now(view, topology, now))


def target_of(view: RegionView, topology: Topology, now: float) -> Target:
    b = region_bearing(view, topology, now)
    return Target(view.name, b.effect, b.factor_of_safety, load_of(view), hit_rate_of(view))
