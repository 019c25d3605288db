"""The capacity probe's pure parts (chaos/capacity/): the workload's requests and
arrivals, the load generator's reading of a stream, a step's figures, T_recover and
the wasted-work share, and the probe's verdicts and settings."""

from __future__ import annotations

import math
import statistics

import pytest

from chaos.capacity.load import _Stream
from chaos.capacity.prefix_cache import Scrape, hit_rate, prefix_caching
from chaos.capacity.probe_config import ProbeConfig, recovery_offsets
from chaos.capacity.results import Outcome, RequestResult
from chaos.capacity.stats import percentile, recovery_time, step_figures, wasted_share
from chaos.capacity.verdicts import Verdict, verdict
from chaos.capacity.workload import (
    DEFAULT_PROFILE,
    TEMPLATE_TOKENS,
    WORDS,
    Workload,
    arrivals,
    default_workload,
    prompt_length,
    requests,
    warmup_requests,
    workload_from_catalog,
)
from controlplane.kernel.capacity.bearing import CapacitySLO, Step
from controlplane.kernel.capacity.record import WorkloadProfile
from controlplane.kernel.prefix.catalog import CatalogEntry, PrefixCatalog
from controlplane.kernel.prefix.identity import FingerprintParams, PromptKind
from controlplane.kernel.prefix.prewarm import ReplayPayload
from controlplane.kernel.vllm.signals import ReplicaMetrics
from regions.simulator.tokenizer import Tokenizer, render_chat

SLO = CapacitySLO(ttft_p99_s=1.0)
PROFILE = WorkloadProfile(
    prompt_tokens_p50=200, prompt_tokens_p90=400, output_tokens=8, shared_prefix_share=0.5
)
WORKLOAD = Workload(PROFILE, prefix_tokens=120, prefixes=3)


# ---- arrivals and requests ---------------------------------------------------------------


def test_arrivals_are_poisson_at_the_rate_and_the_same_gaps_at_every_rate() -> None:
    at = arrivals(200, 50, seed=3)
    assert all(0 < a < 50 for a in at) and at == sorted(at)
    assert abs(len(at) / 50 - 200) < 200 * 0.03  # 10,000 arrivals: within 3 %
    gaps = [b - a for a, b in zip([0.0, *at], at, strict=False)]
    assert statistics.stdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.05)  # CV 1
    # common random numbers: the same unit gaps, scaled by 1/rate
    slow = arrivals(100, 100, seed=3)
    assert slow[: len(at)] == pytest.approx([2 * a for a in at])
    assert arrivals(200, 50, seed=4) != at
    with pytest.raises(ValueError):
        arrivals(0, 1, seed=0)


def test_prompt_lengths_follow_the_profile_percentiles() -> None:
    lengths = [prompt_length(PROFILE, (i + 0.5) / 1000, WORKLOAD) for i in range(1000)]
    assert percentile(lengths, 50) == pytest.approx(200, abs=1)
    assert percentile(lengths, 90) == pytest.approx(400, rel=0.01)
    same = WorkloadProfile(
        prompt_tokens_p50=64, prompt_tokens_p90=64, output_tokens=1, shared_prefix_share=0
    )
    assert {prompt_length(same, u, WORKLOAD) for u in (0.01, 0.5, 0.99)} == {64}
    tight = Workload(PROFILE, prefix_tokens=10, max_prompt_tokens=300)
    assert prompt_length(PROFILE, 0.999, tight) == 300


def test_cold_prompts_are_unique_from_their_first_word_and_as_long_as_warm_ones() -> None:
    cold = requests(WORKLOAD, 400, warm=False, seed=1, tag="a")
    warm = requests(WORKLOAD, 400, warm=True, seed=1, tag="a")
    assert [r.prompt_tokens for r in cold] == [r.prompt_tokens for r in warm]
    assert all(r.prefix is None for r in cold)
    assert len({r.content.split()[0] for r in cold}) == 400
    shared = [r for r in warm if r.prefix is not None]
    assert 0.4 < len(shared) / 400 < 0.6  # the profile's share
    assert {r.prefix for r in shared} == {0, 1, 2}
    for k in range(3):
        heads = [r.content.split()[: r.prefix_words] for r in shared if r.prefix == k]
        longest = max(heads, key=len)
        assert len(longest) == 120
        assert all(h == longest[: len(h)] for h in heads)  # cut, never changed
    # the rest of a shared prompt is unique too
    assert len({r.content.split()[r.prefix_words] for r in shared}) == len(shared)


def test_request_i_does_not_depend_on_the_count_and_the_tag_only_changes_nonces() -> None:
    few = requests(WORKLOAD, 10, warm=True, seed=5, tag="x")
    many = requests(WORKLOAD, 50, warm=True, seed=5, tag="x")
    assert few == many[:10]
    other = requests(WORKLOAD, 10, warm=True, seed=5, tag="y")
    assert [r.prompt_tokens for r in other] == [r.prompt_tokens for r in few]
    assert all(a.content != b.content for a, b in zip(few, other, strict=True))
    assert all(
        len(a.content.split()) == len(b.content.split()) for a, b in zip(few, other, strict=True)
    )


def test_the_token_estimate_is_exact_on_the_simulators_tokenizer() -> None:
    tok = Tokenizer()
    for r in requests(WORKLOAD, 50, warm=True, seed=2, tag="t"):
        assert len(tok.encode(render_chat([("user", r.content)]))) == r.prompt_tokens
    assert all(len(w) <= 4 for w in WORDS) and TEMPLATE_TOKENS == 8


def test_the_warm_up_carries_each_whole_shared_prefix_once() -> None:
    warm = requests(WORKLOAD, 200, warm=True, seed=2, tag="t")
    ups = warmup_requests(WORKLOAD, seed=2, tag="t")
    assert [u.prefix for u in ups] == [0, 1, 2] and all(u.max_tokens == 1 for u in ups)
    tok = Tokenizer()
    for u in ups:
        assert len(tok.encode(render_chat([("user", u.content)]))) == u.prompt_tokens
        head = u.content.split()[: u.prefix_words]
        # every shared prompt of the workload starts with (a cut of) this prefix
        for r in warm:
            if r.prefix == u.prefix:
                assert r.content.split()[: r.prefix_words] == head[: r.prefix_words]


def test_the_body_asks_for_a_stream_with_usage_and_a_fixed_output() -> None:
    import json

    body = json.loads(requests(WORKLOAD, 1, warm=False, seed=0, tag="b")[0].body("m"))
    assert body["model"] == "m" and body["stream"] is True and body["ignore_eos"] is True
    assert body["max_tokens"] == 8 and body["stream_options"] == {"include_usage": True}


def _payload(key: str, tokens: int, ancestors: tuple[str, ...] = ()) -> ReplayPayload:
    return ReplayPayload(
        key=key,
        kind=PromptKind.TEXT,
        model="m",
        prompt="x" * tokens,
        blocks=max(1, tokens // 16),
        block_size=16,
        tokens=tokens,
        tokens_exact=False,
        ancestors=ancestors,
    )


def test_a_workload_from_the_prefix_catalog_uses_its_deepest_shared_prefixes() -> None:
    entries = (
        CatalogEntry(key="a1", count=90, sessions=3, payload=_payload("a1", 256)),
        CatalogEntry(key="a2", count=90, sessions=3, payload=_payload("a2", 512, ("a1",))),
        CatalogEntry(key="b1", count=30, sessions=3, payload=_payload("b1", 256)),
        CatalogEntry(key="c", count=50, sessions=1),  # no payload yet: not used
    )
    catalog = PrefixCatalog(
        region="r", at=0, params=FingerprintParams(), min_sessions=3, shared_prefixes=3,
        entries=entries,
    )  # fmt: skip
    w = workload_from_catalog(catalog)
    # deepest: a2 (512, count 90) and b1 (256, count 30): the weighted median is 512
    assert (w.prefix_tokens, w.prefixes) == (512, 2)
    assert w.profile.source == "exports"
    assert w.profile.prompt_tokens_p50 >= 512 * 4 / 3 - 1
    assert w.profile.shared_prefix_share == DEFAULT_PROFILE.shared_prefix_share


def test_without_a_catalog_the_default_workload_is_used() -> None:
    w = workload_from_catalog(None)
    assert w == default_workload() and w.profile.source == "default"
    empty = PrefixCatalog(
        region="r", at=0, params=FingerprintParams(), min_sessions=3, shared_prefixes=0
    )
    assert workload_from_catalog(empty) == default_workload()
    with pytest.raises(ValueError):
        Workload(PROFILE, prefix_tokens=0)


# ---- reading a stream ----------------------------------------------------------------------


def _read(lines: list[bytes]) -> _Stream:
    s = _Stream()
    for i, line in enumerate(lines):
        s.read(line, float(i))
    return s


ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n'
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":" the"}}]}\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":42,"completion_tokens":2}}\n'


def test_a_stream_counts_tokens_from_the_first_content_chunk_and_reads_usage() -> None:
    s = _read([ROLE, b"\n", TOKEN, b"\n", TOKEN, USAGE, b"data: [DONE]\n"])
    assert (s.first_token_s, s.generated, s.prompt_tokens, s.done, s.error) == (
        2.0, 2, 42, True, "",
    )  # fmt: skip


def test_an_in_band_error_is_read_after_the_first_token() -> None:
    err = b'data: {"error": {"message": "Internal server error (injected)", "code": 500}}\n'
    s = _read([ROLE, TOKEN, err, b"data: [DONE]\n"])
    assert s.error == "Internal server error (injected)" and s.done


# ---- a step's figures ----------------------------------------------------------------------


def result(
    sent: float,
    ttft: float | None,
    outcome: Outcome = Outcome.OK,
    *,
    lag: float = 0.0,
    tokens: tuple[int, int] = (10, 2),
) -> RequestResult:
    first = None if ttft is None else sent + ttft
    return RequestResult(
        planned_s=sent - lag,
        sent_s=sent,
        first_token_s=first,
        done_s=(first or sent) + 0.1,
        outcome=outcome,
        status=200,
        detail="",
        prompt_tokens=tokens[0] if ttft is not None else 0,
        generated_tokens=tokens[1] if ttft is not None else 0,
        cached_tokens=None,
        url="u",
    )


def test_step_figures() -> None:
    ok = [result(i * 0.1, 0.2 + i * 0.001, lag=0.001 * i) for i in range(98)]
    bad = [result(9.8, None, Outcome.ERROR), result(9.9, None, Outcome.TIMEOUT)]
    figs = step_figures([*ok, *bad], offered_rps=10, duration_s=10, timeout_s=5)
    s = figs.step
    assert s.p99_ttft_s == pytest.approx(percentile([r.ttft_s or 0 for r in ok], 99))
    assert (s.error_rate, s.timeouts, figs.requests) == (0.02, 1, 100)
    # completed within the step over its duration (what was offered and served: ~10)
    assert s.throughput_rps == pytest.approx(sum(r.done_s <= 10 for r in ok) / 10)
    assert s.served_ratio is None  # a screening step is not judged on keeping up
    assert figs.lag_max_s == pytest.approx(0.097)
    nothing = step_figures([], 0.1, 1, 5).step
    assert (nothing.p99_ttft_s, nothing.error_rate) == (0.0, 0.0)
    none_served = step_figures([result(0, None, Outcome.ERROR)], 1, 1, 5).step
    assert none_served.p99_ttft_s == 5 and none_served.error_rate == 1


def test_recovery_time_is_where_the_windows_stay_within_the_sla() -> None:
    slow_then_fast = [result(10 + i * 0.1, 3.0 if i < 20 else 0.2) for i in range(100)]
    # the last window that holds a slow request starts at 11.9 (its p99 is the slow one)
    assert recovery_time(slow_then_fast, 10, 20, 1.0, SLO) == pytest.approx(2.0)
    fast = [result(10 + i * 0.1, 0.2) for i in range(100)]
    assert recovery_time(fast, 10, 20, 1.0, SLO) == 0.0
    never = [result(10 + i * 0.1, 3.0) for i in range(100)]
    assert recovery_time(never, 10, 20, 1.0, SLO) is None
    errors = [
        result(10 + i * 0.1, 0.2, Outcome.ERROR if i < 30 else Outcome.OK) for i in range(100)
    ]
    assert recovery_time(errors, 10, 20, 1.0, SLO) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="shorter than one window"):
        recovery_time(fast, 10, 10.5, 1.0, SLO)


def test_wasted_work_counts_the_tokens_of_requests_that_failed_after_prefill() -> None:
    rs = [
        result(0, 0.1, tokens=(100, 10)),
        result(1, 0.1, Outcome.ERROR, tokens=(100, 5)),  # cut mid-stream
        result(2, None, Outcome.ERROR),  # refused before prefill: nothing spent
    ]
    assert wasted_share(rs) == pytest.approx(105 / 215)
    assert wasted_share([result(0, None, Outcome.ERROR)]) is None


# ---- the probe's judgement -----------------------------------------------------------------


def test_verdicts() -> None:
    base = Step(1, 0.1, 0, 1)  # the lowest step: the knee's reference
    assert verdict(Step(1, 0.1, 0, 1), base, SLO) is Verdict.ELASTIC
    assert verdict(Step(2, 0.3, 0, 2), base, SLO) is Verdict.PAST_KNEE
    assert verdict(Step(3, 1.5, 0, 3), base, SLO) is Verdict.OVER_SLA
    assert verdict(Step(4, 0.2, 0.01, 4), base, SLO) is Verdict.OVER_SLA
    assert verdict(Step(5, 0.2, 0.2, 4), base, SLO) is Verdict.FAILURE
    assert verdict(Step(6, 0.2, 0.0, 4, timeouts=1), base, SLO) is Verdict.FAILURE


def test_probe_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        ProbeConfig(region="r", slo=SLO, step_s=0)
    with pytest.raises(ValueError, match="window"):
        ProbeConfig(region="r", slo=SLO, recover_s=1, recover_window_s=1)
    with pytest.raises(ValueError):
        ProbeConfig(region="r", slo=SLO, overload_factor=1)
    with pytest.raises(ValueError):
        ProbeConfig(region="r", slo=SLO, growth=1)
    with pytest.raises(ValueError):
        ProbeConfig(region="r", slo=SLO, behind_retries=-1)


def test_the_recovery_load_is_an_overload_step_then_the_allowed_rate() -> None:
    c = ProbeConfig(region="r", slo=SLO, step_s=20, recover_s=40, factor_of_safety=2)
    over, after = recovery_offsets(c, 10)
    assert abs(len(over) / 20 - 15) < 3 and all(t < 20 for t in over)
    assert abs(len(after) / 40 - 5) < 1.5 and all(20 <= t < 60 for t in after)


def _scrape(queries: float, hits: float, caching: bool | None = True) -> Scrape:
    m = ReplicaMetrics(at=0, prefix_queries=queries, prefix_hits=hits)
    return Scrape({}, m, caching)


def test_the_hit_rate_is_the_counters_deltas_never_assumed() -> None:
    from chaos.capacity.verdicts import Phase, ProbeAborted

    assert hit_rate([_scrape(100, 10)], [_scrape(1100, 610)], Phase.WARM) == 0.6
    # two replicas: summed deltas (not a mean of rates)
    assert hit_rate(
        [_scrape(0, 0), _scrape(0, 0)], [_scrape(100, 90), _scrape(900, 0)], Phase.PAIR
    ) == pytest.approx(0.09)
    assert hit_rate([_scrape(5, 0, False)], [_scrape(5, 0, False)], Phase.WARM) == 0.0
    with pytest.raises(ProbeAborted, match="did not move"):
        hit_rate([_scrape(5, 0, None)], [_scrape(5, 0, None)], Phase.WARM)


def test_prefix_caching_is_read_from_the_cache_config_info() -> None:
    line = 'vllm:cache_config_info{block_size="16",enable_prefix_caching="False",engine="0"} 1.0'
    assert prefix_caching(f"# TYPE vllm:cache_config_info gauge\n{line}\n") is False
    assert prefix_caching(line.replace("False", "True")) is True
    assert prefix_caching("vllm:num_requests_running 0\n") is None
    assert math.isfinite(SLO.ttft_p99_s)
