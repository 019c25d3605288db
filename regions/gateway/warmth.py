"""Warm first: a region that comes back after a failover is warmed by its gateways.

A region that failed over comes back with restarted, empty prefix caches, and the
control plane's recovery pre-warm replays only its catalog (prompts K sessions sent,
within the catalog's size caps: the head of a long tail). Each first request of any
other prompt would pay a whole prefill, and a recovery's first-token p99 is made of
those. Two things, both in the gateway, which saw every prompt it sent:

* **recall**: the gateway keeps, per region, the prompts that region answered
  (``PromptMemory``); when the region serves again it replays them there with
  ``max_tokens: 1``, most asked first (``WarmUps``);
* **warm-first placement**: while ``routing/<home>`` splits new sessions (graduated
  recovery), a new session whose weighted pick is home but whose prompt home has not
  answered since it came back (``RegionWarmth``) goes to the other targets, which
  carried home's traffic during the failover (``controlplane.kernel.sessions.resolve.
  warm_first``), and the gateway replays that prompt at home; its next new sessions
  follow the weights. A prompt the gateway never had answered is not steered: it is
  cold everywhere.

Replays run one at a time per region, on the prompt's first two replicas in ring
order. Nothing moves: only a new session's first placement changes, pinned as any
other. The replays are prompts the region itself answered: nothing leaves the region
(the K-sessions rule of docs/architecture.md §4 is about prompts that do).

Replays carry no user credentials: the headers kept for one, in ``PromptMemory`` or a
queued steered warm-up, are stripped of ``Authorization``, ``Cookie``... and the names
in ``strip_headers`` (``regions.dataplane.replay_headers``), and a replay sends the data
plane's own ``Authorization: Bearer <api_key>`` (vLLM's ``--api-key``) when a key is set.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping

from prometheus_client import Counter

from controlplane.kernel.logs import REQUEST_ID
from controlplane.kernel.model import Routing
from controlplane.kernel.sessions.resolve import self_routed
from regions.dataplane.replay_headers import replay_headers, replay_id, strip_names
from regions.dataplane.replicas import ReplicaBalancer
from regions.gateway.metrics import GatewayMetrics, start_at_zero
from regions.gateway.prompt_memory import PromptMemory
from regions.gateway.upstream import UpstreamError, UpstreamPool

log = logging.getLogger("tectonic.gateway.warmth")
DEFAULT_MAX_KEYS = 16_384  # per region: 8 bytes of key each, a few hundred KiB in all


class RegionWarmth:
    """Per region, the prefix keys answered there since it last stopped serving.
    Bounded per region; the oldest key goes first (one it still serves is re-added by
    its next answer)."""

    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, got {max_keys}")
        self.max_keys = max_keys
        self._keys: dict[str, dict[int, None]] = {}
        self._forgotten: dict[str, int] = {}  # region -> times it was forgotten
        self._down: set[str] = set()  # regions not serving now
        # each region's routing when last seen, and the mapping it was seen in: a call
        # looks again only at those that changed. The routing cache calls once per
        # changed region, with one read-only mapping per change of the whole copy: a
        # 512-region start-up made 512 calls with the same mapping, and looking at every
        # region each time made it 262,144 looks.
        self._seen: dict[str, Routing] = {}
        self._seen_in: Mapping[str, Routing] | None = None

    def generation(self, region: str) -> int:
        """Changes whenever ``region`` is forgotten: an answer to a request sent before
        that says nothing about the caches the region comes back with."""
        return self._forgotten.get(region, 0)

    def served(self, region: str, key: int, generation: int | None = None) -> None:
        """``region`` answered a request for ``key`` sent at ``generation`` (None: now)."""
        if generation is not None and generation != self.generation(region):
            return
        keys = self._keys.get(region)
        if keys is None:
            keys = self._keys[region] = {}
        elif key in keys:
            return
        keys[key] = None
        if len(keys) > self.max_keys:
            del keys[next(iter(keys))]

    def is_warm(self, region: str, key: int) -> bool:
        keys = self._keys.get(region)
        return keys is not None and key in keys

    def count(self, region: str) -> int:
        return len(self._keys.get(region, ()))

    def routing_changed(self, routings: Mapping[str, Routing]) -> set[str]:
        """A region that stopped serving may come back with restarted, empty caches:
        forget what it held, once per outage (a new generation). Returns the regions
        whose routing changed since the last call (a region without one serves).
        ``routings``: a new mapping for each change (the same one again: no change)."""
        if routings is self._seen_in:
            return set()
        self._seen_in = routings
        seen = self._seen
        changed = {r for r, routing in routings.items() if seen.get(r) is not routing}
        changed |= seen.keys() - routings.keys()  # deleted: serves itself again
        self._seen = dict(routings)
        for region in changed:
            if self_routed(routings, region):
                self._down.discard(region)
            elif region not in self._down:
                self._down.add(region)
                self._forgotten[region] = self.generation(region) + 1
                n = len(self._keys.pop(region, ()))
                log.info("region %s stopped serving: forgetting its %d warm prefixes", region, n)
        return changed


def warmup_body(body: bytes) -> bytes | None:
    """``body`` as a one-token, non-streaming request: the same prompt, so the same
    cache blocks. None when it is not a JSON object (the gateway parsed it already)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    for field in ("stream", "stream_options", "max_completion_tokens", "n", "best_of"):
        data.pop(field, None)
    data["max_tokens"] = 1
    return json.dumps(data).encode()


# Every (way, outcome) of tectonic_gateway_warmups_total.
WARMUP_OUTCOMES = (
    ("steered", "ok"),
    ("steered", "failed"),
    ("steered", "dropped"),
    ("recall", "ok"),
    ("recall", "failed"),
)


class WarmUps:
    """Replays prompts in a region where they are cold, in the background, two ways:

    * *steered*: the prompt of a new session that warm first placed elsewhere (``want``);
      at most ``max_queued`` waiting in all, one per (region, key);
    * *recall*: when a region serves again after it stopped, the prompts it answered
      before (``PromptMemory``), most answered first, up to ``recall_limit``; stopped if
      the region stops serving again.

    Both ways share one gate per region: at most ``concurrency`` replays at a time (the
    region is recovering; its capacity goes to users first; the gate is first come,
    first served, so a steered prompt waits for at most the recalls already running),
    each on the prompt's first ``replicas`` replicas in ring order.

    ``strip_headers``: header names a replay never carries besides the credentials (the
    topology's ``prefixes.replay_strip_headers``); ``api_key``: the data plane's own key
    for the model servers (vLLM's ``--api-key``), sent as ``Authorization: Bearer``
    with every replay; None: replays carry no ``Authorization``."""

    def __init__(
        self,
        warmth: RegionWarmth,
        pool: UpstreamPool,
        balancers: Mapping[str, ReplicaBalancer],
        metrics: GatewayMetrics,
        *,
        memory: PromptMemory | None = None,
        concurrency: int = 1,
        replicas: int = 2,
        max_queued: int = 256,
        recall_limit: int = 1024,
        monotonic: Callable[[], float] = time.monotonic,
        strip_headers: Iterable[str] = (),
        api_key: str | None = None,
    ) -> None:
        if min(concurrency, replicas, max_queued) < 1:
            raise ValueError("warm-up concurrency, replicas and queue must be at least 1")
        self.warmth = warmth
        self.strip_headers = strip_names(strip_headers)
        self.api_key = api_key or None
        self.memory = memory or PromptMemory(strip_headers=self.strip_headers)
        self._pool = pool
        self._balancers = balancers
        self._concurrency = concurrency
        self._replicas = replicas
        self._max_queued = max_queued
        self._recall_limit = recall_limit
        self._monotonic = monotonic
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._wanted: set[tuple[str, int]] = set()
        self._recalled: dict[str, int] = {}  # region -> generation last recalled
        self._tasks: set[asyncio.Task[None]] = set()
        self.steered = Counter(
            "tectonic_gateway_warm_first_steers",
            "New sessions placed on another target because their weighted choice, home, "
            "was not warm for their prompt yet (by that region)",
            ["region"],
            registry=metrics.registry,
        )
        self.warmups = Counter(
            "tectonic_gateway_warmups",
            "Background one-token replays of a prompt in a region where it was cold, by "
            "region, way (steered, recall) and outcome (ok, failed, dropped: queue full)",
            ["region", "way", "outcome"],
            registry=metrics.registry,
        )
        # At 0 from the start, so that rate() sees the first warm-ups (metrics.py).
        start_at_zero(self.steered, [(r,) for r in balancers])
        start_at_zero(self.warmups, [(r, *wo) for r in balancers for wo in WARMUP_OUTCOMES])

    @property
    def pending(self) -> int:
        return len(self._wanted)

    def want(
        self, region: str, key: int, path: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> bool:
        """Queue a warm-up of ``body``'s prompt in ``region``. False (nothing queued)
        when the queue is full; True when queued now or already."""
        if (region, key) in self._wanted:
            return True
        if len(self._wanted) >= self._max_queued:
            self.warmups.labels(region, "steered", "dropped").inc()
            return False
        self._wanted.add((region, key))
        kept = replay_headers(headers, self.strip_headers)  # no credential waits in the queue
        self._spawn(self._steered(region, key, path, kept, body), f"warm-up {region}")
        return True

    def routing_changed(self, routings: Mapping[str, Routing]) -> None:
        """Forget what regions that stopped serving held; recall, into each region that
        serves again, what it answered before."""
        # only a region whose routing changed can have come back (O(changed), not
        # O(regions), per change)
        for region in self.warmth.routing_changed(routings) & set(self.memory.regions()):
            generation = self.warmth.generation(region)
            if self_routed(routings, region) and self._recalled.get(region, 0) != generation:
                self._recalled[region] = generation
                self._spawn(self._recall(region, generation), f"recall {region}")

    def _spawn(self, coro: Coroutine[object, object, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _gate(self, region: str) -> asyncio.Semaphore:
        gate = self._gates.get(region)
        if gate is None:
            gate = self._gates[region] = asyncio.Semaphore(self._concurrency)
        return gate

    async def _steered(
        self, region: str, key: int, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> None:
        outcome = "failed"
        try:
            async with self._gate(region):
                outcome = await self._replay(region, key, path, headers, body)
        finally:
            self._wanted.discard((region, key))
            self.warmups.labels(region, "steered", outcome).inc()

    async def _recall(self, region: str, generation: int) -> None:
        chosen = self.memory.ranked(region, self._recall_limit)
        log.info(
            "region %s serves again: replaying the %d prompts it answered most", region, len(chosen)
        )
        done = 0
        gate = self._gate(region)
        pending: set[asyncio.Task[None]] = set()
        for key, prompt in chosen:
            if self.warmth.generation(region) != generation:
                log.info("region %s stopped serving again: recall stopped", region)
                break
            if self.warmth.is_warm(region, key) or (region, key) in self._wanted:
                continue
            body = warmup_body(prompt.body)
            if body is None:
                continue
            await gate.acquire()
            task = asyncio.get_running_loop().create_task(
                self._recall_one(gate, region, key, prompt.path, list(prompt.headers), body)
            )
            pending.add(task)
            task.add_done_callback(pending.discard)
            done += 1
        if pending:
            await asyncio.wait(pending)
        log.info("region %s: recall replayed %d prompts", region, done)

    async def _recall_one(
        self,
        gate: asyncio.Semaphore,
        region: str,
        key: int,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        outcome = "failed"
        try:
            outcome = await self._replay(region, key, path, headers, body)
        finally:
            gate.release()
            self.warmups.labels(region, "recall", outcome).inc()

    async def _replay(
        self, region: str, key: int, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> str:
        """On the prompt's first ``replicas`` replicas in ring order: its owner, and
        where the bounded-load ring sends it when the owner is busy."""
        balancer = self._balancers.get(region)
        targets = list(balancer.ring.walk(key))[: self._replicas] if balancer else []
        if balancer is None or not targets:
            return "failed"
        # Stripped again (memory given by a caller may keep more), then the data plane's
        # key, and an id of its own that names the replayed request's (what this task
        # logs carries it).
        rid = replay_id(headers, "warm")
        token = REQUEST_ID.set(rid)
        try:
            sent = replay_headers(headers, self.strip_headers, self.api_key, rid)
            return await self._replay_on(region, key, targets, balancer, path, sent, body)
        finally:
            REQUEST_ID.reset(token)

    async def _replay_on(
        self,
        region: str,
        key: int,
        targets: list[str],
        balancer: ReplicaBalancer,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> str:
        generation = self.warmth.generation(region)
        for replica in targets:
            balancer.acquire(replica)  # counts against the bound like a user request
            try:
                up = await self._pool.request(replica, "POST", path, headers, body)
                try:
                    await up.read()
                finally:
                    up.release()
            except UpstreamError as e:
                log.info("warm-up in %s on %s failed: %s", region, replica, e)
                return "failed"
            finally:
                balancer.release(replica)
            if up.status != 200:
                log.info("warm-up in %s on %s: HTTP %d", region, replica, up.status)
                return "failed"
        self.warmth.served(region, key, generation)
        return "ok"

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
