"""Fault injection for the simulator (``/_sim/fault``).

Faults act on the inference endpoints (``/v1/completions``, ``/v1/chat/completions``)
except ``health_down``, which acts on ``/health`` only, and ``crash``, which ends the
process. ``hang`` holds inference
requests until the fault is cleared, the way a wedged engine does; like vLLM's own
``/health`` (which only asks whether the engine process is alive), ``/health`` keeps
answering 200 while requests hang. ``stream_error_after`` cuts streams mid-way the way
an engine error does in vLLM: the status (200) and some tokens are already out, so the
error comes in-band as an SSE event, then ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import random
from enum import Enum

from pydantic import Field

from controlplane.kernel.model import Frozen


class FaultSpec(Frozen):
    error_rate: float = Field(0.0, ge=0.0, le=1.0)  # share of requests answered 500
    unavailable_rate: float = Field(0.0, ge=0.0, le=1.0)  # share answered 503
    added_latency_s: float = Field(0.0, ge=0.0, le=600.0)  # before the first token
    hang: bool = False  # inference requests never finish until the fault is cleared
    health_down: bool = False  # /health answers 503
    # The process dies (exit code 70) right after answering: a crashed engine, as a
    # drill sees it. Everything in flight is lost, like a real crash.
    crash: bool = False
    # A streaming request that has sent this many output tokens gets vLLM's in-band error
    # event instead of the next one. Read per token, so setting it cuts running streams.
    stream_error_after: int | None = Field(None, ge=0)


class Verdict(Enum):
    PASS = "pass"
    ERROR = "error"  # 500
    UNAVAILABLE = "unavailable"  # 503


class FaultState:
    """The active fault and the seeded dice that decide each request's fate."""

    def __init__(self, seed: int = 0) -> None:
        self.spec = FaultSpec()
        self._rng = random.Random(seed)
        self._unhung = asyncio.Event()
        self._unhung.set()

    def set(self, spec: FaultSpec) -> None:
        """Replace the active fault (fields left out are cleared)."""
        self.spec = spec
        if spec.hang:
            self._unhung.clear()
        else:
            self._unhung.set()

    def clear(self) -> None:
        self.set(FaultSpec())

    def roll(self) -> Verdict:
        s = self.spec
        if s.unavailable_rate and self._rng.random() < s.unavailable_rate:
            return Verdict.UNAVAILABLE
        if s.error_rate and self._rng.random() < s.error_rate:
            return Verdict.ERROR
        return Verdict.PASS

    async def wait_unhung(self) -> None:
        await self._unhung.wait()
