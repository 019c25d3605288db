"""Bounded retries for store calls (docs/architecture.md §7.6).

Only ``StoreUnavailable`` (temporary) is retried, with exponential backoff and jitter,
until ``deadline_s`` has passed since the first attempt; then the last error is
re-raised as is. Permanent errors and ``asyncio.CancelledError`` go straight through
(tenacity re-raises anything its retry predicate rejects).

Usage::

    async for attempt in retrying(2 * timeout_s):
        with attempt:
            kv = await store.get(key)

or ``await retry_call(2 * timeout_s, store.get, key)``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from controlplane.kernel.store.port import StoreUnavailable

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger("tectonic.store")

# Backoff: 50 ms, 100 ms, 200 ms ... capped at 1 s, each plus up to 50 ms of jitter so
# that replicas that failed together do not retry together.
INITIAL_WAIT_S = 0.05
MAX_WAIT_S = 1.0
JITTER_S = 0.05


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    log.debug(
        "store call failed (attempt %d, %.2fs so far), retrying: %s",
        state.attempt_number,
        state.seconds_since_start or 0.0,
        exc,
    )


def retrying(
    deadline_s: float,
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = StoreUnavailable,
    max_wait_s: float = MAX_WAIT_S,
) -> AsyncRetrying:
    """A tenacity ``AsyncRetrying`` that retries ``retry_on`` (default StoreUnavailable)
    until ``deadline_s`` seconds after the first attempt, then re-raises the last error."""
    # (wait_exponential_jitter's arguments differ between tenacity 8 and 9)
    backoff = wait_exponential(multiplier=INITIAL_WAIT_S, max=max_wait_s) + wait_random(0, JITTER_S)

    def wait(state: RetryCallState) -> float:
        # Never sleep past the deadline: the last attempt starts at the deadline at
        # the latest, so a call takes at most deadline + one attempt.
        left = deadline_s - (state.seconds_since_start or 0.0)
        return max(0.0, min(float(backoff(state)), left))

    return AsyncRetrying(
        retry=retry_if_exception_type(retry_on),
        stop=stop_after_delay(deadline_s),
        wait=wait,
        before_sleep=_log_retry,
        reraise=True,
    )


async def retry_call(
    deadline_s: float,
    fn: Callable[P, Awaitable[T]],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """``await fn(*args, **kwargs)``, retrying StoreUnavailable within ``deadline_s``."""
    async for attempt in retrying(deadline_s):
        with attempt:
            return await fn(*args, **kwargs)
    raise AssertionError("unreachable: tenacity re-raises on stop")  # pragma: no cover
