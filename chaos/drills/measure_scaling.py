"""The scaler's criteria (docs/scaling.md), judged over a drill's surges: pure functions.

A surge (the ``surge`` fault) raises the offered load into one region for a window.
What the scaler must show: the requests sent into that region meanwhile answered fast
(their first-token p99, and the share within the SLO), every change of a pool's desired
size in ``scale/<unit>`` audited, and each pool that grew back at its pre-surge ACTIVE
count soon after the surge ends (the extras cost money once the load is gone).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from chaos.drills.result import Criterion, Sample
from chaos.drills.scenario import Measurements

# An audit entry and the sample that first shows its record are apart by up to one
# sampling period, and the leader's clock is read apart from the drill's: this much
# either side still matches.
AUDIT_SLACK_S = 2.0


@dataclass(frozen=True)
class RequestLog:
    """One synthetic request: drill time it was sent, the region whose data plane it
    entered, seconds to its first byte (None: it failed)."""

    t: float
    home: str
    first_byte_s: float | None


@dataclass(frozen=True)
class SurgeWindow:
    """One surge: into ``region``, from ``start`` to ``end`` (drill time, the ramps
    included)."""

    region: str
    start: float
    end: float


@dataclass(frozen=True)
class ScaleEvent:
    """A ``scale`` audit entry: the unit's new desired sizes, at drill time ``t``."""

    t: float
    unit: str
    active: int
    warm: int


@dataclass(frozen=True)
class ScaleBack:
    """One pool over a surge: ACTIVE at its start, the most during it and after, and how
    long after its end ACTIVE was back at the start's count (None: not seen back)."""

    unit: str
    before: int
    peak: int
    back_after_s: float | None


def in_surges(requests: Sequence[RequestLog], surges: Sequence[SurgeWindow]) -> list[RequestLog]:
    """The requests sent into a surged region while its surge ran."""
    return [
        r
        for r in requests
        if any(w.start <= r.t <= w.end and _of(r.home, w.region) for w in surges)
    ]


def ttft_p99_s(requests: Sequence[RequestLog]) -> float | None:
    """The first-byte p99 of the answered requests (nearest rank); None for none."""
    answered = sorted(r.first_byte_s for r in requests if r.first_byte_s is not None)
    if not answered:
        return None
    return answered[max(0, math.ceil(0.99 * len(answered)) - 1)]


def slo_attainment(requests: Sequence[RequestLog], slo_s: float) -> float | None:
    """The share of ``requests`` answered with a first byte within ``slo_s``; a failed
    request missed it. None for no request."""
    if not requests:
        return None
    met = sum(1 for r in requests if r.first_byte_s is not None and r.first_byte_s <= slo_s)
    return met / len(requests)


def unaudited_scale_changes(
    samples: Sequence[Sample], events: Sequence[ScaleEvent], slack_s: float = AUDIT_SLACK_S
) -> list[str]:
    """Each change of a unit's desired (ACTIVE, WARM) between two samples with no
    ``scale`` audit entry of those sizes for that unit written between them; in words."""
    missing: list[str] = []
    last: dict[str, tuple[float, tuple[int, int]]] = {}
    for s in samples:
        for unit, view in s.regions.items():
            if view.desired_active is None or view.desired_warm is None:
                continue
            size = (view.desired_active, view.desired_warm)
            seen = last.get(unit)
            last[unit] = (s.t, size)
            if seen is None or seen[1] == size:
                continue
            since = seen[0]
            if not any(
                e.unit == unit
                and (e.active, e.warm) == size
                and since - slack_s <= e.t <= s.t + slack_s
                for e in events
            ):
                missing.append(
                    f"{unit} {seen[1][0]}+{seen[1][1]} -> {size[0]}+{size[1]} "
                    f"(t={since:.1f}-{s.t:.1f}s)"
                )
    return missing


def scale_backs(samples: Sequence[Sample], surge: SurgeWindow) -> list[ScaleBack]:
    """Every pool whose ACTIVE count rose above its count at the surge's start, during
    the surge or after it: its peak, and how long after the surge's end it was back at
    that count (None: never, in the samples)."""
    before: dict[str, int] = {}
    for s in samples:
        if s.t > surge.start:
            break
        for unit, view in s.regions.items():
            if view.active is not None:
                before[unit] = view.active
    out = []
    for unit, count in sorted(before.items()):
        later = [
            (s.t, n) for s in samples if s.t > surge.start and (n := _active(s, unit)) is not None
        ]
        peak = max((n for _, n in later), default=count)
        if peak <= count:
            continue
        back = next((t for t, n in later if t >= surge.end and n <= count), None)
        out.append(
            ScaleBack(unit, count, peak, None if back is None else round(back - surge.end, 1))
        )
    return out


def surge_criteria(
    m: Measurements,
    samples: Sequence[Sample],
    requests: Sequence[RequestLog],
    surges: Sequence[SurgeWindow],
    events: Sequence[ScaleEvent],
) -> list[Criterion]:
    """The scaler's criteria the scenario asks for, in the report's order."""
    out: list[Criterion] = []
    during = in_surges(requests, surges)
    where = ", ".join(f"{w.region} t={w.start:.0f}-{w.end:.0f}s" for w in surges) or "no surge"
    failed = sum(1 for r in during if r.first_byte_s is None)
    if m.max_ttft_p99_s is not None:
        p99 = ttft_p99_s(during)
        out.append(
            Criterion(
                name="surge_ttft_p99",
                passed=p99 is not None and p99 <= m.max_ttft_p99_s,
                measured="no answered request" if p99 is None else f"{p99:.3f}s",
                required=f"≤ {m.max_ttft_p99_s:g}s",
                detail=_over(p99, m.max_ttft_p99_s, "s")
                + f"first byte of the {len(during) - failed} requests answered of "
                f"{len(during)} sent during the surge ({where})",
            )
        )
    if m.min_slo_attainment is not None:
        share = slo_attainment(during, m.ttft_slo_s)
        met = round((share or 0.0) * len(during))
        out.append(
            Criterion(
                name="slo_attainment",
                passed=share is not None and share >= m.min_slo_attainment,
                measured="no request" if share is None else f"{share:.1%} ({met} of {len(during)})",
                required=f"≥ {m.min_slo_attainment:.0%} within {m.ttft_slo_s:g}s",
                detail=(
                    f"short by {m.min_slo_attainment - share:.1%}; "
                    if share is not None and share < m.min_slo_attainment
                    else ""
                )
                + f"first byte within the SLO, a failed request ({failed}) missed it ({where})",
            )
        )
    if m.scale_audited:
        missing = unaudited_scale_changes(samples, events)
        changes = len(events)
        out.append(
            Criterion(
                name="scale_audited",
                passed=not missing,
                measured=f"{len(missing)} change(s) unaudited, {changes} scale entries",
                required="every change of scale/<unit> has its audit entry",
                detail="; ".join(missing[:5]),
            )
        )
    if m.scaled_back_within_s is not None:
        out.append(_scaled_back(m.scaled_back_within_s, samples, surges))
    return out


def _scaled_back(
    within_s: float, samples: Sequence[Sample], surges: Sequence[SurgeWindow]
) -> Criterion:
    backs = [b for w in surges for b in scale_backs(samples, w)]
    late = [b for b in backs if b.back_after_s is None or b.back_after_s > within_s]
    words = "; ".join(
        f"{b.unit} {b.before} -> {b.peak} -> "
        + (f"{b.before} {b.back_after_s:g}s after" if b.back_after_s is not None else "not back")
        for b in backs
    )
    over = [
        f"{b.unit} over by {b.back_after_s - within_s:.1f}s"
        if b.back_after_s is not None
        else f"{b.unit} still above {b.before} ACTIVE at the end"
        for b in late
    ]
    return Criterion(
        name="scaled_back",
        passed=not late,
        measured=words or "no pool grew",
        required=f"each pool that grew at its pre-surge ACTIVE ≤ {within_s:g}s after the surge",
        detail="; ".join(over),
    )


def still_grown(samples: Sequence[Sample], surges: Sequence[SurgeWindow]) -> list[str]:
    """The pools not back at their pre-surge ACTIVE count yet (what the runner waits
    for after a surge, bounded by ``scaled_back_within_s``)."""
    return [b.unit for w in surges for b in scale_backs(samples, w) if b.back_after_s is None]


def _active(s: Sample, unit: str) -> int | None:
    view = s.regions.get(unit)
    return None if view is None else view.active


def _of(home: str, region: str) -> bool:
    """A request homed in ``home`` went into ``region`` (a region names its pools)."""
    return home == region or home.startswith(region + ".")


def _over(measured: float | None, limit: float, unit: str) -> str:
    if measured is None or measured <= limit:
        return ""
    return f"over by {measured - limit:.3f}{unit}; "
