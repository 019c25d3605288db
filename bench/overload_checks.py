"""Whether a ``bench overload`` phase measured the gateway or the machine it shares.

On a loaded machine the figures can miss their goals for reasons that are not the
gateway's: the load generator sends late (its own event loop lags, so the offered
rate falls and the first-token times it takes include its own delay), or the
simulators' timers slip, so the replicas, busy in every slot, finish fewer requests
than their configuration says (the model's throughput). Each phase records:

* **send lag**: how late each request left against its Poisson schedule (p99, max);
* **loop lag**: how late a 20 ms tick of the generator's event loop woke (p99, max),
  which every client-side first-token time includes;
* **replica pace**: the replicas' own finished requests per second over the window
  (``vllm:request_success`` that ran to their end), the tokens they generated
  (``vllm:generation_tokens``, aborted requests' too: those held their slots) over
  what the model's throughput generates, the share of samples in which every slot was
  busy, and the gateway process's CPU share (``/proc``: one core is its ceiling).

``validity`` turns those into a verdict: a run is **not valid** when the generator lagged
(p99 send or loop lag above ``MAX_LAG_S``) or when the replicas were busy in every slot
yet generated under ``MIN_PACE`` of the model's tokens: the machine, not the
gateway, set the figures. Replicas with idle slots under an offered load past their
throughput are the gateway's doing, and stay a valid (failed) result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench._common import percentile
from controlplane.kernel.vllm.metrics import RUNNING, parse_gauges

SUCCESS = "vllm:request_success_total"
GENERATED = "vllm:generation_tokens_total"
RAN = frozenset({"stop", "length"})
MAX_LAG_S = 0.05  # p99 of send or loop lag past this: the generator, not the gateway
MIN_PACE = 0.95  # replicas busy in every slot but slower than this x the model: the machine
TICK_S = 0.02
SAMPLE_S = 0.25


@dataclass
class Lag:
    """Delays, seconds, of events against when they were due."""

    delays: list[float] = field(default_factory=list)

    def add(self, delay: float) -> None:
        self.delays.append(max(0.0, delay))

    def summary(self) -> dict[str, float | None]:
        p99 = percentile(self.delays, 99)
        top = max(self.delays, default=None)
        return {
            "p99_s": None if p99 is None else round(p99, 4),
            "max_s": None if top is None else round(top, 4),
        }


async def tick(into: Lag, every_s: float = TICK_S) -> None:
    """Until cancelled: how late the event loop wakes a sleeper due every ``every_s``."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + every_s
        await asyncio.sleep(every_s)
        into.add(loop.time() - due)


@dataclass
class Pace:
    """The replicas over one phase's window."""

    completed: float = 0.0  # requests they finished in the window
    generated: float = 0.0  # tokens they generated in the window
    samples: int = 0
    all_busy: int = 0  # samples in which every slot of every replica ran a request
    gateway_cpu_s: float | None = None

    def summary(
        self, duration_s: float, model_rps: float, tokens_per_request: int
    ) -> dict[str, float | None]:
        """Per second of ``duration_s``; the pace over ``model_rps`` requests of
        ``tokens_per_request`` tokens each per second."""
        rps = self.completed / duration_s if duration_s > 0 else 0.0
        model_tokens = model_rps * tokens_per_request * duration_s
        return {
            "replicas_rps": round(rps, 2),
            "replicas_pace": round(self.generated / model_tokens, 3) if model_tokens > 0 else None,
            "all_slots_busy_share": round(self.all_busy / self.samples, 3)
            if self.samples
            else None,
            "gateway_cpu_share": None
            if self.gateway_cpu_s is None
            else round(self.gateway_cpu_s / duration_s, 3),
        }


def progress(text: str) -> tuple[float, float]:
    """What a replica's ``/metrics`` says it did so far: requests that ran to their end
    (stop or length; not those aborted, which a client gave up on), and tokens
    generated (aborted requests' too)."""
    done = generated = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == SUCCESS and s.labels.get("finished_reason") in RAN:
                done += s.value
            elif s.name == GENERATED:
                generated += s.value
    return done, generated


async def completed(http: aiohttp.ClientSession, replicas: Sequence[str]) -> tuple[float, float]:
    """``progress`` of the replicas so far, summed."""
    done = generated = 0.0
    for url in replicas:
        async with http.get(url + "/metrics") as r:
            d, g = progress(await r.text())
        done, generated = done + d, generated + g
    return done, generated


async def watch_slots(
    http: aiohttp.ClientSession, replicas: Sequence[str], slots: int, into: Pace
) -> None:
    """Until cancelled: every ``SAMPLE_S``, whether every replica ran ``slots``."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            running = []
            for url in replicas:
                async with http.get(url + "/metrics") as r:
                    found = parse_gauges(await r.text(), frozenset({RUNNING}))
                running.append(found.get(RUNNING, 0.0))
            into.samples += 1
            into.all_busy += all(n >= slots for n in running)
        await asyncio.sleep(SAMPLE_S)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def validity(
    send: Mapping[str, float | None],
    loop: Mapping[str, float | None],
    pace: Mapping[str, float | None],
) -> list[str]:
    """Why a phase's figures are the machine's rather than the gateway's (empty: valid)."""
    why = []
    for name, lag in (("send", send), ("loop", loop)):
        p99 = lag.get("p99_s")
        if p99 is not None and p99 > MAX_LAG_S:
            why.append(f"the generator's {name} lag p99 {p99:.3f} s > {MAX_LAG_S} s")
    busy, speed = pace.get("all_slots_busy_share"), pace.get("replicas_pace")
    if busy is not None and speed is not None and busy >= 0.9 and speed < MIN_PACE:
        why.append(
            f"the replicas were busy in every slot ({busy:.0%} of samples) yet generated "
            f"{speed:.0%} of their configured tokens (< {MIN_PACE:.0%}): their timers slipped"
        )
    return why
