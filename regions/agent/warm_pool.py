"""The region agent's warm pool at run time, and publishing it to ``pools/<region>``.

``tectonic-agent --pool-config pool.yaml --etcd HOST:PORT --cluster NAME`` (instead of
``--replica``) makes the agent run a :class:`~regions.pool.manager.WarmPool`: it starts
the pool before serving, probes the pool's ACTIVE replicas each tick, reconciles the
pool in a loop of its own (a launch takes minutes and must never hold up probing),
serves it as the ``ReplicaSet`` that ``RegionAgent.Prewarm`` wakes, and publishes
:class:`~controlplane.kernel.pool.members.PoolMembers` to ``pools/<region>`` so that
gateways route only to ACTIVE replicas (a WARM one sleeps and would hang requests).
The file that says what the pool runs is :mod:`regions.agent.pool_config`.

Publication is a plain put (no lease: the replicas outlive the agent), at start and
whenever the ACTIVE set, the WARM count or the loans' answers change, from a background
task that retries with backoff while etcd is unreachable.

Loans: the agent follows ``pool-loans/<region>/`` (:mod:`regions.agent.pool_lender`) and
lends WARM standby out of rotation to a borrower such as the capacity probe; what is lent
and what is refused go into ``pools/<region>`` (``lent``, ``loan_refusals``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.members import (
    ACTIVATION_SPAN_SIGNAL,
    ACTIVATION_WAKES_SIGNAL,
    PoolMembers,
)
from controlplane.kernel.pool.scale import ACTIVATION_RATE_SIGNAL, ACTIVATION_SIGNAL
from controlplane.kernel.store.etcd import EtcdStore
from controlplane.kernel.store.port import Store, StoreError
from controlplane.kernel.store.settings import EtcdConfig
from regions.agent.asleep import WAKE_GRACE_S
from regions.agent.pool_config import AgentPoolConfig
from regions.agent.pool_lender import PoolLender
from regions.agent.scale_follower import ScaleFollower
from regions.agent.spec_decode_actuator import SpecDecodeActuator, SpecDecodeOff, SpecDecodeSwitch
from regions.pool.client import ReplicaError
from regions.pool.hooks import ActivationKind, OnActivation, OnState
from regions.pool.launchers import Launcher
from regions.pool.manager import WarmPool
from regions.pool.snapshot import PoolSnapshot
from regions.pool.states import ReplicaState, dwell_for, refusal

log = logging.getLogger("tectonic.agent.pool")
WAKES_KEPT = 32  # recent wakes whose p95 the agent reports


def p95(values: Sequence[float]) -> float:
    """The 95th percentile of a few values (nearest rank: with under 20, the largest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class PoolPublishing:
    """Where the pool is published, ``pools/<region>`` of ``cluster``, and how: ``store``
    is etcd's settings (the agent's ``--etcd`` endpoints, TLS and users: the pool opens
    and closes its own client) or a store that its owner opened and closes (tests).
    ``retry_s`` up to ``max_retry_s``: the backoff while etcd is away;
    ``wall_clock``: the published members' ``at``."""

    cluster: str
    store: Store | EtcdConfig
    retry_s: float = 0.2
    max_retry_s: float = 5.0
    wall_clock: Callable[[], float] = time.time


@dataclass(frozen=True, slots=True)
class KubernetesPods:
    """A pool of kind ``kubernetes``: the agent's launcher that scales the workload (built
    by its ``--discovery kubernetes``, which finds the pods) and, with the pool file's
    ``pod_labels``, the hook that labels each pod with its state. The pods outlive the
    agent: stopping the pool leaves them running and their entry published."""

    launcher: Launcher
    on_state: OnState | None = None  # None: pod_labels false


class AgentPool:
    """One agent's warm pool and its publication. ``start`` before serving, ``run`` as a
    supervised task, ``stop`` last. ``pods``: a pool of kind kubernetes (None: the pool
    file's launcher builds the replicas); ``on_activation``: the agent's metrics of wakes
    and resumes (None: not counted; the pool says so once, at start)."""

    def __init__(
        self,
        region: str,
        config: AgentPoolConfig,
        publishing: PoolPublishing,
        *,
        interval_s: float,  # the agent's tick; the pool file's reconcile_interval_s wins
        on_activation: OnActivation | None = None,
        pods: KubernetesPods | None = None,
    ) -> None:
        self.region, self.config = region, config
        self.launcher = config.launcher.build() if pods is None else pods.launcher
        self._on_activation = on_activation
        # the last wakes' durations: their p95 is the shortest horizon the scaler may use
        # (monotonic time woken, seconds it took) of each
        self._wakes: deque[tuple[float, float]] = deque(maxlen=WAKES_KEPT)
        self._slept_at: float | None = None  # monotonic: last seen asleep on purpose
        self.outlives_agent = pods is not None  # stop() leaves the replicas running
        # the pool's clock, held here too: which WARM replicas are still in their dwell
        self._pool_clock: Clock = SystemClock()
        self.pool = WarmPool(
            self.launcher,
            config.pool_config(),
            burst=config.burst,
            on_change=self._changed,
            on_activation=self._activated,
            on_state=None if pods is None else pods.on_state,
            clock=self._pool_clock,
            dead_after=config.dead_after,
            probe_timeout_s=config.probe_timeout_s,
            request_timeout_s=config.request_timeout_s,
        )
        store = publishing.store
        self._own_store = isinstance(store, EtcdConfig)  # opened here: closed by stop()
        self.store: Store = EtcdStore(store) if isinstance(store, EtcdConfig) else store
        keys = Keys(publishing.cluster)
        self.key = keys.pool(region)
        self.agent_id = f"agent:{region}"
        self.published: PoolMembers | None = None  # the last value etcd took
        self.interval_s = config.reconcile_interval_s or interval_s
        self._retry = (publishing.retry_s, publishing.max_retry_s)
        self._wall_clock = publishing.wall_clock
        self._dirty = asyncio.Event()  # something to publish; the publisher waits on it
        self._kick = asyncio.Event()  # reconcile now (a new variant to roll to)
        # Degradation step 1 acts here, with a launcher that has a speculative_config.
        self.spec_decode: SpecDecodeSwitch = (
            SpecDecodeActuator(
                region,
                self.pool,
                self.store,
                keys,
                interval_s=self.interval_s,
                on_switch=self._kick.set,
                retry_s=publishing.retry_s,
            )
            if self.launcher.variants
            else SpecDecodeOff(region)
        )
        # The leader's scaler: scale/<unit>'s sizes, followed level-triggered.
        self.scale = ScaleFollower(
            region,
            self.pool,
            self.store,
            keys,
            interval_s=self.interval_s,
            advisory=getattr(config.launcher, "advisory", False),
            retry_s=publishing.retry_s,
        )
        # Loans of WARM standby out of rotation (the capacity probe's replica).
        self.lender = PoolLender(
            region,
            self.pool,
            self.store,
            keys,
            interval_s=self.interval_s,
            retry_s=publishing.retry_s,
        )

    # -- what the agent calls ----------------------------------------------------------
    async def start(self, agent_id: str) -> None:
        """Launch / adopt the replicas and wake ``active`` of them (before serving)."""
        self.agent_id = agent_id
        size = self.pool.snapshot().size
        if size is not None and not size.too_small and size.feasible:
            log.info("warm pool of %s sized for its burst: %s", self.region, size.reason)
        # (a pool too small for its burst is logged as a warning by WarmPool.start)
        await self.spec_decode.prime()  # launch what the ladder wants, not roll to it
        await self.pool.start()
        self._dirty.set()  # publish at start, whether or not the ACTIVE set changed
        snap = self.pool.snapshot()
        log.info(
            "warm pool of %s started: ACTIVE %s, %d WARM%s; publishing to %s",
            self.region,
            ", ".join(self.pool.active()) or "(none)",
            self.pool.warm_count(),
            "".join(f"; {n}" for n in snap.notes),
            self.key,
        )

    def active(self) -> list[str]:
        return self.pool.active()

    def signals(self) -> dict[str, float]:
        """``replicas_warm``: activatable without a launch; ``pool_shortfall``: ACTIVE
        replicas the pool wants and cannot reach yet; ``activation_p95_s`` and
        ``activation_rate``: its wakes' p95 and the rate its batches of wakes achieved,
        once measured, with how many wakes the p95 is of and how long ago the oldest
        of them was (``activation_wakes``, ``activation_span_s``: how far back it sees)."""
        signals = {
            "replicas_warm": float(self.pool.warm_count()),
            "pool_shortfall": float(self.pool.snapshot().shortfall),
        }
        if (wake_p95 := self._wake_p95()) is not None:
            signals[ACTIVATION_SIGNAL] = wake_p95
            signals[ACTIVATION_WAKES_SIGNAL] = float(len(self._wakes))
            signals[ACTIVATION_SPAN_SIGNAL] = time.monotonic() - self._wakes[0][0]
        rate = self.pool.activation_rate()
        if rate is not None:
            signals[ACTIVATION_RATE_SIGNAL] = rate
        return signals | self.spec_decode.signals() | self.scale.signals()

    def _wake_p95(self) -> float | None:
        """The last wakes' p95, seconds (None: none measured)."""
        return p95([took for _, took in self._wakes]) if self._wakes else None

    def _activated(self, kind: ActivationKind, ok: bool, seconds: float) -> None:
        if kind == "wake" and ok:
            self._wakes.append((time.monotonic(), max(0.0, seconds)))
        if self._on_activation is not None:
            self._on_activation(kind, ok, seconds)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._reconcile_loop(), name=f"pool:{self.region}")
            tg.create_task(self._publish_loop(), name=f"pool-publish:{self.region}")
            tg.create_task(self.lender.run(), name=f"pool-lender:{self.region}")
            tg.create_task(self.scale.run(), name=f"pool-scale:{self.region}")
            tg.create_task(self.spec_decode.run(), name=f"spec-decode:{self.region}")

    async def stop(self, publish_timeout_s: float = 2.0) -> None:
        """Stop the pool; managed replicas are gone after it, so publish that (bounded:
        a dead etcd must not hold up shutdown). Static ones keep their entry, and so do
        replicas that outlive the agent (a kubernetes pool's pods, left running)."""
        await self.pool.stop()
        gone = self.launcher.managed and not self.outlives_agent
        if gone and self.published is not None:
            try:
                async with asyncio.timeout(publish_timeout_s):
                    await self._publish()
            except (StoreError, TimeoutError) as e:
                log.warning("could not publish the stopped pool to %s: %s", self.key, e)
        if self._own_store:
            await self.store.close()

    # -- loops -------------------------------------------------------------------------
    def _changed(self, snapshot: PoolSnapshot) -> None:
        self._dirty.set()  # called inside the pool: only flag it, the publisher writes

    def _held(self) -> tuple[int, int, int]:
        """IDLE replicas (of the WARM count), WARM ones the pool may not stop now (in
        their WARM dwell, or static) and managed slots being launched: what the
        leader's cost guardrail prices beside ACTIVE, WARM and LENT, and cannot count
        on the pool letting go of."""
        snapshot = self.pool.snapshot()
        replicas = snapshot.replicas
        # the dwell the pool plans with for its target (a pool over its budget stops
        # WARM without the WARM dwell): what it will let go of, not the file's
        now, dwell = self._pool_clock.now(), dwell_for(self.pool.config.dwell, snapshot.target)
        idle = sum(r.state is ReplicaState.IDLE and not r.busy for r in replicas)
        kept = sum(
            r.state is ReplicaState.WARM
            and not r.busy
            and refusal(r, ReplicaState.COLD, now, dwell) is not None
            for r in replicas
        )
        launching = sum(r.busy and r.state is ReplicaState.COLD and r.managed for r in replicas)
        return idle, kept, launching

    def members(self) -> PoolMembers:
        idle, kept, launching = self._held()
        return PoolMembers(
            region=self.region,
            active=tuple(self.pool.active()),
            warm=self.pool.warm_count(),
            idle=idle,
            warm_kept=kept,
            launching=launching,
            at=self._wall_clock(),
            agent=self.agent_id,
            lent=self.pool.lent(),
            loan_refusals=self.pool.loan_refusals(),
            activation_p95_s=self._wake_p95(),
            activation_rate=self.pool.activation_rate(),
            asleep=self.asleep(),
        )

    def asleep(self) -> bool:
        """At zero on purpose (scale to zero): the leader asks 0 ACTIVE, or did and,
        woken, the pool has no ACTIVE replica yet (within the wake's grace: data planes
        keep holding requests rather than spill them while it wakes)."""
        if self.scale.advisory or self.pool.active():
            self._slept_at = None
            return False
        now = time.monotonic()
        r = self.scale.record
        if r is not None and r.asleep:
            self._slept_at = now
            return True
        return self._slept_at is not None and now - self._slept_at <= WAKE_GRACE_S

    async def _publish(self) -> None:
        members = self.members()  # the pool as it is now, not as it was when flagged
        await self.store.put(self.key, encode(members))
        if self.published is None or self.published.active != members.active:
            log.info(
                "published %s: ACTIVE %s, %d WARM",
                self.key,
                ", ".join(members.active) or "(none)",
                members.warm,
            )
        was_lent = {} if self.published is None else self.published.lent
        if was_lent != members.lent:
            log.info(
                "published %s: lent %s",
                self.key,
                ", ".join(f"{u} (loan {k})" for k, u in members.lent.items()) or "(none)",
            )
        self.published = members

    async def _publish_loop(self) -> None:
        first, most = self._retry
        delay, failing = first, False
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._publish()
            except StoreError as e:  # temporary or not, the next try may work: keep going
                if not failing:
                    log.warning(
                        "cannot publish %s (%s); retrying in the background, "
                        "gateways keep the last published members",
                        self.key,
                        e,
                    )
                failing = True
                self._dirty.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, most)
                continue
            if failing:
                log.info("publishing %s works again", self.key)
            delay, failing = first, False

    def _publish_if_moved(self) -> None:
        """Flag a publication when what is published moved without an ACTIVE change:
        launches and stops change WARM, the leader's 0 (or its wake) changes asleep, a
        launch started or a drain changes what the pool pays for."""
        if self.published is not None and (
            self.pool.warm_count() != self.published.warm
            or self.asleep() != self.published.asleep
            or self._held()
            != (self.published.idle, self.published.warm_kept, self.published.launching)
        ):
            self._dirty.set()

    async def _reconcile_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            self._kick.clear()  # a kick during this reconcile calls for the next one now
            reconcile = asyncio.ensure_future(self.pool.reconcile())
            try:
                # a reconcile waits for its launches (minutes): publish that they started
                # meanwhile, as the leader's cost guardrail prices them (core/spend.py)
                while not reconcile.done():
                    await asyncio.wait({reconcile}, timeout=max(self.interval_s, 0.1))
                    self._publish_if_moved()
                reconcile.result()
            except ReplicaError as e:  # the pool is being stopped under us
                log.warning("warm pool reconcile of %s failed: %s", self.region, e)
            finally:
                reconcile.cancel()  # only if this loop is cancelled while it runs
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, started + self.interval_s - loop.time())):
                    await self._kick.wait()
