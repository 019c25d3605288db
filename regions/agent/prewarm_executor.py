"""Replays prefixes on a region's replicas within a budget, then measures the result
with vLLM's own counters (docs/architecture.md §4).

Each payload (``controlplane.kernel.prefix.prewarm.ReplayPayload``) is sent once with
``max_tokens: 1`` to the replica prefix-aware routing will send its prompts to
(:mod:`regions.agent.prewarm_plan`), most frequent first, ``per_replica`` at a time on each
replica: prefill is compute-bound, so more concurrency on one replica only queues.
Replays not finished by the deadline are cancelled and count as not warmed. A payload
carries no request headers (no user's credentials): a replay sends only its content
type and, when the agent has one, the data plane's own key (vLLM's ``--api-key``, as
``Authorization: Bearer``: ``regions.dataplane.replay_headers``).

**Verification**: afterwards, the ``verify`` most frequent warmed payloads are sent a
second time, one at a time per replica. The hits of each come from vLLM itself: the
answer's ``usage.prompt_tokens_details.cached_tokens`` when the server reports it
(``--enable-prompt-tokens-details``), else the deltas of the replica's
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` between two
scrapes around the request, counted only when the queries delta equals the request's
own prompt tokens (no other request ran in between). Hits over prompt tokens is the
hit rate the pre-warm bought. Polluted samples are dropped, not guessed: under live
traffic without prompt-token details, ``verified`` may be 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import aiohttp
from pydantic import BaseModel, ConfigDict

from controlplane.kernel.logs import REQUEST_ID
from controlplane.kernel.prefix.prewarm import ReplayPayload
from controlplane.kernel.vllm.metrics import parse_gauges
from regions.agent.prewarm_plan import assign
from regions.dataplane.replay_headers import replay_headers, replay_id
from regions.dataplane.ring import DEFAULT_PREFIX_CHARS
from regions.http_errors import describe_error

log = logging.getLogger("tectonic.prewarm")
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
_JSON = {"content-type": "application/json"}


class PrewarmOutcome(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    total: int
    warmed: int
    failed: int
    elapsed_s: float
    attainment: float  # warmed / total; 1.0 when there was nothing to warm
    prompt_tokens: int  # tokens the replays prefilled, from vLLM's usage
    verified: int = 0
    verified_hit_rate: float = 0.0
    replicas: int = 0
    detail: str = ""
    # sealed payloads (docs/residency.md) not opened here: in ``total``, never warmed
    no_key: int = 0  # sealed with a key this agent does not hold
    unreadable: int = 0  # the key is here but the envelope does not open


@dataclass
class Progress:
    total: int
    warmed: int = 0
    failed: int = 0
    elapsed_s: float = 0.0


@dataclass
class _Sent:
    replica: str
    prompt_tokens: int


class _Run:
    def __init__(self, total: int, started: float, on_progress: Callable[[Progress], None] | None):
        self.progress = Progress(total)
        self.started = started
        self.on_progress = on_progress
        self.tokens = 0
        self.sent: dict[int, _Sent] = {}
        self.errors: list[str] = []

    def tick(self, now: float) -> None:
        self.progress.elapsed_s = now - self.started
        if self.on_progress is not None:
            self.on_progress(self.progress)


class Usage(NamedTuple):
    prompt_tokens: int
    cached_tokens: int | None  # only from servers run with --enable-prompt-tokens-details


_answered = 0  # replays answered by this process, cumulative: not the region's load


def answered_replays() -> int:
    """How many replays this process has had answered so far (the agent subtracts
    their increase from the served load it reports: it sent them itself)."""
    return _answered


async def replay(
    http: aiohttp.ClientSession,
    replica: str,
    payload: ReplayPayload,
    timeout_s: float,
    api_key: str | None = None,
    request_id: str | None = None,
) -> Usage:
    """Send one payload with ``max_tokens: 1`` (with the data plane's ``api_key``, if
    any, and ``request_id`` as its ``x-request-id``); vLLM's usage of it. Raises
    RuntimeError with a short reason when the replica refuses it."""
    url = replica.rstrip("/") + payload.endpoint
    limit = aiohttp.ClientTimeout(total=max(0.001, timeout_s))
    hdrs = dict(replay_headers(_JSON.items(), api_key=api_key, request_id=request_id))
    try:
        async with http.post(url, data=payload.request_body(1), headers=hdrs, timeout=limit) as r:
            if r.status != 200:
                text = (await r.text())[:200]
                raise RuntimeError(f"{replica}: HTTP {r.status}: {text}")
            body = await r.json()
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise RuntimeError(f"{replica}: {describe_error(e, timeout_s)}") from e
    global _answered
    _answered += 1
    usage = body.get("usage") if isinstance(body, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    tokens = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        tokens if isinstance(tokens, int) else 0, cached if isinstance(cached, int) else None
    )


async def cache_counters(http: aiohttp.ClientSession, replica: str) -> tuple[float, float]:
    """(queries, hits) of the replica's prefix cache, summed over engines."""
    url = replica.rstrip("/") + "/metrics"
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
        r.raise_for_status()
        gauges = parse_gauges(await r.text(), frozenset({HITS, QUERIES}))
    return gauges.get(QUERIES, 0.0), gauges.get(HITS, 0.0)


async def settled_counters(
    http: aiohttp.ClientSession, replica: str, queries_at_least: float, within_s: float = 2.0
) -> tuple[float, float]:
    """``cache_counters`` once the queries counter reached ``queries_at_least``: vLLM
    updates its counters as it processes outputs, which may trail the HTTP answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        q, h = await cache_counters(http, replica)
        if q >= queries_at_least or loop.time() >= deadline:
            return q, h
        await asyncio.sleep(0.05)


async def execute_prewarm(
    http: aiohttp.ClientSession,
    payloads: Sequence[ReplayPayload],
    replicas: Sequence[str],
    *,
    budget_s: float,
    per_replica: int = 2,
    verify: int = 0,
    prefix_chars: int = DEFAULT_PREFIX_CHARS,
    on_progress: Callable[[Progress], None] | None = None,
    api_key: str | None = None,
) -> PrewarmOutcome:
    """Warm ``replicas`` with ``payloads`` (most frequent first) within ``budget_s``;
    ``api_key``: the data plane's own key for the replicas (vLLM's ``--api-key``).

    The run has a request id (the caller's, else ``prewarm-<new id>``): what it logs
    names it, and each replay sends ``<run id>-<payload index>`` as its
    ``x-request-id`` (``-verify-<index>`` for a verification), so a model server's
    logs tell pre-warm replays apart from users' requests."""
    run_id = REQUEST_ID.get() or replay_id((), "prewarm")
    ctx = contextvars.copy_context()
    ctx.run(REQUEST_ID.set, run_id)  # the run's own context: the caller's is unchanged
    run = _execute_prewarm(
        http,
        payloads,
        replicas,
        budget_s=budget_s,
        per_replica=per_replica,
        verify=verify,
        prefix_chars=prefix_chars,
        on_progress=on_progress,
        api_key=api_key,
        run_id=run_id,
    )
    return await asyncio.get_running_loop().create_task(run, context=ctx)


async def _execute_prewarm(
    http: aiohttp.ClientSession,
    payloads: Sequence[ReplayPayload],
    replicas: Sequence[str],
    *,
    budget_s: float,
    per_replica: int,
    verify: int,
    prefix_chars: int,
    on_progress: Callable[[Progress], None] | None,
    api_key: str | None,
    run_id: str,
) -> PrewarmOutcome:
    loop = asyncio.get_running_loop()
    run = _Run(len(payloads), loop.time(), on_progress)
    deadline = run.started + budget_s
    plan = assign(payloads, replicas, prefix_chars=prefix_chars)
    queues = {r: deque(idx) for r, idx in plan.items()}

    async def worker(replica: str) -> None:
        q = queues[replica]
        # The deadline is checked here too: aiohttp turns the budget's cancellation of a
        # request in flight into a timeout error, which must not start the next replay.
        while q and loop.time() < deadline:
            i = q.popleft()
            try:
                left = deadline - loop.time()
                tokens, _ = await replay(http, replica, payloads[i], left, api_key, f"{run_id}-{i}")
            except RuntimeError as e:
                if loop.time() >= deadline:
                    q.appendleft(i)  # cut by the budget: not warmed, not failed
                    break
                run.progress.failed += 1
                run.errors.append(str(e))
            else:
                run.progress.warmed += 1
                run.tokens += tokens
                run.sent[i] = _Sent(replica, tokens)
            run.tick(loop.time())

    if payloads and queues:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline), asyncio.TaskGroup() as tg:
                for r in queues:
                    for _ in range(max(1, per_replica)):
                        tg.create_task(worker(r))
        left = sum(len(q) for q in queues.values())
        if left:
            log.warning(
                "pre-warm budget of %.1fs spent: %d of %d prefixes not warmed",
                budget_s,
                run.progress.total - run.progress.warmed,
                run.progress.total,
            )
            run.errors.append(f"{left} not warmed before the deadline")
    elapsed = loop.time() - run.started
    run.tick(loop.time())
    verified, rate = (
        await _verify(http, payloads, run.sent, verify, api_key, run_id) if verify else (0, 0.0)
    )
    total, warmed = run.progress.total, run.progress.warmed
    detail = "; ".join(run.errors[:3]) + (
        f" (+{len(run.errors) - 3} more)" if len(run.errors) > 3 else ""
    )
    if not replicas and payloads:
        detail = "no active replica to warm"
    return PrewarmOutcome(
        total=total,
        warmed=warmed,
        failed=run.progress.failed,
        elapsed_s=elapsed,
        attainment=warmed / total if total else 1.0,
        prompt_tokens=run.tokens,
        verified=verified,
        verified_hit_rate=rate,
        replicas=len(queues),
        detail=detail[:1000],
    )


async def _verify(
    http: aiohttp.ClientSession,
    payloads: Sequence[ReplayPayload],
    sent: dict[int, _Sent],
    count: int,
    api_key: str | None = None,
    run_id: str = "prewarm",
) -> tuple[int, float]:
    """Send the ``count`` most frequent warmed payloads again; (samples, hit rate)."""
    chosen = sorted(sent)[:count]
    by_replica: dict[str, list[int]] = {}
    for i in chosen:
        by_replica.setdefault(sent[i].replica, []).append(i)
    hits = tokens = samples = 0

    async def one_replica(replica: str, idx: list[int]) -> None:
        nonlocal hits, tokens, samples
        for i in idx:
            try:
                q0, h0 = await cache_counters(http, replica)
                prompt, cached = await replay(
                    http, replica, payloads[i], 30.0, api_key, f"{run_id}-verify-{i}"
                )
                q1, h1 = await settled_counters(http, replica, q0 + prompt)
            except (RuntimeError, aiohttp.ClientError, OSError, TimeoutError) as e:
                log.info("pre-warm verification on %s skipped: %s", replica, e)
                continue
            if prompt <= 0:
                continue
            if cached is not None:  # the server's own count for this very request
                hit = cached
            elif q1 - q0 == prompt:
                hit = int(h1 - h0)
            else:
                continue  # another request ran in between: the deltas are not ours
            samples += 1
            hits += hit
            tokens += prompt

    await asyncio.gather(*(one_replica(r, idx) for r, idx in by_replica.items()))
    return samples, (hits / tokens if tokens else 0.0)
