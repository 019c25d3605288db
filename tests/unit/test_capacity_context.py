"""The probe's workload fits the replica's context (chaos/capacity/workload.py
``fit_context``), and a request refused as too long is the workload's error, not
overload (chaos/capacity/results.py). Pure."""

from __future__ import annotations

import pytest

from chaos.capacity.results import (
    Outcome,
    RequestResult,
    context_error,
    loaded,
    workload_errors,
)
from chaos.capacity.workload import (
    NONCE_WORDS,
    TEMPLATE_TOKENS,
    Workload,
    context_cap,
    fit_context,
    requests,
    warmup_requests,
)
from controlplane.kernel.capacity.record import WorkloadProfile

PROFILE = WorkloadProfile(
    prompt_tokens_p50=1500, prompt_tokens_p90=6000, output_tokens=128, shared_prefix_share=0.6
)
WORKLOAD = Workload(PROFILE, prefix_tokens=5000, prefixes=3)  # a catalog's long prefix
# vLLM 0.32's answer (vllm/renderers/params.py) to a prompt over the context.
VLLM_400 = (
    '{"error":{"message":"This model\'s maximum context length is 4096 tokens. However, '
    "your prompt contains at least 4097 input tokens, which exceeds this limit even without "
    "any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
    'value=4097)","type":"BadRequestError","param":"input_tokens","code":400}}'
)


def test_the_cap_leaves_room_for_the_output_and_the_estimates_error() -> None:
    cap = context_cap(4096, 128)
    assert cap == int((4096 - 128 - 64) * 0.9)
    assert context_cap(4096, 128, headroom=0, margin_tokens=0) == 4096 - 128
    fitted = fit_context(WORKLOAD, 4096)
    assert fitted.max_prompt_tokens == cap and fitted.profile.max_prompt_tokens == cap
    # The warm-up carries all of a prefix, its nonce and a question: it fits too.
    assert fitted.prefix_tokens == cap - TEMPLATE_TOKENS - NONCE_WORDS - 1
    assert all(r.prompt_tokens <= cap for r in warmup_requests(fitted, seed=1, tag="w"))
    for warm in (False, True):
        reqs = requests(fitted, 400, warm=warm, seed=1, tag="t")
        assert max(r.prompt_tokens for r in reqs) == cap  # the tail is cut, at the cap
        # about one token a word, plus the template: within the cap
        assert all(len(r.content.split()) + TEMPLATE_TOKENS <= cap for r in reqs)
    # Nothing to fit: unchanged (no max_model_len, or a context the workload fits).
    assert fit_context(WORKLOAD, None) is WORKLOAD
    assert fit_context(WORKLOAD, 32_768) is WORKLOAD
    with pytest.raises(ValueError, match="no room"):
        fit_context(WORKLOAD, 200)  # 128 output tokens and the margins: nothing left


def test_the_capped_stream_is_the_same_stream_but_for_the_long_prompts() -> None:
    fitted = fit_context(WORKLOAD, 4096)
    again = fit_context(WORKLOAD, 4096)
    assert requests(fitted, 200, warm=True, seed=3, tag="t") == requests(
        again, 200, warm=True, seed=3, tag="t"
    )
    cap = fitted.max_prompt_tokens
    capped = requests(fitted, 200, warm=False, seed=3, tag="t")
    free = requests(WORKLOAD, 200, warm=False, seed=3, tag="t")
    assert any(f.prompt_tokens > cap for f in free)
    for c, f in zip(capped, free, strict=True):
        assert c.prompt_tokens == min(f.prompt_tokens, cap)
        if f.prompt_tokens <= cap:
            assert c == f  # the same draws: the very same request


def result(outcome: Outcome, status: int = 200) -> RequestResult:
    return RequestResult(
        planned_s=0.0,
        sent_s=0.0,
        first_token_s=None if outcome is not Outcome.OK else 0.1,
        done_s=0.2,
        outcome=outcome,
        status=status,
        detail="",
        prompt_tokens=0,
        generated_tokens=0,
        cached_tokens=None,
        url="http://r",
    )


def test_a_context_refusal_is_a_workload_error_not_an_overload_error() -> None:
    assert context_error(400, VLLM_400)
    assert context_error(400, "max_tokens=9000 cannot be greater than max_model_len=4096.")
    assert not context_error(400, '{"error":{"message":"The model `x` does not exist."}}')
    assert not context_error(429, "maximum context length")  # only a 400 is the request's
    assert not context_error(500, "Internal Server Error")
    refused = result(Outcome.WORKLOAD, 400)
    assert refused.workload_error and not refused.overload_error and not refused.ok
    assert result(Outcome.ERROR, 500).overload_error
    assert result(Outcome.TIMEOUT, 0).overload_error
    assert not result(Outcome.OK).overload_error and not result(Outcome.OK).workload_error
    batch = [result(Outcome.OK), refused, result(Outcome.ERROR, 429), refused]
    assert workload_errors(batch) == 2
    assert loaded(batch) == [batch[0], batch[2]]
