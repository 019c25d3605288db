"""What one request of the probe came to (pure: the load generator fills it, the
statistics and the bench's model read it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"


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


def mean_inflight(results: Sequence[RequestResult], duration_s: float) -> float:
    """Requests held at once on average over a step of ``duration_s`` (Little's law:
    the arrival rate, ``len(results) / duration_s``, times the mean send-to-end time)."""
    if duration_s <= 0:
        raise ValueError("the step's duration must be positive")
    return sum(max(0.0, r.done_s - r.sent_s) for r in results) / duration_s
