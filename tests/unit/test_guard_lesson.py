"""The reactive guard's lesson (controlplane/core/guard_lesson.py), on a fake clock: a
capacity record that overstates what a replica bears makes the scaler go down to a size
that misses once a stable window, for ever; the lesson stops the cycle, survives a
leader change, and lets go when its time is over or the capacity is measured again."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from controlplane.core import guard_lesson
from controlplane.core.scaler import Capacity, PoolSignals, size_pool
from controlplane.kernel.pool.scale import Direction, GuardLesson, ScaleRecord, ScalingPolicy
from tests.unit.test_scaler import Pool

RATE = 60.0  # requests/s, flat
TRUE_RPS = 10.0  # what a replica bears: 60 requests/s need 6
RECORD = Capacity(lambda h: 14.3, "measured")  # 43 % over: the forecast asks for 5
POLICY = ScalingPolicy(horizon_s=30, stable_window_s=120, burst_warm=0, max_active=16)


@dataclass
class Plant:
    """test_scaler's ``Pool`` (ticked once a second as the leader does) over replicas that
    bear ``TRUE_RPS`` each: what they cannot serve queues, and the queue drains at what
    they bear beyond the load."""

    pool: Pool = field(default_factory=lambda: Pool(policy=POLICY, capacity=RECORD, active_now=5))
    backlog: float = 0.0
    sizes: list[tuple[float, int]] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    @property
    def serving(self) -> int:
        return self.pool.active_now

    def tick(self, now: float) -> None:
        load = max(0.0, self.rng.gauss(RATE, RATE**0.5))
        self.backlog = max(0.0, self.backlog + load - TRUE_RPS * self.serving)
        before = self.serving
        record = self.pool.tick(now, load, queue=self.backlog)
        if record.active != before:
            self.sizes.append((now, record.active))

    def run(self, start: float, end: float) -> None:
        for t in range(int(start), int(end)):
            self.tick(float(t))


def downs(plant: Plant, since: float = 0.0) -> int:
    before = [5] + [n for _, n in plant.sizes]
    return sum(
        1 for (t, n), last in zip(plant.sizes, before, strict=False) if t >= since and n < last
    )


def test_an_overstated_record_cycles_for_ever_without_the_lesson() -> None:
    off = POLICY.model_copy(update={"guard_lesson_s": 0.0})
    plant = Plant(pool=Pool(policy=off, capacity=RECORD, active_now=5))
    plant.run(0, 3600)
    assert downs(plant, since=1800) >= 5  # one scale-down a window, and the guard again
    assert plant.pool.memory is not None and plant.pool.memory.lesson is None


def test_the_guard_s_lesson_stops_the_cycle_and_a_new_leader_keeps_it() -> None:
    plant = Plant()
    plant.run(0, 1800)
    rec = plant.pool.memory
    assert rec is not None and rec.lesson is not None
    assert rec.lesson.active >= 5 and rec.lesson.load_rps > RATE * 0.9
    settled = plant.serving
    # one over the size that missed, 6: what 60 requests/s of 10 a replica need; not 8, as
    # when a trip after the guard had raised the pool again counted as one after a down
    assert settled == 7, plant.sizes
    early = downs(plant)
    assert early <= 3, plant.sizes  # one down per size that missed, then none
    # a new leader: only what etcd holds, nothing of the old leader's memory
    plant.pool.memory = None
    plant.run(1800, 3600)
    assert downs(plant, since=1800) == 0, plant.sizes
    assert plant.serving == settled  # never back down to a size that missed
    assert plant.pool.memory is not None
    said = [r for r in plant.pool.memory.reasons if r.startswith("guard's lesson")]
    assert said and f"so {settled} ACTIVE, not 5" in said[0], plant.pool.memory.reasons


LESSON = GuardLesson(at=100.0, active=5, load_rps=63.0, hit_rate=0.0)


def test_a_lesson_holds_for_its_time_and_until_the_capacity_is_measured_again() -> None:
    assert guard_lesson.fresh(LESSON, 100.0 + POLICY.guard_lesson_s, POLICY, None) == LESSON
    assert guard_lesson.fresh(LESSON, 101.0 + POLICY.guard_lesson_s, POLICY, None) is None
    assert guard_lesson.fresh(LESSON, 200.0, POLICY, measured_at=50.0) == LESSON
    assert guard_lesson.fresh(LESSON, 200.0, POLICY, measured_at=150.0) is None  # re-probed
    off = POLICY.model_copy(update={"guard_lesson_s": 0.0})
    assert guard_lesson.fresh(LESSON, 101.0, off, None) is None


def test_a_lesson_floors_a_scale_down_only_at_a_load_as_high() -> None:
    assert guard_lesson.floor(LESSON, 63.0) == 6
    assert guard_lesson.floor(LESSON, 63.0 * (1 - guard_lesson.TOLERANCE)) == 6
    assert guard_lesson.floor(LESSON, 63.0 * (1 - guard_lesson.TOLERANCE) - 0.01) == 0
    assert guard_lesson.floor(None, 1000.0) == 0


def _learn(last: GuardLesson | None = None, **kw: object) -> GuardLesson | None:
    args: dict[str, object] = {
        "guard": "5 waiting per replica > 4",
        "guarded": False,
        "after_down": True,
        "asked": 5,
        "serving": 5,
        "sized_for": 63.0,
        "hit_rate": 0.0,
        "now": 100.0,
        "policy": POLICY,
    }
    args.update(kw)
    return guard_lesson.learn(last, **args)  # type: ignore[arg-type]


def test_only_a_trip_that_starts_an_episode_soon_after_a_scale_down_teaches() -> None:
    assert _learn() == LESSON
    assert _learn(guard="") is None  # no trip
    assert _learn(guarded=True) is None  # the same episode: its queue draining
    assert _learn(after_down=False) is None  # a pool near its rate, not a size that missed
    assert _learn(serving=4) is None  # short of what the forecast asked: replicas waking
    newer = _learn(LESSON, asked=6, serving=6, sized_for=64.0, hit_rate=0.1, now=500.0)
    assert newer == GuardLesson(at=500.0, active=6, load_rps=64.0, hit_rate=0.1)  # replaces


def _tripped(down_at: float) -> ScaleRecord:
    """One tick whose guard trips (20 waiting per replica) on a pool at the 5 replicas
    the forecast asks for, 5 s after a WARM change; ACTIVE last went down at
    ``down_at``."""
    stored = ScaleRecord(
        unit="east",
        active=5,
        warm=2,
        decided_at=999.0,
        changed_at=995.0,
        direction=Direction.DOWN,
        down_at=down_at,
    )
    signals = PoolSignals(
        observed_at=1000.0,
        load_rps=RATE,
        hit_rate=0.0,
        queue_depth=100.0,
        ttft_p99_s=None,
        active_now=5,
    )
    return size_pool("east", stored, signals, RECORD, POLICY, now=1000.0, ttft_slo_s=2.0).record


def test_a_trip_long_after_the_last_scale_down_teaches_nothing_whatever_warm_did() -> None:
    assert _tripped(down_at=990.0).lesson is not None  # 10 s after going down to 5
    # down 500 s ago: the WARM change 5 s ago is no scale-down
    assert _tripped(down_at=500.0).lesson is None
