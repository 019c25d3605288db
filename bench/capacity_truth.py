"""The capacity bench's truth: what a simulator replica SUSTAINS (pure; numpy).

The simulator's engine (``regions/simulator/engine.py``) is c slots and a FIFO
waiting queue; a request's prefill takes its uncached prompt tokens / the prefill
rate, then each further output token 1 / the decode rate. :func:`simulate` is that
engine as a discrete-event model (the head of the queue takes the first slot that
frees), and :class:`SteadyState` evaluates it in **steady state**: one long run of
Poisson arrivals at a rate, requests drawn from the workload's request mix, its first
part discarded, read as the long-run first-token p99.

How long, and why that is steady state: ``REQUESTS`` (500,000) requests, the first
``WARMUP_SHARE`` (10 %, 50,000) discarded. At the true ultimate of the bench's presets
the load is 0.87-0.90 of saturation; a queue there forgets its start within its
relaxation time, of order E[S] / (c (1 - sqrt(rho))^2) (the heavy-traffic time scale),
about 30 s of simulated time, and a run is some 15 hours of it: the warm-up alone
spans 150 relaxation times and the measured part thousands. A steady-state p99 that
high is made by rare long excursions of the queue, so it is the noisy figure (the
two halves of the measured part, ``p99_halves_s``, differ by up to 10-15 %), but the
rate where it crosses a limit is not: near saturation the p99 climbs steeply, and
over seeds the ultimate repeats within +-0.5 % (the knee within +-1 %) at 200,000
requests already. ``tests/test_bench_capacity.py`` checks the model against queueing
theory where it is exact (M/M/1 and M/M/c waiting-time percentiles, M/D/1's mean).

Every rate uses the same random streams (unit exponential gaps scaled by 1 / rate, the
same request at each position): a FIFO queue's waits only grow as the arrivals are
compressed, so the p99 is monotone in the rate and a bisection finds where it crosses
a limit. The truth of one configuration and one hit rate:

- **saturation**: slots / the mix's mean service time (what the engine serves at most);
- **ultimate**: the rate where the steady-state first-token p99 equals the SLO;
- **knee**: where it passes ``knee_factor`` x its value at the probe's lowest rate;
- **allowed**: the ultimate / the factor of safety.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from chaos.capacity.workload import Workload, prefix_words, requests
from regions.simulator.tokenizer import Tokenizer, render_chat

REQUESTS = 500_000  # per steady-state run
WARMUP_SHARE = 0.1  # of them discarded: the queue's start from empty
POOL = 4_096  # distinct requests of the workload the mix is drawn from
PRECISION = 1e-3  # the bisections', relative

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class EngineModel:
    """What of the simulator's configuration the latency model needs."""

    slots: int
    prefill_rate: float  # prompt tokens/s, per request
    decode_rate: float  # output tokens/s, per request
    block_size: int


@dataclass(frozen=True, slots=True)
class Service:
    """One request as the simulator serves it."""

    prompt_tokens: int
    hit_tokens: int  # prefix-cache hit (the shared prefix warm)
    prefill_s: float
    decode_s: float  # after the first token


def services(
    engine: EngineModel, workload: Workload, count: int, *, warm: bool, seed: int, tag: str
) -> list[Service]:
    """The workload's first ``count`` requests (as the probe sends them) as the
    simulator sees them: its tokenizer and chat template, hits in full blocks of the
    shared prefix (never the last token, as vLLM), the output as long as asked (the
    bench's simulators take any prompt the workload makes)."""
    tok = Tokenizer()
    bs = engine.block_size
    prefix_ids: dict[int, list[int]] = {}
    out = []
    for r in requests(workload, count, warm=warm, seed=seed, tag=tag):
        ids = tok.encode(render_chat([("user", r.content)]))
        hit = 0
        if r.prefix is not None:
            if r.prefix not in prefix_ids:
                text = " ".join(prefix_words(r.prefix, seed, workload.prefix_tokens))
                prefix_ids[r.prefix] = tok.encode(f"<|user|>\n{text}")
            shared = prefix_ids[r.prefix]
            common = next(
                (i for i, (a, b) in enumerate(zip(ids, shared, strict=False)) if a != b),
                min(len(ids), len(shared)),
            )
            hit = min(common // bs, (len(ids) - 1) // bs) * bs
        out.append(
            Service(
                prompt_tokens=len(ids),
                hit_tokens=hit,
                prefill_s=(len(ids) - hit) / engine.prefill_rate,
                decode_s=(r.max_tokens - 1) / engine.decode_rate,
            )
        )
    return out


def simulate(
    at: Sequence[float], served: Sequence[Service], slots: int
) -> list[tuple[float, float]]:
    """(first token, done) of each request arriving at ``at`` (ascending): ``slots``
    run at once, the rest wait in FIFO order; the head of the queue takes the first
    slot that frees."""
    if len(served) < len(at):
        raise ValueError(f"the model has {len(served)} requests for {len(at)} arrivals")
    free = [0.0] * slots
    out = []
    for t, s in zip(at, served[: len(at)], strict=True):
        start = max(t, heapq.heappop(free))
        first = start + s.prefill_s
        done = first + s.decode_s
        heapq.heappush(free, done)
        out.append((first, done))
    return out


def true_beta(served: Sequence[Service]) -> float:
    """The share of a cold request's service time that a full hit saves (its prefill),
    over the workload: sum of prefill times over sum of service times."""
    prefill = sum(s.prefill_s for s in served)
    return prefill / (prefill + sum(s.decode_s for s in served))


def hit_share(served: Sequence[Service]) -> float:
    """Hit tokens over prompt tokens: the token hit rate the replica's counters read."""
    return sum(s.hit_tokens for s in served) / sum(s.prompt_tokens for s in served)


class SteadyState:
    """The engine under Poisson arrivals of a request mix, in steady state.

    ``prefill_s`` and ``service_s`` (prefill + decode) describe the mix, one entry per
    request of it; each of the run's ``requests`` requests is one of them drawn at
    random (seeded), the same at every rate, as are the unit gaps between arrivals."""

    def __init__(
        self,
        prefill_s: Sequence[float] | Floats,
        service_s: Sequence[float] | Floats,
        slots: int,
        *,
        requests: int = REQUESTS,
        warmup_share: float = WARMUP_SHARE,
        seed: int = 0,
    ) -> None:
        pre = np.asarray(prefill_s, dtype=np.float64)
        svc = np.asarray(service_s, dtype=np.float64)
        if pre.shape != svc.shape or pre.size == 0 or slots < 1 or requests < 100:
            raise ValueError(
                "a non-empty mix (prefill and service alike), slots >= 1 and "
                "100 requests at least are required"
            )
        if np.any(pre < 0) or np.any(svc < pre) or float(svc.mean()) <= 0:
            raise ValueError("service times must be positive and cover their prefill")
        rng = np.random.default_rng(seed)
        self.slots = slots
        self.requests = requests
        self.warmup = int(warmup_share * requests)
        self.mean_service_s = float(svc.mean())
        self.saturation_rps = slots / self.mean_service_s
        self._unit: Floats = np.cumsum(rng.exponential(size=requests))
        pick = rng.integers(pre.size, size=requests)
        self._prefill: list[float] = pre[pick].tolist()
        self._service: list[float] = svc[pick].tolist()
        self._p99: dict[float, float] = {}

    def arrivals(self, rate_rps: float) -> Floats:
        return self._unit / rate_rps

    def ttft(self, rate_rps: float) -> Floats:
        """First-token times (wait + prefill) of every request at ``rate_rps``, in
        arrival order (the warm-up's included)."""
        at = self.arrivals(rate_rps).tolist()
        free = [0.0] * self.slots
        out = [0.0] * self.requests
        replace = heapq.heapreplace
        for i, (t, pre, svc) in enumerate(zip(at, self._prefill, self._service, strict=True)):
            head = free[0]
            start = t if t > head else head
            replace(free, start + svc)
            out[i] = start - t + pre
        return np.asarray(out)

    def p99(self, rate_rps: float) -> float:
        """The long-run first-token p99 at ``rate_rps`` (the warm-up discarded)."""
        if rate_rps not in self._p99:
            self._p99[rate_rps] = float(np.percentile(self.ttft(rate_rps)[self.warmup :], 99))
        return self._p99[rate_rps]

    def halves_p99(self, rate_rps: float) -> tuple[float, float]:
        """The p99 of each half of the measured part: alike when the run is stationary."""
        measured = self.ttft(rate_rps)[self.warmup :]
        half = measured.size // 2
        return float(np.percentile(measured[:half], 99)), float(np.percentile(measured[half:], 99))

    def window_p99(self, rate_rps: float, window_s: float) -> Floats:
        """The p99 of each stretch of ``window_s`` of arrivals in the measured part:
        how far a run that long reads from the long-run p99."""
        at = self.arrivals(rate_rps)[self.warmup :]
        ttft = self.ttft(rate_rps)[self.warmup :]
        edges = np.arange(at[0], at[-1], window_s)
        bins = np.searchsorted(at, edges)
        return np.asarray(
            [
                np.percentile(ttft[a:b], 99)
                for a, b in itertools.pairwise(bins.tolist())
                if b - a >= 20
            ]
        )

    def rate_where(self, p99_s: float, low_rps: float | None = None) -> float | None:
        """The rate where the steady-state p99 crosses ``p99_s`` (bisection to
        ``PRECISION``, from ``low_rps`` or near zero up to saturation); None when it
        stays under it up to saturation."""
        lo = low_rps if low_rps is not None else 1e-3 * self.saturation_rps
        hi = self.saturation_rps
        if self.p99(lo) > p99_s:
            return lo if low_rps is not None else None
        if self.p99(hi * (1 - PRECISION)) <= p99_s:
            return None
        while (hi - lo) / lo > PRECISION:
            mid = (lo + hi) / 2
            if self.p99(mid) <= p99_s:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2


@dataclass(frozen=True, slots=True)
class Truth:
    """One hit rate's truth (see the module doc)."""

    hit_rate: float
    mean_service_s: float
    saturation_rps: float
    baseline_p99_s: float  # the steady-state p99 at the probe's lowest rate
    knee_rps: float | None
    ultimate_rps: float
    allowed_rps: float
    p99_halves_s: tuple[float, float]  # at the ultimate: stationarity


def truth(
    served: Sequence[Service],
    slots: int,
    *,
    slo_s: float,
    knee_factor: float,
    lowest_rps: float,
    factor_of_safety: float,
    requests: int = REQUESTS,
    seed: int = 0,
) -> tuple[Truth, SteadyState]:
    """The truth of a request mix (``served``: the pool it is drawn from)."""
    model = SteadyState(
        [s.prefill_s for s in served],
        [s.prefill_s + s.decode_s for s in served],
        slots,
        requests=requests,
        seed=seed,
    )
    ultimate = model.rate_where(slo_s)
    if ultimate is None:
        raise ValueError(f"the configuration misses the SLO ({slo_s:g} s) at any rate")
    lowest = min(lowest_rps, ultimate)
    baseline = model.p99(lowest)
    knee = model.rate_where(knee_factor * baseline, lowest)
    return (
        Truth(
            hit_rate=hit_share(served),
            mean_service_s=model.mean_service_s,
            saturation_rps=model.saturation_rps,
            baseline_p99_s=baseline,
            knee_rps=knee,
            ultimate_rps=ultimate,
            allowed_rps=ultimate / factor_of_safety,
            p99_halves_s=model.halves_p99(ultimate),
        ),
        model,
    )
