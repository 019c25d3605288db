"""Admission for the simulated engine: vLLM's waiting queue, running set and pause modes.

- At most ``max_num_seqs`` requests run; the rest wait in FIFO order (vLLM's
  ``num_requests_running`` / ``num_requests_waiting``).
- :meth:`Scheduler.pause` is vLLM's ``pause_scheduler`` (what ``/sleep`` does first):
  requests that arrive while paused queue until :meth:`Scheduler.resume`, and ``mode``
  says what happens to those already there. ``"abort"`` (vLLM's default) ends every
  waiting and running request at once; ``"wait"`` lets them all finish
  (:meth:`Scheduler.drained`); ``"keep"`` freezes them until :meth:`Scheduler.resume`.
- Requests spend their simulated time in :meth:`Scheduler.nap`, which an abort cuts short.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Literal

PauseMode = Literal["abort", "wait", "keep"]


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass(eq=False)
class Seq:
    """One request as the scheduler sees it."""

    ticket: int
    tokens: int = 0  # prompt + output tokens holding KV blocks
    aborted: bool = False
    frozen: bool = False  # held by a "keep" pause
    waker: asyncio.Future[None] | None = None  # settled to end the current nap early

    def interrupt(self) -> None:
        if self.waker is not None:
            _settle(self.waker)


class Scheduler:
    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.running: dict[int, Seq] = {}
        self.paused = False
        self._waiting: deque[tuple[Seq, asyncio.Future[None]]] = deque()
        self._next_ticket = 0
        self._frozen = False
        self._drain_below = 0  # while paused, tickets below this are still admitted ("wait")
        self._drained = asyncio.Event()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # -- admission -----------------------------------------------------------
    async def admit(self) -> Seq:
        """Wait for a running slot; the returned request is ``aborted`` if it never got one."""
        seq = Seq(self._next_ticket)
        self._next_ticket += 1
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((seq, fut))
        self._dispatch()
        try:
            await fut
        except BaseException:
            if (seq, fut) in self._waiting:
                self._waiting.remove((seq, fut))
            self.release(seq)
            raise
        return seq

    def release(self, seq: Seq) -> None:
        self.running.pop(seq.ticket, None)
        self._dispatch()

    def _admissible(self, seq: Seq) -> bool:
        return not self.paused or seq.ticket < self._drain_below

    def _dispatch(self) -> None:
        """Admit waiting requests in FIFO order while there is room and we may."""
        while (
            self._waiting
            and len(self.running) < self.max_num_seqs
            and self._admissible(self._waiting[0][0])
        ):
            seq, fut = self._waiting.popleft()
            if not fut.done():
                self.running[seq.ticket] = seq
                fut.set_result(None)
        self._check_drained()

    # -- simulated time ------------------------------------------------------
    async def nap(self, seq: Seq, seconds: float) -> bool:
        """Spend ``seconds`` of work, then stay while frozen; False once ``seq`` is aborted."""
        await self._wait(seq, seconds)
        while self._frozen and not seq.aborted:
            seq.frozen = True
            try:
                await self._wait(seq, None)
            finally:
                seq.frozen = False
        return not seq.aborted

    async def _wait(self, seq: Seq, seconds: float | None) -> None:
        if seq.aborted:
            return
        loop = asyncio.get_running_loop()
        seq.waker = fut = loop.create_future()
        timer = None if seconds is None else loop.call_later(max(seconds, 0.0), _settle, fut)
        try:
            await fut
        finally:
            seq.waker = None
            if timer is not None:
                timer.cancel()

    # -- pause / resume ------------------------------------------------------
    def pause(self, mode: PauseMode) -> None:
        self.paused = True
        self._frozen = mode == "keep"
        self._drain_below = self._next_ticket if mode == "wait" else 0
        if mode == "abort":
            waiting, self._waiting = self._waiting, deque()
            running, self.running = list(self.running.values()), {}
            for seq, fut in waiting:
                seq.aborted = True
                _settle(fut)
            for seq in running:
                seq.aborted = True
                seq.interrupt()
        self._drained.clear()
        self._check_drained()

    def resume(self) -> None:
        self.paused = False
        self._frozen = False
        for seq in self.running.values():
            if seq.frozen:
                seq.interrupt()
        self._dispatch()

    def _check_drained(self) -> None:
        # FIFO with rising tickets: if the head may not be admitted, no waiter may.
        if not self.running and not (self._waiting and self._admissible(self._waiting[0][0])):
            self._drained.set()

    async def drained(self) -> None:
        """Return once every request admissible under the current pause has finished."""
        await self._drained.wait()
