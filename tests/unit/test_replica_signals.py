"""Window figures from cumulative vLLM counters: quantiles from bucket deltas, restarts,
the region fold (merged histograms, ratios of sums), the probe's parsing and the
region verdict. Every expected p99 is worked out by hand in a comment."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.kernel.model import Health
from controlplane.kernel.vllm.metrics import parse_gauges, parse_metrics
from controlplane.kernel.vllm.signals import (
    Histogram,
    RegionSignals,
    ReplicaMetrics,
    ReplicaWindow,
    fold_windows,
    histogram_quantile,
    merge_histograms,
    replica_window,
)
from regions.agent.probe_vllm import ReplicaProbe
from regions.agent.verdict import fold_verdict

INF = math.inf
BOUNDS = (0.1, 0.5, 1.0, INF)


def hist(*counts: float, bounds: tuple[float, ...] = BOUNDS, total: float = 0.0) -> Histogram:
    return Histogram(bounds=bounds, counts=counts, total=total)


def scrape(at: float, ttft: Histogram | None = None, **kw: float | None) -> ReplicaMetrics:
    return ReplicaMetrics.model_validate({"at": at, "ttft": ttft, **kw})


# ---- histogram_quantile ----------------------------------------------------------


def test_quantile_interpolates_inside_the_bucket() -> None:
    # 100 observations: 50 <= 0.1, 40 in (0.1, 0.5], 10 in (0.5, 1.0].
    # rank = 0.99 * 100 = 99 falls in (0.5, 1.0], which starts after 90:
    # 0.5 + (1.0 - 0.5) * (99 - 90) / 10 = 0.95
    assert histogram_quantile(0.99, hist(50, 90, 100, 100)) == pytest.approx(0.95)
    # the median: rank 50 is reached in the first bucket, which starts at 0:
    # 0 + 0.1 * 50 / 50 = 0.1
    assert histogram_quantile(0.5, hist(50, 90, 100, 100)) == pytest.approx(0.1)


def test_quantile_in_the_first_bucket_starts_at_zero() -> None:
    # 10 observations, all <= 0.1: rank 9.9 -> 0.1 * 9.9 / 10 = 0.099
    assert histogram_quantile(0.99, hist(10, 10, 10, 10)) == pytest.approx(0.099)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    # all 5 observations above 1.0: Prometheus answers the last finite bound, 1.0
    assert histogram_quantile(0.99, hist(0, 0, 0, 5)) == 1.0


def test_quantile_without_observations_is_unknown() -> None:
    assert histogram_quantile(0.99, hist(0, 0, 0, 0)) is None
    with pytest.raises(ValueError, match="quantile"):
        histogram_quantile(1.5, hist(1, 1, 1, 1))


def test_histogram_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="\\+Inf"):
        Histogram(bounds=(0.1, 0.5), counts=(1, 2))
    with pytest.raises(ValueError, match="one cumulative count per bound"):
        Histogram(bounds=(0.1, INF), counts=(1,))
    with pytest.raises(ValueError, match="ascend"):
        Histogram(bounds=(0.5, 0.1, INF), counts=(1, 1, 1))


# ---- one replica's window ----------------------------------------------------------


def test_window_p99_comes_from_bucket_deltas_not_the_lifetime() -> None:
    prev = scrape(10.0, hist(100, 100, 100, 100))  # 100 fast requests before the window
    cur = scrape(12.0, hist(100, 100, 110, 110))  # then 10 in (0.5, 1.0]
    w = replica_window(prev, cur)
    # window: deltas (0, 0, 10, 10); rank 9.9 in (0.5, 1.0] from 0: 0.5 + 0.5 * 9.9/10 = 0.995
    # (the lifetime histogram would say 0.5 + 0.5 * (108.9 - 100)/10 = 0.945)
    assert w.ttft_p99_s == pytest.approx(0.995)
    assert w.seconds == 2.0 and not w.restarted


def test_window_rates() -> None:
    prev = scrape(0.0, prefix_queries=1000, prefix_hits=200, requests=50, server_errors=1)
    cur = scrape(
        4.0, prefix_queries=1400, prefix_hits=500, requests=90, server_errors=11, kv_usage=0.25
    )
    w = replica_window(prev, cur)
    assert w.request_rate == pytest.approx(40 / 4)
    assert w.error_rate == pytest.approx(10 / 40)
    assert w.prefix_hit_rate == pytest.approx(300 / 400)
    assert w.kv_usage == 0.25


def test_an_idle_window_knows_no_latency_or_ratios() -> None:
    same = scrape(
        1.0, hist(3, 3, 3, 3), prefix_queries=9, prefix_hits=0, requests=3, server_errors=0
    )
    w = replica_window(same, same.model_copy(update={"at": 2.0}))
    assert w.ttft_p99_s is None and w.error_rate is None and w.prefix_hit_rate is None
    assert w.request_rate == 0.0


def test_first_probe_knows_only_the_gauge() -> None:
    w = replica_window(None, scrape(1.0, hist(3, 3, 3, 3), requests=3, kv_usage=0.5))
    assert w == ReplicaWindow(kv_usage=0.5)


def test_a_counter_going_back_is_a_restart_and_the_current_values_are_the_deltas() -> None:
    prev = scrape(0.0, hist(500, 500, 500, 500), requests=500, server_errors=0)
    cur = scrape(1.0, hist(0, 0, 4, 4), requests=6, server_errors=2)
    w = replica_window(prev, cur)
    assert w.restarted
    # deltas = current: (0, 0, 4, 4); rank 3.96 in (0.5, 1.0]: 0.5 + 0.5 * 3.96/4 = 0.995
    assert w.ttft_p99_s == pytest.approx(0.995)
    assert (w.requests, w.server_errors) == (6, 2)


def test_a_new_created_stamp_is_a_restart_even_when_counters_grew() -> None:
    prev = scrape(0.0, requests=5, since=1000.0)
    cur = scrape(30.0, requests=8, since=1020.0)  # restarted and served 8 since
    assert replica_window(prev, cur).requests == 8
    assert replica_window(prev, cur.model_copy(update={"since": 1000.0})).requests == 3


def test_changed_buckets_without_a_restart_give_no_latency() -> None:
    prev = scrape(0.0, hist(1, 1, 1, 1))
    cur = scrape(1.0, hist(1, 2, 2, bounds=(0.2, 0.4, INF)))
    assert replica_window(prev, cur).ttft is None


def test_missing_metrics_stay_unknown() -> None:
    w = replica_window(scrape(0.0), scrape(1.0))
    assert w.requests is None and w.request_rate is None and w.ttft is None


# ---- the region fold -----------------------------------------------------------------


def test_region_p99_merges_histograms_instead_of_averaging_p99s() -> None:
    a = ReplicaWindow(seconds=2.0, ttft=hist(100, 100, 100, 100), requests=100, server_errors=0)
    b = ReplicaWindow(seconds=2.0, ttft=hist(0, 0, 10, 10), requests=10, server_errors=5)
    # a alone: rank 99 in the first bucket: 0.1 * 99/100 = 0.099
    # b alone: rank 9.9 in (0.5, 1.0]: 0.5 + 0.5 * 9.9/10 = 0.995 (their mean: 0.547)
    # merged (100, 100, 110, 110): rank 108.9 in (0.5, 1.0] from 100:
    # 0.5 + 0.5 * 8.9/10 = 0.945
    assert a.ttft_p99_s == pytest.approx(0.099) and b.ttft_p99_s == pytest.approx(0.995)
    region = fold_windows([a, b])
    assert region.ttft_p99_s == pytest.approx(0.945)
    assert region.error_rate == pytest.approx(5 / 110)  # not the mean of 0 and 0.5
    assert region.request_rate == pytest.approx(100 / 2 + 10 / 2)


def test_region_merge_keeps_only_shared_bounds() -> None:
    fine = hist(5, 8, 9, 10, bounds=(0.25, 0.5, 0.75, INF))
    coarse = hist(2, 10, bounds=(0.5, INF))
    merged = merge_histograms([fine, coarse])
    assert merged == Histogram(bounds=(0.5, INF), counts=(10, 20))
    # rank 19.8 in (0.5, +Inf]: the highest finite bound
    assert histogram_quantile(0.99, merged) == 0.5


def test_region_ratios_and_kv() -> None:
    windows = [
        ReplicaWindow(prefix_queries=1000, prefix_hits=900, kv_usage=0.8),
        ReplicaWindow(prefix_queries=0, prefix_hits=0, kv_usage=0.2),
        ReplicaWindow(kv_usage=None),
    ]
    region = fold_windows(windows)
    assert region.prefix_hit_rate == pytest.approx(0.9)
    assert region.kv_usage_max == 0.8 and region.kv_usage_mean == pytest.approx(0.5)
    assert region.ttft_p99_s is None and region.error_rate is None
    assert region.as_signals() == {
        "prefix_hit_rate": pytest.approx(0.9),
        "kv_usage_max": 0.8,
        "kv_usage_mean": pytest.approx(0.5),
    }


def test_nothing_known_gives_no_signals() -> None:
    assert fold_windows([]) == RegionSignals()
    assert fold_windows([]).as_signals() == {}


@given(
    st.lists(st.lists(st.integers(0, 50), min_size=3, max_size=3), min_size=1, max_size=4),
    st.floats(0.01, 1.0),
)
def test_merged_quantile_lies_between_the_replicas(per_bucket: list[list[int]], q: float) -> None:
    hists = []
    for counts in per_bucket:
        cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
        hists.append(Histogram(bounds=(0.1, 1.0, INF), counts=tuple(cumulative)))
    merged = merge_histograms(hists)
    assert merged is not None
    got = histogram_quantile(q, merged)
    each = [v for h in hists if (v := histogram_quantile(q, h)) is not None]
    if not each:
        assert got is None
        return
    assert got is not None and min(each) - 1e-9 <= got <= max(each) + 1e-9


# ---- parsing a scrape (text as vLLM 0.32 writes it, two engines) ------------------

VLLM_TEXT = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 1.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 9.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.5
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1461.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 39.0
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7959792544448884e+09
vllm:prefix_cache_queries_created{engine="1",model_name="tiny"} 1.7959792544448e+09
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1408.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="tiny"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.25
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",model_name="tiny"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="tiny"} 3.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="tiny"} 3.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="tiny"} 4.5
# HELP http_requests_total Total number of requests by method, status and handler.
# TYPE http_requests_total counter
http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 5.0
http_requests_total{handler="/v1/completions",method="POST",status="4xx"} 3.0
http_requests_total{handler="/v1/chat/completions",method="POST",status="5xx"} 2.0
"""


def test_parse_metrics_sums_label_sets_and_reads_the_http_counter() -> None:
    gauges, m = parse_metrics(VLLM_TEXT, at=7.0)
    assert gauges == {"vllm:num_requests_waiting": 3.0}
    assert m.at == 7.0 and m.since == pytest.approx(1.7959792544448e9)
    assert m.ttft == Histogram(bounds=(0.1, 0.5, INF), counts=(1, 3, 5), total=4.75)
    assert (m.prefix_queries, m.prefix_hits) == (1500, 1408)
    assert (m.requests, m.server_errors) == (10, 2)
    assert m.kv_usage == 0.5  # the fullest engine


def test_declared_but_unused_http_counter_is_zero_and_a_missing_one_unknown() -> None:
    _, m = parse_metrics("# TYPE http_requests_total counter\n", at=0.0)
    assert (m.requests, m.server_errors) == (0, 0)
    _, m = parse_metrics("vllm:num_requests_running 1\n", at=0.0)
    assert m.requests is None and m.ttft is None and m.kv_usage is None


def test_ungrouped_status_codes_count_as_server_errors() -> None:
    text = 'http_requests_total{status="503"} 4\nhttp_requests_total{status="200"} 6\n'
    _, m = parse_metrics(text, at=0.0)
    assert (m.requests, m.server_errors) == (10, 4)


def test_unparseable_metrics_raise_and_parse_gauges_gives_nothing() -> None:
    with pytest.raises(ValueError):
        parse_metrics("vllm:num_requests_running not-a-number\n", at=0.0)
    assert (
        parse_gauges(
            "vllm:num_requests_running not-a-number\n", frozenset({"vllm:num_requests_running"})
        )
        == {}
    )


# ---- the region verdict --------------------------------------------------------------


def probe(url: str, m: ReplicaMetrics) -> ReplicaProbe:
    return ReplicaProbe(url=url, up=True, waiting=0, running=0, metrics=m)


def test_verdict_judges_ttft_and_errors_over_the_window() -> None:
    before = [
        probe("http://a", scrape(0.0, hist(0, 0, 0, 0), requests=0, server_errors=0)),
        probe("http://b", scrape(0.0, hist(0, 0, 0, 0), requests=0, server_errors=0)),
    ]
    now = [
        probe(
            "http://a", scrape(1.0, hist(0, 0, 10, 10), requests=10, server_errors=0, kv_usage=0.5)
        ),
        probe(
            "http://b", scrape(1.0, hist(0, 0, 0, 0), requests=10, server_errors=3, kv_usage=0.1)
        ),
    ]
    # merged (0, 0, 10, 10): rank 9.9 in (0.5, 1.0]: 0.5 + 0.5 * 9.9/10 = 0.995
    # errors: 3 of 20 = 15 %
    view = fold_verdict("eu", now, previous=before, max_ttft_p99_s=0.9, max_error_rate=0.1)
    assert view.health is Health.DEGRADED
    assert "ttft p99 0.995s > 0.9s" in view.detail
    assert "error rate 15.0% > 10.0%" in view.detail
    assert view.signals == {
        "replicas_up": 2,
        "replicas_total": 2,
        "queue_depth": 0,
        "running": 0,
        "ttft_p99_s": pytest.approx(0.995),
        "request_rate": 20.0,
        # what failover headroom and CBU read as the served load: first tokens (10 on a)
        "served_rate": 10.0,
        "load_rps": 10.0,
        "load_rps_raw": 10.0,
        "error_rate": pytest.approx(0.15),
        "kv_usage_max": 0.5,
        "kv_usage_mean": pytest.approx(0.3),
    }
    within = fold_verdict("eu", now, previous=before, max_ttft_p99_s=1.0, max_error_rate=0.15)
    assert within.health is Health.HEALTHY and within.detail == "2/2 replicas up"
    unjudged = fold_verdict("eu", now, previous=before)
    assert unjudged.health is Health.HEALTHY


def test_verdict_without_a_previous_round_judges_nothing_it_cannot_know() -> None:
    now = [probe("http://a", scrape(1.0, hist(0, 0, 10, 10), requests=10, server_errors=9))]
    view = fold_verdict("eu", now, max_ttft_p99_s=0.1, max_error_rate=0.0)
    assert view.health is Health.HEALTHY
    assert "ttft_p99_s" not in view.signals and "error_rate" not in view.signals
    assert "load_rps" not in view.signals  # no rate from one scrape: no load, not zero
