"""bench autoscale's causal floor (bench/autoscale.py): the least a policy without
foresight pays to hold its planned burst, worked by hand on a small hit-rate collapse;
and the same charged the launch times the run draws."""

from __future__ import annotations

from bench.autoscale import Options, Setup, causal_floor
from bench.autoscale_sim import Scenario


def test_the_floor_counts_need_standby_and_the_launches_the_plan_cannot_avoid() -> None:
    # 20 rps; 10 rps per replica at hit rate 0.8, 5 at 0.2; the hit rate collapses at
    # 9.5-10 s (the second [9, 10) already needs 4: its end is at 0.2)
    collapse = Scenario("c", ((0.0, 20.0, 0.8), (9.5, 20.0, 0.8), (10.0, 20.0, 0.2)), 100.0)
    s = Setup(
        Options(standby_rps=60.0, preroll_s=5.0, warm_price=0.6),
        collapse,
        lambda h: 10.0 if h > 0.5 else 5.0,
        seed=1,
    )
    # [0, 9): 2 ACTIVE, and 4 WARM for the 40 rps of the plan beyond them (the usual
    # hit rate stays ~0.8: 10 rps per replica); [9, 10): 4 ACTIVE (the second ends at
    # 0.2), counted at its start's 10 rps: 2 WARM; [10, 100): 4 ACTIVE bear 20, 4 WARM
    # for the other 40. The fleet grows 6 -> 8 at 10 s: 2 replicas launched (at least
    # 60 s at the LOADING price, 1, not the WARM one, 0.6: 24 each) or kept WARM since
    # the start (10 s at 0.6: 6 each), the cheaper
    cost = 9 * (2 + 0.6 * 4) + (4 + 0.6 * 2) + 90 * (4 + 0.6 * 4) + 2 * 6
    assert round(cost, 6) == 632.8
    assert causal_floor(s, oracle_cost=500.0) == round(cost / 500.0, 4)
    # the same collapse at 100 s (its second [99, 100) needs 4): launching is cheaper
    late = Scenario("c", ((0.0, 20.0, 0.8), (99.5, 20.0, 0.8), (100.0, 20.0, 0.2)), 200.0)
    s2 = Setup(s.o, late, s.per_replica, seed=1)
    cost = 99 * (2 + 0.6 * 4) + (4 + 0.6 * 2) + 100 * (4 + 0.6 * 4) + 2 * 24
    assert causal_floor(s2, oracle_cost=1000.0) == round(cost / 1000.0, 4)
    # charged the run's own draws (the first two launches: 60-180 s each, at most the
    # 100 s left), each at 0.4 a second over WARM, or WARM since the start (99 x 0.6)
    first, second = (min(d, 100.0) * 0.4 for d in s2.launches[:2])
    assert max(first, second) > 24  # a draw over the least: the figure differs
    drawn = cost - 2 * 24 + min(first, 59.4) + min(second, 59.4)
    assert causal_floor(s2, oracle_cost=1000.0, drawn=True) == round(drawn / 1000.0, 4)
