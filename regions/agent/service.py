"""The agent's ``tectonic.v1.RegionAgent`` gRPC service: Describe and Prewarm.

The control plane's leader calls it on a failover target (``controlplane.agent_prewarm``):
``Describe`` for the limits it chooses prefixes by (block size, KV capacity, prefill
rate), then ``Prewarm`` with the chosen replay payloads. Pre-warms are keyed by the
failover: a new leader that repeats the call for the same failover joins the running
pre-warm (or gets the finished one's result) instead of replaying everything again.

Replicas come from a :class:`ReplicaSet`: the warm pool (``regions.pool``) when the
agent manages one, else :class:`StaticReplicas` (all configured replicas are active and
serving; they are never reset, since live traffic holds their caches).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import aiohttp
import grpc
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from tectonic_api.v1 import agent_pb2 as apb
from tectonic_api.v1 import agent_pb2_grpc as apb_grpc

from controlplane.kernel.prefix.prewarm import ReplayPayload, SkipReason
from controlplane.kernel.prefix.sealing import Keyring, KeyringError, open_payloads
from regions.agent.prewarm_executor import PrewarmOutcome, Progress, execute_prewarm
from regions.dataplane.ring import DEFAULT_PREFIX_CHARS

log = logging.getLogger("tectonic.agent")
MAX_PAYLOADS = 10_000
MAX_ID = 256


class ReplicaSet(Protocol):
    def active(self) -> list[str]:
        """Base URLs gateways route to now."""
        ...

    def warm_count(self) -> int:
        """Replicas asleep and ready to wake."""
        ...

    async def activate(self, count: int) -> list[str]:
        """Wake replicas until ``count`` are active (``/wake_up`` then
        ``/reset_prefix_cache``); the active URLs after."""
        ...


class StaticReplicas:
    """Replicas managed elsewhere and always serving: nothing to wake."""

    def __init__(self, replicas: Sequence[str]) -> None:
        self._replicas = list(replicas)

    def active(self) -> list[str]:
        return list(self._replicas)

    def warm_count(self) -> int:
        return 0

    async def activate(self, count: int) -> list[str]:
        return list(self._replicas)


class PrewarmObserver(Protocol):
    """Told of each pre-warm run (the agent's metrics)."""

    def prewarm_started(self) -> None: ...
    def prewarm_done(self, outcome: PrewarmOutcome, *, crashed: bool = False) -> None: ...


class PrewarmServiceConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Per replica, tokens/s; set it from a measurement of your model and hardware (the
    # leader sizes the choice with it; the budget itself is enforced by the clock).
    prefill_tokens_per_s: float = Field(10_000.0, gt=0)
    per_replica_concurrency: int = Field(2, ge=1, le=64)
    max_budget_s: float = Field(600.0, gt=0)
    keep_results: int = Field(32, ge=1)  # finished pre-warms remembered for re-joins
    # The data plane's own key for the replicas (vLLM's --api-key), sent with every
    # replay as Authorization: Bearer; None: replays carry no Authorization.
    replay_api_key: SecretStr | None = None
    # this zone's payload keys (--payload-keys, docs/residency.md); None: a sealed
    # payload is skipped and counted as no_key
    payload_keys: str | None = None


def _with_unopened(
    outcome: PrewarmOutcome, total: int, unopened: Counter[SkipReason], why: Sequence[str]
) -> PrewarmOutcome:
    """``outcome`` over every payload asked for, those not opened counted as not warmed
    and said why."""
    if not unopened:
        return outcome
    detail = "; ".join([*why, outcome.detail] if outcome.detail else why)
    return outcome.model_copy(
        update={
            "total": total,
            "attainment": outcome.warmed / total if total else 1.0,
            "no_key": unopened[SkipReason.NO_KEY],
            "unreadable": unopened[SkipReason.UNREADABLE],
            "detail": detail[:1000],
        }
    )


class _Prewarm:
    """One pre-warm in flight or finished; watchers wait on ``changed``."""

    def __init__(self, total: int) -> None:
        self.progress = Progress(total)
        self.outcome: PrewarmOutcome | None = None
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def update(self, p: Progress) -> None:
        self.progress = Progress(p.total, p.warmed, p.failed, p.elapsed_s)
        self.changed.set()


def _progress_pb(p: Progress, outcome: PrewarmOutcome | None) -> apb.PrewarmProgress:
    if outcome is None:
        return apb.PrewarmProgress(
            total=p.total, warmed=p.warmed, failed=p.failed, elapsed_s=p.elapsed_s
        )
    o = outcome
    return apb.PrewarmProgress(
        total=o.total,
        warmed=o.warmed,
        failed=o.failed,
        elapsed_s=o.elapsed_s,
        done=True,
        attainment=o.attainment,
        verified=o.verified,
        verified_hit_rate=o.verified_hit_rate,
        prompt_tokens=o.prompt_tokens,
        replicas_active=o.replicas,
        detail=o.detail,
        no_key=o.no_key,
        unreadable=o.unreadable,
    )


def cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (block_size, num_gpu_blocks...)."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "vllm:cache_config_info":
            for s in family.samples:
                return dict(s.labels)
    return {}


class RegionAgentService(apb_grpc.RegionAgentServicer):
    def __init__(
        self,
        region: str,
        replicas: ReplicaSet,
        http: aiohttp.ClientSession,
        config: PrewarmServiceConfig | None = None,
        observer: PrewarmObserver | None = None,
    ) -> None:
        self.region = region
        self.replicas = replicas
        self.http = http
        self.config = config or PrewarmServiceConfig()
        self.observer = observer
        self._runs: OrderedDict[str, _Prewarm] = OrderedDict()

    async def Describe(
        self, request: apb.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> apb.AgentDescription:
        active = self.replicas.active()
        block_size, blocks = 0, 0
        for url in active:
            try:
                async with self.http.get(
                    url.rstrip("/") + "/metrics", timeout=aiohttp.ClientTimeout(total=2)
                ) as r:
                    info = cache_config(await r.text()) if r.status == 200 else {}
            except (aiohttp.ClientError, OSError, TimeoutError):
                continue
            if info.get("block_size", "").isdigit():
                block_size = block_size or int(info["block_size"])
            if info.get("num_gpu_blocks", "").isdigit():
                blocks += int(info["num_gpu_blocks"])
        return apb.AgentDescription(
            region=self.region,
            block_size=block_size,
            kv_capacity_blocks=blocks,
            prefill_tokens_per_s=self.config.prefill_tokens_per_s * len(active),
            replicas_active=len(active),
            replicas_warm=self.replicas.warm_count(),
        )

    async def Prewarm(
        self, request: apb.PrewarmRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[apb.PrewarmProgress]:
        payloads = await self._validate(request, context)
        run = self._runs.get(request.failover_id)
        if run is None:
            run = self._start(request, payloads)
        else:
            log.info(
                "pre-warm for %s already %s; joining it",
                request.failover_id,
                "done" if run.outcome else "running",
            )
        while True:
            run.changed.clear()
            if run.outcome is not None:
                yield _progress_pb(run.progress, run.outcome)
                return
            yield _progress_pb(run.progress, None)
            # at most ~4 progress messages a second, however fast replays finish
            await asyncio.gather(run.changed.wait(), asyncio.sleep(0.25))

    async def _validate(
        self, request: apb.PrewarmRequest, context: grpc.aio.ServicerContext
    ) -> list[ReplayPayload]:
        problems = []
        if not request.failover_id or len(request.failover_id) > MAX_ID:
            problems.append(f"failover_id must be 1-{MAX_ID} characters")
        if not 0 < request.budget_s <= self.config.max_budget_s:
            problems.append(f"budget_s must be in (0, {self.config.max_budget_s:g}]")
        if len(request.payloads) > MAX_PAYLOADS:
            problems.append(f"at most {MAX_PAYLOADS} payloads, got {len(request.payloads)}")
        payloads: list[ReplayPayload] = []
        for i, raw in enumerate(request.payloads):
            try:
                payloads.append(ReplayPayload.model_validate_json(raw))
            except ValidationError as e:
                problems.append(f"payloads[{i}]: {e.errors()[0]['msg']}")
                break
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        return payloads

    def _start(self, request: apb.PrewarmRequest, payloads: list[ReplayPayload]) -> _Prewarm:
        run = _Prewarm(len(payloads))
        self._runs[request.failover_id] = run
        while len(self._runs) > self.config.keep_results:
            oldest = next(iter(self._runs))
            if self._runs[oldest].outcome is None:
                break  # never forget a running one
            del self._runs[oldest]
        run.task = asyncio.create_task(
            self._execute(request, payloads, run), name=f"prewarm:{request.failover_id}"
        )
        return run

    async def _execute(
        self, request: apb.PrewarmRequest, payloads: list[ReplayPayload], run: _Prewarm
    ) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        log.warning(
            "pre-warm for %s (traffic of %s): %d prefixes, budget %.1fs",
            request.failover_id,
            request.source or "?",
            len(payloads),
            request.budget_s,
        )
        if self.observer is not None:
            self.observer.prewarm_started()
        crashed = False
        try:
            if request.activate:
                await self.replicas.activate(request.activate)
            replicas = self.replicas.active()
            opened, unopened, why = open_payloads(payloads, self._keyring())
            if unopened:
                log.error(
                    "pre-warm for %s: %d of %d sealed payloads not opened, skipped: %s",
                    request.failover_id,
                    sum(unopened.values()),
                    len(payloads),
                    "; ".join(why),
                )
            left = request.budget_s - (loop.time() - started)
            outcome = await execute_prewarm(
                self.http,
                opened,
                replicas,
                budget_s=max(0.0, left),
                per_replica=self.config.per_replica_concurrency,
                verify=request.verify,
                prefix_chars=request.routing_chars or DEFAULT_PREFIX_CHARS,
                on_progress=run.update,
                api_key=self._replay_key(),
            )
            outcome = _with_unopened(outcome, len(payloads), unopened, why).model_copy(
                update={"elapsed_s": loop.time() - started}
            )
        except Exception as e:  # the caller gets the reason, the agent keeps serving
            log.exception("pre-warm for %s failed", request.failover_id)
            crashed = True
            outcome = PrewarmOutcome(
                total=len(payloads),
                warmed=0,
                failed=len(payloads),
                elapsed_s=loop.time() - started,
                attainment=0.0,
                prompt_tokens=0,
                detail=f"pre-warm failed: {e}"[:1000],
            )
        run.outcome = outcome
        run.changed.set()
        if self.observer is not None:
            self.observer.prewarm_done(outcome, crashed=crashed)
        log.warning(
            "pre-warm for %s done: %d/%d warmed in %.1fs (%.0f%%), %d failed; "
            "verified hit rate %.2f over %d prefixes%s",
            request.failover_id,
            outcome.warmed,
            outcome.total,
            outcome.elapsed_s,
            100 * outcome.attainment,
            outcome.failed,
            outcome.verified_hit_rate,
            outcome.verified,
            f"; {outcome.detail}" if outcome.detail else "",
        )

    def _keyring(self) -> Keyring | None:
        """This zone's keys, read again for every pre-warm (a rotated Secret takes
        effect without a restart); None, logged, when there are none or they fail."""
        where = self.config.payload_keys
        if where is None:
            return None
        try:
            return Keyring.load(where)
        except (OSError, KeyringError) as e:
            log.error("payload keys unreadable, sealed payloads will be skipped: %s", e)
            return None

    def _replay_key(self) -> str | None:
        key = self.config.replay_api_key
        return key.get_secret_value() if key is not None else None

    async def stop(self) -> None:
        tasks = [r.task for r in self._runs.values() if r.task is not None and not r.task.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
