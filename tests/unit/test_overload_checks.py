"""``bench overload``'s verdict on its own runs (bench/overload_checks.py): when the
generator's lag or the replicas' slipped pace, not the gateway, set the figures."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from bench.overload_checks import MAX_LAG_S, Lag, Pace, cpu_seconds, progress, tick, validity

ON_TIME = {"p99_s": 0.002, "max_s": 0.01}


def pace(busy: float, speed: float) -> dict[str, float | None]:
    return {"all_slots_busy_share": busy, "replicas_pace": speed}


def test_a_phase_on_time_with_replicas_at_their_pace_is_valid() -> None:
    assert validity(ON_TIME, ON_TIME, pace(1.0, 0.99)) == []


def test_a_lagging_generator_makes_the_phase_not_valid() -> None:
    late = {"p99_s": MAX_LAG_S * 2, "max_s": 0.5}
    why = validity(late, ON_TIME, pace(1.0, 1.0))
    assert len(why) == 1 and "send lag p99" in why[0]
    assert "loop lag" in validity(ON_TIME, late, pace(1.0, 1.0))[0]


def test_replicas_busy_in_every_slot_but_slow_are_the_machines_doing() -> None:
    why = validity(ON_TIME, ON_TIME, pace(0.97, 0.88))
    assert len(why) == 1 and "timers slipped" in why[0]


def test_replicas_with_idle_slots_are_the_gateways_doing_and_stay_valid() -> None:
    """Slow because slots stood idle under an offered load past what they run: the
    gateway held requests back; a real (failed) result, not the machine's."""
    assert validity(ON_TIME, ON_TIME, pace(0.4, 0.7)) == []


def test_nothing_measured_says_nothing() -> None:
    empty = Lag().summary()
    assert empty == {"p99_s": None, "max_s": None}
    assert validity(empty, empty, Pace().summary(60.0, 40.0, 9)) == []


def test_the_pace_is_per_second_of_the_window_and_over_the_model() -> None:
    p = Pace(completed=1_800, generated=14_400, samples=10, all_busy=9, gateway_cpu_s=15.0)
    assert p.summary(60.0, 40.0, 8) == {  # the model: 40 x 8 tokens a second
        "replicas_rps": 30.0,
        "replicas_pace": 0.75,
        "all_slots_busy_share": 0.9,
        "gateway_cpu_share": 0.25,
    }


def test_lag_counts_only_delays() -> None:
    lag = Lag()
    for d in (-0.01, 0.0, 0.02):
        lag.add(d)
    assert lag.delays == [0.0, 0.0, 0.02] and lag.summary()["max_s"] == 0.02


async def test_the_tick_measures_the_loops_own_lag() -> None:
    """A handler that holds the loop for 0.1 s shows as a tick that woke that late."""
    lag = Lag()
    task = asyncio.create_task(tick(lag, every_s=0.01))
    await asyncio.sleep(0.05)
    loop = asyncio.get_running_loop()
    loop.call_soon(time.sleep, 0.1)  # blocks the loop
    await asyncio.sleep(0.15)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert max(lag.delays) >= 0.05


def test_cpu_seconds_of_this_process_and_of_none() -> None:
    mine = cpu_seconds(os.getpid())
    assert mine is not None and mine > 0
    assert cpu_seconds(2**22 + 12_345) is None  # above pid_max: no such process


def test_only_requests_that_ran_to_their_end_count_as_finished_and_all_tokens() -> None:
    page = (
        "# TYPE vllm:request_success counter\n"
        'vllm:request_success_total{finished_reason="length",model_name="tiny"} 30.0\n'
        'vllm:request_success_total{finished_reason="stop",model_name="tiny"} 5.0\n'
        'vllm:request_success_total{finished_reason="abort",model_name="tiny"} 90.0\n'
        "# TYPE vllm:generation_tokens counter\n"
        'vllm:generation_tokens_total{model_name="tiny"} 400.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running 4.0\n"
    )
    assert progress(page) == (35.0, 400.0)
