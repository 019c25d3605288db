"""What the reactive guard teaches the scaler: a size that missed (docs/scaling.md).
PURE.

The scaler sizes ACTIVE on the capacity record. When the record overstates what a
replica bears (the workload changed since the probe: longer prompts, another template),
the forecast asks for too few, queues build, the guard adds one, the stable window
passes, the forecast asks for the same too few again, and the guard trips again: one
scale-down and one guard a stable window, for as long as the load lasts (at a capacity
43 % over, 47 size changes in 30 minutes of a flat load: docs/scaling.md).

The evidence is the first half of that cycle: the guard tripping within a stable window
of a scale-down, the pool not raised since, while the pool had every ACTIVE replica the
forecast asked for. Only the trip that starts a guard episode counts (while the guard
holds, the queue it found drains on the replicas it added). The lesson is the size that
missed and the load it was sized for then (the forecast's upper band): while it holds, a
scale-down stops one above that size as long as the load sized for is within
``TOLERANCE`` of it or more; below that, the size is tried again (and a miss there
teaches anew). It holds for ``scaling.guard_lesson_s`` after the trip, or until the
capacity is measured again (a probe after the lesson answers the question it raises); a
newer trip replaces it.

A lesson neither scales the record nor raises a size: a pool whose record is right loses
at most one replica's saving, at one load, for the lesson's time, after a burst that
tripped the guard right after a scale-down. Guard trips at other times (a pool near its
allowed rate, where the first-token p99 is the SLO by the record's definition; a ramp
the forecast had not caught) teach nothing.
"""

from __future__ import annotations

from controlplane.kernel.pool.scale import GuardLesson, ScalingPolicy

TOLERANCE = 0.1  # a load this much under the lesson's lets the scaler try the size again


def fresh(
    lesson: GuardLesson | None, now: float, policy: ScalingPolicy, measured_at: float | None
) -> GuardLesson | None:
    """``lesson`` while it holds: within ``guard_lesson_s`` of its trip, and the capacity
    not measured since (``measured_at``: the record's; None: not measured)."""
    if lesson is None or policy.guard_lesson_s <= 0:
        return None
    if now - lesson.at > policy.guard_lesson_s:
        return None
    if measured_at is not None and measured_at > lesson.at:
        return None
    return lesson


def learn(
    lesson: GuardLesson | None,
    *,
    guard: str,
    guarded: bool,
    after_down: bool,
    asked: int,
    serving: int,
    sized_for: float,
    hit_rate: float,
    now: float,
    policy: ScalingPolicy,
) -> GuardLesson | None:
    """The lesson after this tick. ``lesson``: the fresh one (or None); ``guard``: why the
    guard tripped now ("" if it did not); ``guarded``: it held at the tick before (the
    same episode); ``after_down``: the pool went down within a stable window;
    ``asked``: the ACTIVE replicas the forecast asked for, before the guard;
    ``serving``: those serving; ``sized_for``: the load the forecast sized for."""
    if not guard or guarded or not after_down or policy.guard_lesson_s <= 0:
        return lesson
    if serving < 1 or serving < asked:
        return lesson  # short of the forecast's size: the trip says nothing of the size
    return GuardLesson(at=now, active=serving, load_rps=max(0.0, sized_for), hit_rate=hit_rate)


def floor(lesson: GuardLesson | None, sized_for: float) -> int:
    """The fewest ACTIVE replicas a scale-down may leave under ``lesson`` for the load
    sized for now (0: no floor)."""
    if lesson is None or sized_for < lesson.load_rps * (1 - TOLERANCE):
        return 0
    return lesson.active + 1


def reason(lesson: GuardLesson, policy: ScalingPolicy, *, wanted: int, held: int) -> str:
    """Why a scale-down to ``wanted`` stopped at ``held``, for the scaler's reasons."""
    return (
        f"guard's lesson: {lesson.active} ACTIVE missed after a scale-down, sized for "
        f"{lesson.load_rps:.3g} rps at hit rate {lesson.hit_rate:.2f}, so {held} ACTIVE, "
        f"not {wanted}, while the load is {lesson.load_rps * (1 - TOLERANCE):.3g} rps or "
        f"more (for {policy.guard_lesson_s:g} s or until the capacity is measured again)"
    )
