"""The activation rate a pool achieves, measured (the sizing formula's ``a``). PURE.

The sizing formula (``controlplane/kernel/pool/sizing.py``) counts on ``a`` wakes a
second: how many WARM replicas the pool can bring to ACTIVE per second when a burst
wants several at once (they share a host, a GPU's PCIe link, a node's disk). It is
measured from what the pool did, not typed: when one plan wakes ``k >= 2`` WARM
replicas together (a batch), the rate it achieved is ``k / T`` where ``T`` runs from the
batch's start until the last of them is ACTIVE. Only the wakes that succeeded count;
a batch with fewer than two is no measure of a rate (one wake is the activation time's,
``activation_p95_s``).

The pool keeps its last :data:`BATCHES_KEPT` batches and reports their pooled rate,
``sum(k) / sum(T)``: a long batch weighs by its length, so one lucky pair does not
outweigh a slow batch of six. The agent publishes it in ``pools/<unit>``
(``activation_rate``) and signals it to the control plane; the leader's cold-start
check and ``failoverctl doctor`` take it in place of the typed
``scaling.activation_rate`` when present.

:class:`BatchTimer` times one batch on a clock given to it (the pool's monotonic clock;
a fake one in the tests); :class:`WakeRates` keeps the window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

BATCHES_KEPT = 8  # recent batches whose pooled rate the pool reports
MIN_BATCH = 2  # wakes in one batch for it to measure a rate


@dataclass(frozen=True, slots=True)
class WakeBatch:
    """One batch: ``woken`` replicas reached ACTIVE, the last ``seconds`` after its start."""

    woken: int
    seconds: float

    @property
    def rate(self) -> float:
        """Replicas woken per second."""
        return self.woken / self.seconds


class BatchTimer:
    """Times one batch of wakes: made when they start, told each time one is ACTIVE,
    asked at the end. ``clock``: seconds, monotonic."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._started = clock()
        self._last = self._started
        self._woken = 0

    def woke(self) -> None:
        """One replica of the batch is ACTIVE now."""
        self._woken += 1
        self._last = self._clock()

    def done(self) -> WakeBatch | None:
        """The batch, or None when it measures no rate (under :data:`MIN_BATCH` woken,
        or no time elapsed on the clock)."""
        seconds = self._last - self._started
        if self._woken < MIN_BATCH or seconds <= 0:
            return None
        return WakeBatch(woken=self._woken, seconds=seconds)


class WakeRates:
    """The last ``kept`` batches and their pooled rate."""

    def __init__(self, kept: int = BATCHES_KEPT) -> None:
        if kept < 1:
            raise ValueError(f"kept {kept} < 1")
        self._batches: deque[WakeBatch] = deque(maxlen=kept)

    def record(self, batch: WakeBatch) -> None:
        if batch.woken < MIN_BATCH or batch.seconds <= 0:
            raise ValueError(f"not a measure of a rate: {batch}")
        self._batches.append(batch)

    def __len__(self) -> int:
        return len(self._batches)

    def rate(self) -> float | None:
        """Replicas woken per second over the kept batches (None: none measured)."""
        if not self._batches:
            return None
        return sum(b.woken for b in self._batches) / sum(b.seconds for b in self._batches)
