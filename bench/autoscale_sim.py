"""The autoscale bench's discrete-event model of a pool of simulator replicas.

Many replicas do not fit on two cores as processes, so a pool runs here as events in
one process, on the simulator's own engine model (:mod:`regions.simulator.service_model`:
prefill of the uncached tokens, decode per token, the hit effect), with its scheduler's
rules (:mod:`regions.simulator.scheduler`): at most ``slots`` requests run on a replica,
the rest wait there in FIFO order. ``bench/autoscale_check.py`` checks this model
against real simulator processes.

- **Arrivals**: Poisson at the scenario's rate, one count per second at the rate of its
  middle, the times uniform within it; each request's prompt length is log-normal
  (``prompt_p50``, ``prompt_p90``), its hit the scenario's hit rate then
  (:func:`service_model.hit_tokens`), its output ``output_tokens``. The same arrivals
  (seeded) serve every policy.
- **Routing**: join the shortest queue (fewest running + waiting) among ACTIVE replicas;
  a request with none waits at the pool until one is.
- **Replicas**: LOADING (a launch: ``launch_min_s``-``launch_max_s``, uniform, seeded,
  the k-th launch of a run as long in every policy's run), then WARM or ACTIVE; WAKING
  (``wake_s``; wakes start at most ``wake_rate`` a second, as they share a host),
  ACTIVE (routed), IDLE (awake, not routed), STOPPING (not routed, finishing its
  queue). A replica leaving routing finishes what it holds.
- **Time**: event-driven, in seconds of the scenario (no compression: a 12-minute
  scenario runs in seconds of CPU).
- **What is measured** (requests arriving in [0, end); before 0 a pre-roll at the
  starting load lets every policy settle): first-token time = queue wait + prefill;
  per second, the load and the replicas in each state; the cost of each state-second.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from regions.simulator import service_model

LOADING, WARM, WAKING, ACTIVE, IDLE, STOPPING, COLD = (
    "LOADING",
    "WARM",
    "WAKING",
    "ACTIVE",
    "IDLE",
    "STOPPING",
    "COLD",
)
STATES = (LOADING, WARM, WAKING, ACTIVE, IDLE, STOPPING)  # every state that is paid for
_Z90 = statistics.NormalDist().inv_cdf(0.9)
_DONE, _LOADED, _WOKEN, _TICK = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """The simulator's configuration (its flags) and the requests' shape."""

    slots: int = 8  # --max-num-seqs
    block_size: int = 16
    prefill_tokens_per_s: float = 800.0
    decode_tokens_per_s: float = 40.0
    prompt_p50: int = 400
    prompt_p90: int = 800
    max_prompt: int = 3_000
    output_tokens: int = 16

    def prompts(self, u: np.ndarray) -> list[int]:
        """Prompt lengths at quantiles ``u`` of the log-normal."""
        sigma = math.log(self.prompt_p90 / self.prompt_p50) / _Z90
        z = np.asarray([statistics.NormalDist().inv_cdf(min(max(x, 1e-9), 1 - 1e-9)) for x in u])
        tokens = np.round(self.prompt_p50 * np.exp(sigma * z)).astype(int)
        return [int(x) for x in np.clip(tokens, 2 * self.block_size, self.max_prompt)]

    def service(self, prompt: int, hit_rate: float) -> service_model.ServiceTime:
        """One request on this engine, its leading ``hit_rate`` share cached."""
        return service_model.service_time(
            prompt,
            service_model.hit_tokens(prompt, hit_rate, self.block_size),
            self.output_tokens,
            prefill_tokens_per_s=self.prefill_tokens_per_s,
            decode_tokens_per_s=self.decode_tokens_per_s,
        )


@dataclass(frozen=True, slots=True)
class Lifecycle:
    launch_min_s: float = 60.0  # COLD -> WARM (weights, KV pool, kernels), per replica
    launch_max_s: float = 180.0
    wake_s: float = 5.0  # WARM -> ACTIVE: ScalingPolicy.activation_s's default
    wake_rate: float = 0.5  # wakes begun per second: ScalingPolicy.activation_rate's


@dataclass(frozen=True, slots=True)
class Scenario:
    """Load and hit rate, piecewise linear between knots (t, requests/s, hit rate),
    flat before the first and after the last; measured over [0, end_s)."""

    name: str
    knots: tuple[tuple[float, float, float], ...]
    end_s: float

    def rate(self, t: float) -> float:
        return float(np.interp(t, [k[0] for k in self.knots], [k[1] for k in self.knots]))

    def hit(self, t: float) -> float:
        return float(np.interp(t, [k[0] for k in self.knots], [k[2] for k in self.knots]))


@dataclass(frozen=True, slots=True)
class Arrivals:
    """Requests in arrival order: time, prefill and decode seconds, the hit rate."""

    at: list[float]
    prefill: list[float]
    decode: list[float]
    hit: list[float]
    prompt: list[int]

    def __len__(self) -> int:
        return len(self.at)


def make_arrivals(scenario: Scenario, engine: EngineSpec, *, start_s: float, seed: int) -> Arrivals:
    """Poisson arrivals of ``scenario`` over [start_s, end_s)."""
    rng = np.random.default_rng(seed)
    at: list[float] = []
    for second in range(math.floor(start_s), math.ceil(scenario.end_s)):
        n = int(rng.poisson(scenario.rate(second + 0.5)))
        at.extend(sorted((second + rng.random(n)).tolist()))
    return requests_at(at, [scenario.hit(t) for t in at], engine, seed=seed)


def requests_at(
    at: Sequence[float], hits: Sequence[float], engine: EngineSpec, *, seed: int
) -> Arrivals:
    """Requests arriving at ``at`` with hit rates ``hits``, prompts drawn (seeded)."""
    prompts = engine.prompts(np.random.default_rng(seed + 7).random(len(at)))
    served = [engine.service(p, h) for p, h in zip(prompts, hits, strict=True)]
    return Arrivals(
        at=list(at),
        prefill=[s.prefill_s for s in served],
        decode=[s.decode_s for s in served],
        hit=list(hits),
        prompt=prompts,
    )


def launch_times(life: Lifecycle, count: int, seed: int) -> list[float]:
    """The k-th launch's duration, the same in every policy's run."""
    rng = np.random.default_rng(seed + 11)
    return [float(x) for x in rng.uniform(life.launch_min_s, life.launch_max_s, count)]


@dataclass(eq=False, slots=True)
class Replica:
    rid: int
    state: str
    since: float
    then: str = WARM  # what a launch ends in
    running: int = 0
    queue: deque[int] = field(default_factory=deque)
    busy_s: float = 0.0  # running-request seconds so far (utilization)
    mark: float = 0.0
    gen: int = 0  # bumps when a launch or a wake is cancelled

    @property
    def outstanding(self) -> int:
        return self.running + len(self.queue)

    def integrate(self, now: float) -> None:
        self.busy_s += self.running * (now - self.mark)
        self.mark = now


class Controller:
    """A policy: ``tick`` every ``interval_s`` seconds of the run (from its start)."""

    interval_s: float = 1.0

    def tick(self, now: float, sim: Sim) -> None:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Prices:
    """Cost of one replica-second per state, as a share of an ACTIVE one."""

    warm: float = 0.6  # weights off the GPU in sleep mode: the published figure
    loading: float = 1.0  # a launch holds its GPU while weights load

    def of(self, state: str) -> float:
        return {WARM: self.warm, LOADING: self.loading}.get(state, 1.0)


class Sim:
    """One run of one policy on one scenario's arrivals."""

    def __init__(
        self,
        engine: EngineSpec,
        life: Lifecycle,
        arrivals: Arrivals,
        *,
        start_s: float,
        end_s: float,
        launches: Sequence[float],
        hit_rate: Callable[[float], float],
    ) -> None:
        self.engine, self.life, self.arr = engine, life, arrivals
        self.start_s, self.end_s, self.hit_rate = start_s, end_s, hit_rate
        self._launches = list(launches)
        self._launched = 0
        self.replicas: list[Replica] = []
        self.routable: list[Replica] = []
        self.unrouted: deque[int] = deque()
        self.ttft = np.full(len(arrivals), np.inf)
        self.done = np.full(len(arrivals), np.inf)
        self.routed = np.full(len(arrivals), -1, dtype=np.int64)
        self._firsts: dict[int, list[float]] = {}  # first-token second -> ttfts
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._next_wake = -math.inf
        self.now = start_s
        self.timeline: dict[str, list[float]] = {k: [] for k in ("t", "load", *STATES)}
        self.timeline["waiting"] = []
        counts, _ = np.histogram(arrivals.at, bins=np.arange(start_s, end_s + 1.0))
        self._per_second: list[int] = [int(c) for c in counts]

    # ---- the pool, as policies drive it ---------------------------------------------

    def count(self, *states: str) -> int:
        return sum(r.state in states for r in self.replicas)

    def launch(self, *, then: str = WARM, duration: float | None = None) -> Replica:
        """COLD -> LOADING; WARM (or ACTIVE, for a pod routed once ready) when done."""
        if duration is None:
            duration = self._launches[self._launched % len(self._launches)]
        self._launched += 1
        r = Replica(rid=len(self.replicas), state=LOADING, since=self.now, then=then)
        r.mark = self.now
        self.replicas.append(r)
        self._push(self.now + duration, _LOADED, r.rid, r.gen)
        return r

    def place(self, state: str) -> Replica:
        """A replica already in ``state`` when the run starts."""
        r = Replica(rid=len(self.replicas), state=COLD, since=self.now, mark=self.now)
        self.replicas.append(r)
        self._set(r, state)
        return r

    def wake(self, r: Replica) -> None:
        """WARM -> WAKING -> ACTIVE; wakes begin at most ``wake_rate`` a second."""
        begin = max(self.now, self._next_wake)
        self._next_wake = begin + 1.0 / self.life.wake_rate
        self._set(r, WAKING)
        self._push(begin + self.life.wake_s, _WOKEN, r.rid, r.gen)

    def drain(self, r: Replica) -> None:
        self._set(r, IDLE)

    def resume(self, r: Replica) -> None:
        self._set(r, ACTIVE)

    def sleep(self, r: Replica) -> None:
        self._set(r, WARM)

    def stop(self, r: Replica) -> None:
        """Out of the pool: at once when it holds nothing (a launch is cancelled),
        else once it has finished what it holds."""
        r.gen += 1
        self._set(r, STOPPING if r.outstanding else COLD)

    # ---- signals --------------------------------------------------------------------

    def load_rps(self, now: float, window_s: float = 1.0) -> float:
        """Arrivals per second over the last ``window_s`` seconds before ``now``."""
        lo = max(0, int(now - window_s - self.start_s))
        hi = max(0, int(now - self.start_s))
        return sum(self._per_second[lo:hi]) / window_s

    def waiting(self) -> int:
        """Requests waiting for a slot (vLLM's num_requests_waiting, summed)."""
        held = sum(len(r.queue) for r in self.replicas if r.queue)
        return held + len(self.unrouted)

    def ttft_p99(self, now: float, window_s: float = 5.0) -> float | None:
        seen = [x for s in range(int(now - window_s), int(now)) for x in self._firsts.get(s, ())]
        return float(np.percentile(seen, 99)) if seen else None

    # ---- the run --------------------------------------------------------------------

    def run(self, controllers: Sequence[Controller]) -> None:
        for second in range(math.ceil(self.start_s), math.ceil(self.end_s) + 1):
            self._push(float(second), _TICK, 0, 0)
        at, n, i = self.arr.at, len(self.arr), 0
        while True:
            nxt = at[i] if i < n else math.inf
            if self._heap and self._heap[0][0] <= nxt:
                t, _, kind, rid, gen = heapq.heappop(self._heap)
                self.now = t
                if kind == _DONE:
                    self._finish(self.replicas[rid])
                elif kind == _TICK:
                    self._tick(controllers)
                elif gen == self.replicas[rid].gen:
                    self._ready(self.replicas[rid], kind)
            elif i < n:
                self.now = nxt
                self._arrive(i)
                i += 1
            else:
                break

    def _tick(self, controllers: Sequence[Controller]) -> None:
        now = self.now
        tl = self.timeline
        tl["t"].append(now)
        tl["load"].append(self.load_rps(now))
        for s in STATES:
            tl[s].append(self.count(s))
        tl["waiting"].append(self.waiting())
        if now >= self.end_s or now <= self.start_s:  # before the first second: no signal
            return
        for c in controllers:
            if now % c.interval_s < 1e-9:  # on the scenario's clock: t = 0 is a tick
                c.tick(now, self)

    def _arrive(self, i: int) -> None:
        best: Replica | None = None
        for r in self.routable:
            if best is None or r.outstanding < best.outstanding:
                best = r
        if best is None:
            self.unrouted.append(i)
            return
        self._assign(best, i)

    def _assign(self, r: Replica, i: int) -> None:
        self.routed[i] = r.rid
        if r.running < self.engine.slots:
            self._start(r, i)
        else:
            r.queue.append(i)

    def _start(self, r: Replica, i: int) -> None:
        r.integrate(self.now)
        r.running += 1
        first = self.now + self.arr.prefill[i]
        self.ttft[i] = first - self.arr.at[i]
        self._firsts.setdefault(int(first), []).append(self.ttft[i])
        done = first + self.arr.decode[i]
        self.done[i] = done
        self._push(done, _DONE, r.rid, 0)

    def _finish(self, r: Replica) -> None:
        r.integrate(self.now)
        r.running -= 1
        if r.queue:
            self._start(r, r.queue.popleft())
        elif r.state == STOPPING and not r.running:
            self._set(r, COLD)

    def _ready(self, r: Replica, kind: int) -> None:
        if kind == _LOADED and r.state == LOADING:
            self._set(r, r.then)
        elif kind == _WOKEN and r.state == WAKING:
            self._set(r, ACTIVE)

    def _set(self, r: Replica, state: str) -> None:
        if r.state == ACTIVE and state != ACTIVE:
            self.routable.remove(r)
        r.state, r.since = state, self.now
        if state == ACTIVE:
            self.routable.append(r)
            while self.unrouted:
                self._assign(
                    min(self.routable, key=lambda x: x.outstanding), self.unrouted.popleft()
                )

    def _push(self, t: float, kind: int, rid: int, gen: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, rid, gen))

    # ---- figures ----------------------------------------------------------------------

    def measured(self) -> np.ndarray:
        """The indices of the requests that arrived in [0, end)."""
        at = np.asarray(self.arr.at)
        return np.nonzero((at >= 0.0) & (at < self.end_s))[0]

    def replica_seconds(self, prices: Prices) -> tuple[float, float, dict[str, float]]:
        """Over [0, end): replica-seconds held (any state but COLD), their cost in
        ACTIVE-seconds at ``prices``, and the seconds in each state."""
        t = np.asarray(self.timeline["t"])
        keep = (t > 0.0) & (t <= self.end_s)  # the state during each second, at its end
        per = {s: float(np.asarray(self.timeline[s])[keep].sum()) for s in STATES}
        return sum(per.values()), sum(prices.of(s) * v for s, v in per.items()), per
