"""The scaler's record as the status and GetScale show it (docs/scaling.md)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from controlplane.core.cold_start import ColdStart
from controlplane.kernel.pool.scale import ScaleRecord


class ScaleView(BaseModel):
    active: int = Field(description="desired ACTIVE replicas")
    warm: int = Field(description="desired WARM standby")
    reason: str = Field(description="the first of its reasons: the forecast and capacity used")
    decided_at: float


def scale_view(record: ScaleRecord | None) -> ScaleView | None:
    if record is None:
        return None
    return ScaleView(
        active=record.active,
        warm=record.warm,
        reason=record.reasons[0] if record.reasons else "",
        decided_at=record.decided_at,
    )


@dataclass(frozen=True)
class PoolScaleView:
    """A unit's scale record (None: none yet) and the ACTIVE replicas serving it now."""

    unit: str
    active_now: int | None
    record: ScaleRecord | None
    cold_start: ColdStart | None = None  # the cold-start check (core/cold_start.py)
