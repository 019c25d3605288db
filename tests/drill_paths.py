"""The state path a drill's audit trail shows for one region, as the tests compare it."""

from __future__ import annotations

from chaos.drills.result import DrillResult


def blackout_path(result: DrillResult, region: str) -> list[str]:
    """The region's transitions, a leading DEGRADED dropped.

    A blackout stops the region's replicas one after another, so a tick may see some
    of them gone before the rest and call the region DEGRADED first; everything after
    that is exact.
    """
    path = [t.to_state for t in result.transitions if t.region == region]
    return path[1:] if path[:1] == ["DEGRADED"] else path
