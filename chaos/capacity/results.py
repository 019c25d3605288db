"""What one request of the probe came to (pure: the load generator fills it, the
statistics and the bench's model read it).

A **workload error** is the probe's own fault, not the replica's: a 400 that says the
request does not fit the model's context (vLLM: "This model's maximum context length
is ...", or ``max_tokens`` above ``max_model_len``). It says nothing of load, so it is
not an **overload error**, what the SLA's error rate counts (errors and timeouts).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    WORKLOAD = "workload"  # refused as not fitting the context: the probe's fault


# vLLM 0.32's words (vllm/renderers/params.py), the simulator's too (limits.py).
_CONTEXT = re.compile(
    r"maximum context length|max_model_len|context length|max_tokens must be at least",
    re.IGNORECASE,
)


def context_error(status: int, body: str) -> bool:
    """Whether an answer refuses the request as too long for the model's context."""
    return status == 400 and _CONTEXT.search(body) is not None


@dataclass(frozen=True, slots=True)
class RequestResult:
    planned_s: float  # offsets from the run's start
    sent_s: float
    first_token_s: float | None  # None: no content came
    done_s: float
    outcome: Outcome
    status: int  # HTTP status (0: no answer)
    detail: str  # why it failed ("" when ok)
    prompt_tokens: int  # spent on it: 0 unless a first token came (prefill done)
    generated_tokens: int
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens when reported
    url: str

    @property
    def lag_s(self) -> float:
        return self.sent_s - self.planned_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def workload_error(self) -> bool:
        """Refused as not fitting the context: not load, not judged by the SLA."""
        return self.outcome is Outcome.WORKLOAD

    @property
    def overload_error(self) -> bool:
        """What the SLA's error rate counts: an error or a timeout (not a workload
        error)."""
        return self.outcome is Outcome.ERROR or self.outcome is Outcome.TIMEOUT


def workload_errors(results: Sequence[RequestResult]) -> int:
    """How many requests were refused as not fitting the context."""
    return sum(r.workload_error for r in results)


def loaded(results: Sequence[RequestResult]) -> list[RequestResult]:
    """The requests that loaded the replica: all but the workload errors (the error
    rate's denominator)."""
    return [r for r in results if not r.workload_error]


def mean_inflight(results: Sequence[RequestResult], duration_s: float) -> float:
    """Requests held at once on average over a step of ``duration_s`` (Little's law:
    the arrival rate, ``len(results) / duration_s``, times the mean send-to-end time)."""
    if duration_s <= 0:
        raise ValueError("the step's duration must be positive")
    return sum(max(0.0, r.done_s - r.sent_s) for r in results) / duration_s
