"""The autoscale bench's policies, each its real decision code driving the model's pool
(``bench/autoscale_sim.py``).

- ``tectonic`` / ``tectonic_reactive``: :func:`controlplane.core.scaler.size_pool` every
  second (the leader's tick) with the pool's signals, the record kept as the leader
  keeps it (in memory, written when due); the warm pool follows the record through
  :func:`regions.pool.planner.plan` (the agent's planner, its dwell times): wake WARM,
  resume IDLE, launch COLD slots to WARM, drain, sleep, stop.
- ``hpa_cpu`` and ``keda_queue``: the Kubernetes HPA's algorithm (autoscaling/v2, as its
  documentation states it) over a Deployment whose new pods load from COLD and are
  routed once ready; ``hpa_cpu`` on the pods' utilisation (running / max_num_seqs,
  averaged over the sync period), ``keda_queue`` on ``vllm:num_requests_waiting``
  summed (the External metric KEDA serves, AverageValue 5).
- ``dynamo``: NVIDIA Dynamo's planner's throughput scaling at its defaults, on load
  predictions made by its own predictors out of process (``bench/autoscale_dynamo.py``).
- ``oracle``: knows the future; every replica is launched and woken just in time for
  the size the capacity at the SLO asks for each second, and leaves when not needed.

The capacity at the SLO (:func:`capacity_curve`): the rate at which one replica's
steady-state first-token p99 is the SLO, from ``bench/capacity_truth.py``'s steady-state
model of the engine (its request mix at each hit rate of a grid; linear between them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bench.autoscale_sim import (
    ACTIVE,
    COLD,
    IDLE,
    LOADING,
    STOPPING,
    WAKING,
    WARM,
    Controller,
    EngineSpec,
    Replica,
    Scenario,
    Sim,
)
from bench.capacity_truth import SteadyState
from controlplane.core.scaler import Capacity, Moving, PoolSignals, size_pool
from controlplane.core.spend import Budget
from controlplane.kernel.pool.scale import ScaleRecord, ScalingPolicy
from regions.pool.planner import plan
from regions.pool.states import Action, DwellPolicy, PoolTarget, ReplicaState
from regions.pool.states import Replica as Slot

HIT_GRID = (0.0, 0.2, 0.4, 0.6, 0.7, 0.8, 0.9)
_EPS = 1e-9


def target_of(record: ScaleRecord) -> PoolTarget:
    """What the agent's scale follower hands its pool from ``scale/<unit>``
    (``regions/agent/scale_follower.py``): the sizes, scaled, and over its budget when
    the record's budget note says so."""
    over = record.budget is not None and record.budget.over
    return PoolTarget(active=record.active, warm=record.warm, scaled=True, over_budget=over)


def capacity_curve(
    engine: EngineSpec, slo_s: float, *, requests: int, seed: int, grid: Sequence[float] = HIT_GRID
) -> tuple[Callable[[float], float], dict[float, float]]:
    """Requests/s one replica bears with its first-token p99 at the SLO, by hit rate."""
    prompts = engine.prompts((np.arange(2048) + 0.5) / 2048)
    points: dict[float, float] = {}
    for h in grid:
        served = [engine.service(p, h) for p in prompts]
        model = SteadyState(
            [s.prefill_s for s in served],
            [s.total_s for s in served],
            engine.slots,
            requests=requests,
            seed=seed,
        )
        points[h] = model.rate_where(slo_s) or model.saturation_rps
    xs = list(points)
    inverse = [1.0 / points[h] for h in xs]  # seconds per request: near linear in h

    def per_replica(h: float) -> float:
        return 1.0 / float(np.interp(h, xs, inverse))

    return per_replica, points


# ---- Tectonic ---------------------------------------------------------------------------


class Tectonic(Controller):
    """The leader's scaler and the agent's warm-pool planner, once a second."""

    interval_s = 1.0

    def __init__(
        self,
        policy: ScalingPolicy,
        capacity: Capacity,
        *,
        slo_s: float,
        dwell: DwellPolicy,
        slots: int,
        budget: Budget | None = None,
    ) -> None:
        self.policy, self.capacity, self.slo_s, self.dwell = policy, capacity, slo_s, dwell
        self.budget = budget  # the pool's budget (core/spend.py), None: no ``cost:``
        self.stored: ScaleRecord | None = None
        self.memory: ScaleRecord | None = None
        self.slots: dict[str, Replica | None] = {f"r{i:03d}": None for i in range(slots)}
        self.targets: list[tuple[float, int, int]] = []  # (t, active, warm) when changed
        self.guarded = 0  # ticks where the guard added a replica
        # a failover moving load onto the pool, as the leader's scale_moves passes it
        # (bench/cost_failover.py sets it each second); None: none
        self.moving: Moving | None = None

    def seed(self, sim: Sim, active: int, warm: int) -> None:
        names = iter(self.slots)
        for state, n in ((ACTIVE, active), (WARM, warm)):
            for _ in range(n):
                self.slots[next(names)] = sim.place(state)

    def tick(self, now: float, sim: Sim) -> None:
        signals = PoolSignals(
            observed_at=now,
            load_rps=sim.load_rps(now),
            hit_rate=sim.hit_rate(now),
            queue_depth=float(sim.waiting()),
            ttft_p99_s=sim.ttft_p99(now),
            active_now=sim.count(ACTIVE),
        )
        sized = size_pool(
            "bench",
            self.stored,
            signals,
            self.capacity,
            self.policy,
            now=now,
            ttft_slo_s=self.slo_s,
            moving=self.moving,
            memory=self.memory,
            budget=self.budget,
        )
        record = self.memory = sized.record
        if sized.due:
            self.stored = record
        if any(r.startswith("guard:") for r in record.reasons):
            self.guarded += 1
        if not self.targets or self.targets[-1][1:] != (record.active, record.warm):
            self.targets.append((now, record.active, record.warm))
        for action in plan(self._view(now), target_of(record), now, self.dwell).actions:
            self._carry_out(action, sim)

    def _view(self, now: float) -> list[Slot]:
        out = []
        for name, r in self.slots.items():
            if r is None or r.state not in (LOADING, WARM, WAKING, ACTIVE, IDLE):
                out.append(Slot(name=name, state=ReplicaState.COLD, since=0.0))
                continue
            state, busy = {
                LOADING: (ReplicaState.COLD, True),
                WARM: (ReplicaState.WARM, False),
                WAKING: (ReplicaState.ACTIVE, True),  # being made ACTIVE, as the agent does
                ACTIVE: (ReplicaState.ACTIVE, False),
                IDLE: (ReplicaState.IDLE, False),
            }[r.state]
            out.append(Slot(name=name, url=f"sim://{name}", state=state, since=r.since, busy=busy))
        return out

    def _carry_out(self, a: Action, sim: Sim) -> None:
        r = self.slots[a.replica]
        if a.kind == "launch":
            self.slots[a.replica] = sim.launch(then=WARM)
            return
        if r is None:
            return
        if a.kind == "cancel":  # a launch no longer wanted: paid only until now
            sim.stop(r)
            self.slots[a.replica] = None
        elif a.kind == "wake":
            sim.wake(r)
        elif a.kind == "drain":
            sim.drain(r)
        elif a.kind == "resume":
            sim.resume(r)
        elif a.kind == "sleep":
            sim.sleep(r)
        elif a.kind == "stop":
            sim.stop(r)
            self.slots[a.replica] = None


# ---- Kubernetes: a Deployment and the HPA -----------------------------------------------


def deployment(sim: Sim) -> list[Replica]:
    """The Deployment's pods: loading or ready (not those being terminated)."""
    return [r for r in sim.replicas if r.state in (LOADING, ACTIVE)]


def scale_deployment(sim: Sim, n: int) -> None:
    """Set the Deployment's replicas: new pods load from COLD and are routed once ready;
    a scale-down removes loading pods first, then the most recently ready (the
    ReplicaSet's order), each finishing what it holds."""
    pods = deployment(sim)
    for _ in range(n - len(pods)):
        sim.launch(then=ACTIVE)
    if n < len(pods):
        order = sorted(pods, key=lambda r: (r.state != LOADING, -r.since))
        for r in order[: len(pods) - n]:
            sim.stop(r)


@dataclass(frozen=True, slots=True)
class HpaBehavior:
    """autoscaling/v2 defaults: scale-up without stabilisation, at most the larger of
    +4 pods and +100 % per 60 s; scale-down to the highest recommendation of the last
    300 s; a 10 % tolerance; the controller syncs every 15 s."""

    sync_s: float = 15.0
    tolerance: float = 0.1
    up_pods: int = 4
    up_percent: float = 100.0
    up_period_s: float = 60.0
    down_window_s: float = 300.0
    min_replicas: int = 1
    max_replicas: int = 64


class Hpa(Controller):
    """The HPA's replica calculation and behaviour over a metric (``hpa_cpu``'s and
    ``keda_queue``'s differ only in the metric)."""

    def __init__(self, behavior: HpaBehavior, metric: str, target: float) -> None:
        self.b, self.metric, self.target = behavior, metric, target
        self.interval_s = behavior.sync_s
        self.recommendations: list[tuple[float, int]] = []
        self.changes: list[tuple[float, int]] = []  # (t, pods added) for the rate limit
        self._busy: dict[int, float] = {}
        self._last = -math.inf

    def tick(self, now: float, sim: Sim) -> None:
        current = len(deployment(sim))
        proposal = self._proposal(now, sim, current)
        self.recommendations = [
            (t, n) for t, n in self.recommendations if t > now - self.b.down_window_s
        ]
        self.recommendations.append((now, proposal))
        down = max(n for _, n in self.recommendations)
        wanted = proposal if proposal > current else min(current, down)
        wanted = min(wanted, self._up_limit(now, current))
        wanted = max(self.b.min_replicas, min(self.b.max_replicas, wanted))
        if wanted != current:
            scale_deployment(sim, wanted)
            self.changes.append((now, wanted - current))

    def _up_limit(self, now: float, current: int) -> int:
        added = sum(d for t, d in self.changes if t > now - self.b.up_period_s and d > 0)
        start = current - added
        by_percent = math.ceil(start * (1 + self.b.up_percent / 100))
        return max(by_percent, start + self.b.up_pods)

    def _proposal(self, now: float, sim: Sim, current: int) -> int:
        ready = [r for r in sim.replicas if r.state == ACTIVE]
        unready = sum(r.state == LOADING for r in sim.replicas)
        if self.metric == "queue":  # External, AverageValue: the sum over the target
            total = float(sum(len(r.queue) for r in ready))
            ratio = total / (self.target * max(current, 1))
            if abs(ratio - 1) <= self.b.tolerance:
                return current
            return math.ceil(total / self.target - _EPS)
        usage = self._utilisation(now, ready, sim.engine.slots)
        self._last = now
        if not usage:  # no pod ready for a whole instant yet: no metric, no change
            return current
        ratio = sum(usage) / len(usage) / self.target
        if abs(ratio - 1) <= self.b.tolerance:
            return current
        if ratio > 1 and unready:  # unready pods count as 0 % on a scale-up
            ratio = sum(usage) / (len(usage) + unready) / self.target
            if ratio <= 1 + self.b.tolerance:
                return current
            return math.ceil(ratio * (len(usage) + unready) - _EPS)
        return math.ceil(ratio * len(usage) - _EPS)

    def _utilisation(self, now: float, ready: list[Replica], slots: int) -> list[float]:
        """Each ready pod's running / max_num_seqs over the sync period (since it was
        ready, when later: a pod runs nothing before)."""
        out = []
        for r in ready:
            r.integrate(now)
            span = now - max(self._last, r.since)
            if span > 0:
                out.append((r.busy_s - self._busy.get(r.rid, 0.0)) / (span * slots))
            self._busy[r.rid] = r.busy_s
        return out


# ---- NVIDIA Dynamo's planner --------------------------------------------------------------


class Dynamo(Controller):
    """Throughput scaling at the planner's defaults: every 180 s, replicas = ceil(predicted
    requests/s / what one engine bears at the SLO with the last interval's KV hit rate),
    at least ``min_endpoint``, at most ``max_delta`` from the ready count; no scale-up
    while launched replicas are still pending."""

    def __init__(
        self,
        predicted: Mapping[float, float],
        per_replica: Callable[[float], float],
        *,
        interval_s: float = 180.0,
        max_delta: int = 8,
        min_endpoint: int = 1,
        max_replicas: int = 64,
    ) -> None:
        self.predicted, self.per_replica = predicted, per_replica
        self.interval_s, self.max_delta = interval_s, max_delta
        self.min_endpoint, self.max_replicas = min_endpoint, max_replicas
        self.decisions: list[tuple[float, float, int]] = []

    def tick(self, now: float, sim: Sim) -> None:
        num_req = self.predicted.get(now)
        if num_req is None:
            return
        hits = [h for t, h in zip(sim.arr.at, sim.arr.hit, strict=True) if now - 180 <= t < now]
        hit = sum(hits) / len(hits) if hits else sim.hit_rate(now)
        demand = num_req / self.interval_s
        desired = max(math.ceil(demand / self.per_replica(hit) - _EPS), self.min_endpoint)
        ready = sim.count(ACTIVE)
        pending = sim.count(LOADING) > 0
        desired = min(max(desired, ready - self.max_delta), ready + self.max_delta)
        desired = min(max(desired, self.min_endpoint), self.max_replicas)
        self.decisions.append((now, demand, desired))
        if pending and desired > ready:
            return
        if desired == ready and not pending:
            return
        scale_deployment(sim, desired)


# ---- the oracle ------------------------------------------------------------------------------


def needed(scenario: Scenario, per_replica: Callable[[float], float], t: int) -> int:
    """ACTIVE replicas the second [t, t+1) needs at the capacity at the SLO."""
    worst = max(scenario.rate(x) / per_replica(scenario.hit(x)) for x in (t, t + 0.5, t + 1))
    return max(1, math.ceil(worst - _EPS))


@dataclass(slots=True)
class _Planned:
    launch_at: float
    wake_at: float
    leave_at: float
    duration: float
    replica: Replica | None = None


class Oracle(Controller):
    """The k-th replica is ACTIVE exactly while the capacity at the SLO needs k: launched
    its own (known) launch time before its wake, woken ``wake_s`` before it is needed
    (wakes spaced by the pool's wake rate), gone once no longer needed."""

    interval_s = 1.0

    def __init__(
        self, need: Sequence[int], start_s: int, launches: Sequence[float], wake_s: float,
        wake_rate: float,
    ) -> None:  # fmt: skip
        self.plan: list[_Planned] = []
        top = max(need)
        ups: list[float] = []
        for k in range(1, top + 1):
            seconds = [start_s + i for i, n in enumerate(need) if n >= k]
            ups.append(seconds[0])
            self.plan.append(_Planned(0.0, 0.0, seconds[-1] + 1.0, 0.0))
        wake_at = math.inf
        for k in range(top - 1, -1, -1):  # backwards: wakes spaced by 1 / wake_rate
            wake_at = min(ups[k] - wake_s, wake_at - 1.0 / wake_rate)
            p = self.plan[k]
            p.wake_at, p.duration = math.floor(wake_at), launches[k % len(launches)]
            p.launch_at = math.floor(p.wake_at - p.duration)
        self.start_s = start_s

    def seed(self, sim: Sim) -> None:
        for p in self.plan:
            if p.wake_at <= self.start_s:
                p.replica = sim.place(ACTIVE)

    def tick(self, now: float, sim: Sim) -> None:
        for p in self.plan:
            r = p.replica
            if r is None and p.launch_at <= now < p.leave_at:
                p.replica = sim.launch(then=WARM, duration=p.duration)
            elif r is not None and r.state == WARM and now >= p.wake_at:
                sim.wake(r)
            if r is not None and now >= p.leave_at and r.state not in (STOPPING, COLD):
                sim.stop(r)
