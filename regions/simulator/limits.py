"""vLLM's context-length rules for a generation request (vLLM 0.32: ``TokenizeParams`` in
vllm/renderers/params.py, ``get_max_tokens`` in vllm/entrypoints/serve/utils/api_utils.py).

- ``max_tokens`` (or ``max_completion_tokens``) above ``max_model_len``: 400 on that field.
- A prompt longer than ``max_model_len``: 400, "maximum context length", on ``input_tokens``.
- Otherwise ``max_tokens`` is capped at ``max_model_len - prompt_tokens``: a request that
  asks for more ends early with ``finish_reason: "length"``; none left is a 400.
"""

from __future__ import annotations

from regions.simulator.protocol import ApiError


def _invalid(message: str, param: str, value: int) -> ApiError:
    # vLLM's VLLMValidationError: the message names the parameter and value.
    return ApiError(f"{message} (parameter={param}, value={value})", "BadRequestError", 400, param)


def check_max_tokens(requested: int | None, max_model_len: int, param: str = "max_tokens") -> None:
    """Reject an explicit ``requested`` output length beyond the whole context."""
    if requested is not None and requested > max_model_len:
        raise _invalid(
            f"{param}={requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            param,
            requested,
        )


def output_budget(
    prompt_tokens: int, max_tokens: int, max_model_len: int, *, from_text: bool
) -> int:
    """``max_tokens`` capped by the context left after the prompt (see the module doc).

    vLLM tokenizes a text prompt only up to ``max_model_len + 1`` tokens, so its error
    then counts "at least" that many; ``from_text`` says whether the prompt was text.
    """
    if prompt_tokens > max_model_len:
        count = min(prompt_tokens, max_model_len + 1) if from_text else prompt_tokens
        qualifier = "at least " if count == max_model_len + 1 else ""
        raise _invalid(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {qualifier}{count} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
            count,
        )
    budget = min(max_tokens, max_model_len - prompt_tokens)
    if budget < 1:
        raise _invalid(f"max_tokens must be at least 1, got {budget}.", "max_tokens", budget)
    return budget
