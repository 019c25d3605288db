"""The activation rate a pool achieves (regions/pool/wake_rate.py) on a fake clock: a
batch of two or more wakes is timed from its start until its last replica is ACTIVE,
the pool reports the pooled rate of its last batches, and a lone wake measures none;
``pools/<unit>`` carries it once measured, and a leader older than it drops it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controlplane.kernel.clock import FakeClock
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.model import Frozen
from controlplane.kernel.pool.members import PoolMembers
from regions.pool.wake_rate import BATCHES_KEPT, BatchTimer, WakeBatch, WakeRates


def test_a_batch_runs_from_its_start_to_its_last_activation() -> None:
    clock = FakeClock()
    timer = BatchTimer(clock.now)
    clock.advance(2.0)
    timer.woke()
    clock.advance(2.0)
    timer.woke()
    clock.advance(2.0)
    timer.woke()  # three ACTIVE, the last 6 s after the start
    clock.advance(30.0)  # what follows the last wake is not the batch's
    batch = timer.done()
    assert batch == WakeBatch(woken=3, seconds=6.0)
    assert batch.rate == pytest.approx(0.5)


def test_one_wake_or_none_measures_no_rate() -> None:
    clock = FakeClock()
    lone = BatchTimer(clock.now)
    clock.advance(3.0)
    lone.woke()  # a batch of two whose other wake failed: one reached ACTIVE
    assert lone.done() is None
    assert BatchTimer(clock.now).done() is None
    instant = BatchTimer(clock.now)
    instant.woke()
    instant.woke()  # no time on the clock: no rate
    assert instant.done() is None


def test_the_pool_reports_its_last_batches_pooled() -> None:
    rates = WakeRates()
    assert rates.rate() is None and len(rates) == 0
    rates.record(WakeBatch(woken=2, seconds=1.0))  # 2/s
    assert rates.rate() == pytest.approx(2.0)
    rates.record(WakeBatch(woken=6, seconds=7.0))  # a slow batch weighs by its length
    assert rates.rate() == pytest.approx(8 / 8.0)
    assert len(rates) == 2


def test_old_batches_leave_the_window() -> None:
    rates = WakeRates()
    rates.record(WakeBatch(woken=2, seconds=100.0))  # a slow host, long ago
    for _ in range(BATCHES_KEPT):
        rates.record(WakeBatch(woken=4, seconds=2.0))
    assert len(rates) == BATCHES_KEPT
    assert rates.rate() == pytest.approx(2.0)


def test_a_batch_that_measures_nothing_is_refused() -> None:
    rates = WakeRates(kept=2)
    with pytest.raises(ValueError, match="not a measure"):
        rates.record(WakeBatch(woken=1, seconds=1.0))
    with pytest.raises(ValueError, match="not a measure"):
        rates.record(WakeBatch(woken=3, seconds=0.0))
    with pytest.raises(ValueError, match="kept 0"):
        WakeRates(kept=0)


class _MembersBefore(Frozen):
    """``pools/<unit>`` as a leader older than the activation rate reads it."""

    region: str
    active: tuple[str, ...]
    warm: int
    at: float
    agent: str
    activation_p95_s: float | None = None


def test_the_pool_record_carries_the_rate_only_once_measured() -> None:
    m = PoolMembers(
        region="eu", active=("http://a",), warm=1, at=1.0, agent="agent:eu",
        activation_p95_s=2.0, activation_rate=1.25,
    )  # fmt: skip
    assert decode(PoolMembers, encode(m)) == m
    assert decode(_MembersBefore, encode(m)).activation_p95_s == 2.0  # an older leader
    unmeasured = m.model_copy(update={"activation_rate": None})
    assert "activation_rate" not in unmeasured.model_dump(mode="json")
    with pytest.raises(ValidationError, match="greater than 0"):
        PoolMembers(region="eu", active=(), warm=0, at=1.0, agent="a", activation_rate=0.0)
