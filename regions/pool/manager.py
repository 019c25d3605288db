"""``WarmPool``: the I/O adapter that keeps one region's replicas COLD/WARM/ACTIVE/IDLE
(and LENT: out of rotation, lent to a borrower).

It holds the replicas (with ``since`` timestamps), asks the pure planner
(:func:`regions.pool.planner.plan`) what to do and does it over vLLM's HTTP API:
``POST /sleep?level=1`` (verified with ``GET /is_sleeping``), ``POST /wake_up`` then
``POST /reset_prefix_cache`` (retried while running requests hold blocks), ``GET /health``.

API (what the region agent uses)::

    pool = WarmPool(launcher, PoolConfig(active=1, warm=2), on_change=publish)
    await pool.start()                    # launch/adopt, sleep, wake `active` of them
    urls = await pool.activate(3)         # at least 3 ACTIVE: IDLE first, then WARM
    urls = await pool.set_active(1)       # desired level; extras drain after the dwell
    await pool.set_sizes(4, 2)            # both desired levels (the leader's scaler)
    pool.set_variant("no-spec-decode")    # roll to it, one replica at a time (reconcile)
    await pool.set_loans({"l1": None})    # lend a WARM replica out of rotation (or refuse)
    pool.lent() -> dict[str, str]         # loan id -> the URL lent for it
    pool.loan_refusals() -> dict[str, str]  # loan id -> why it was refused
    pool.active() -> list[str]            # ACTIVE base URLs (what gateways route to)
    pool.warm_count() -> int              # WARM + IDLE: activatable without a launch
    pool.activation_rate() -> float | None  # replicas/s its batches of wakes achieved
    pool.snapshot() -> PoolSnapshot       # per replica url/state/since/managed, notes
    await pool.reconcile(now=None)        # probe (dead -> COLD), dwell moves, relaunch
    await pool.stop()                     # stop managed replicas; static ones untouched

``on_change(snapshot)`` is called (synchronously, keep it short) whenever the set of
ACTIVE URLs, what is lent, the loan refusals or the measured activation rate change;
``on_activation(kind, ok, seconds)`` after each wake (``"wake"``, ok or failed) and
resume (``"resume"``) of a replica, for metrics; ``on_state(before, after)``
(synchronous too) whenever a replica changes state (the pod labels on Kubernetes,
regions/kube/pod_labels.py). Each is optional: the ones absent are said once at start
(:mod:`regions.pool.hooks`).
``activate``/``set_active`` never launch (that takes minutes): a shortfall is in the
snapshot's notes and the next ``reconcile`` launches COLD slots to WARM and wakes them.
A replica is COLD after ``dead_after`` failed probes in a row.
``WarmPool`` fits ``regions.agent.service.ReplicaSet``.

Variants: a launcher that knows several (``Launcher.variants``, e.g. with and without
``--speculative-config``) launches the target's; ``set_variant`` changes it and each
``reconcile`` then rolls the pool over, one replica at a time, never with fewer ACTIVE
than the target (:func:`regions.pool.planner.plan`).

Activation rate: a plan that wakes two or more WARM replicas at once is a batch; the
replicas that reached ACTIVE over the time from its start until the last of them did is
the rate the pool achieved (:mod:`regions.pool.wake_rate`, its last batches pooled).

Loans: ``set_loans`` gives the loans wanted now (level-triggered; loan id -> the URL it
names, or None for any WARM replica). The planner picks WARM standby for each; lending
is ``/wake_up`` + ``/reset_prefix_cache`` and the replica is LENT, awake and never in
``active()``; a loan gone returns it (``/reset_prefix_cache``, then ``/sleep?level=1``:
WARM). A loan that cannot be served (or whose replica failed to wake, or died while
lent) is in ``loan_refusals()`` with the reason until it is gone from the loans.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

import aiohttp

from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.pool.sizing import BurstProfile, check_pool
from regions.pool.client import ReplicaClient, ReplicaError
from regions.pool.hooks import OnActivation, OnChange, OnState, PoolHooks
from regions.pool.launchers import Launcher, StaticEndpoints
from regions.pool.planner import Plan, plan
from regions.pool.snapshot import PoolSnapshot
from regions.pool.states import (
    Action,
    PoolConfig,
    Replica,
    ReplicaState,
    cancelled,
    died,
    dwell_for,
    refusal,
    transition,
)
from regions.pool.wake_rate import MIN_BATCH, BatchTimer, WakeRates

log = logging.getLogger("tectonic.pool")
ACTIVE, WARM, IDLE = ReplicaState.ACTIVE, ReplicaState.WARM, ReplicaState.IDLE
COLD, LENT = ReplicaState.COLD, ReplicaState.LENT
# what on_change tells: ACTIVE URLs, loan id -> URL lent, loan refusals, activation rate
_View = tuple[list[str], dict[str, str], dict[str, str], float | None]


class WarmPool:
    """One region's warm pool; see the module docstring for the API."""

    def __init__(
        self,
        launcher: Launcher,
        config: PoolConfig,
        *,
        burst: BurstProfile | None = None,
        on_change: OnChange | None = None,
        on_activation: OnActivation | None = None,
        on_state: OnState | None = None,
        clock: Clock | None = None,
        dead_after: int = 2,
        probe_timeout_s: float = 2.0,
        request_timeout_s: float = 30.0,
        reset_timeout_s: float = 5.0,
    ) -> None:
        if dead_after < 1:
            raise ValueError(f"dead_after {dead_after} < 1")
        self.launcher, self.config = launcher, config
        self._clock = clock or SystemClock()
        variant = launcher.variants[0] if launcher.variants else None  # the default kind
        self._target = config.target.model_copy(update={"variant": variant})
        self.hooks = PoolHooks.of(on_change, on_activation, on_state)
        self._dead_after = dead_after
        self._timeouts = (probe_timeout_s, request_timeout_s, reset_timeout_s)
        t = self._clock.now()
        if isinstance(launcher, StaticEndpoints):
            n = len(launcher.urls)
            if (config.size is not None and config.size != n) or n < config.active + config.warm:
                raise ValueError(
                    f"{n} static URLs do not fit size {config.size}, "
                    f"active {config.active} + warm {config.warm}"
                )
            seeds = [
                Replica(name=f"r{i}", url=u, since=t, managed=False)
                for i, u in enumerate(launcher.urls)
            ]
        else:
            seeds = [Replica(name=f"r{i}", since=t) for i in range(config.slots)]
        self._replicas = {r.name: r for r in seeds}  # insertion order = slot order
        cold_slots = config.slots - config.active - config.warm if launcher.managed else 0
        self._size = None if burst is None else check_pool(burst, config.warm, cold_slots)
        self._fails: dict[str, int] = {}
        self._last = Plan()
        self._lock = asyncio.Lock()  # one planner/actor at a time; launches run outside
        self._client: ReplicaClient | None = None
        self._closing = False
        # None until set_loans first runs: LENT replicas are then neither lent nor returned
        self._loans: dict[str, str | None] | None = None
        self._refused: dict[str, str] = {}  # loans that will not be served, and why
        self._rates = WakeRates()  # the batches of wakes: the activation rate achieved
        # launches in flight (a reconcile awaits them, minutes): a later plan's "cancel"
        # cancels one the targets no longer want
        self._launches: dict[str, asyncio.Future[None]] = {}

    # -- the API ---------------------------------------------------------------------
    async def start(self) -> None:
        """Bring the pool to its configured sizes (launches wait for ``/health``)."""
        if self._size is not None and (self._size.too_small or not self._size.feasible):
            log.warning("warm pool too small for its burst: %s", self._size.reason)
        if self.hooks.off:
            log.info("warm pool: off: %s", "; ".join(self.hooks.off))
        await self.reconcile()

    async def activate(self, count: int) -> list[str]:
        """At least ``count`` ACTIVE: resume IDLE replicas first (they are awake), then
        wake WARM ones (``/wake_up`` + ``/reset_prefix_cache``). Never drains, never
        launches (a shortfall is in the snapshot; ``reconcile`` launches). Returns the
        ACTIVE URLs."""
        return await self.set_active(max(count, self._target.active))

    async def set_active(self, count: int) -> list[str]:
        """Exactly ``count`` ACTIVE as the desired level: like :meth:`activate` when it
        is more; when less, extras are drained to IDLE once their ACTIVE dwell (the
        anti-flap rule) allows - now or on a later ``reconcile``."""
        if count < 0:
            raise ValueError(f"active count {count} < 0")
        self._target = self._target.model_copy(update={"active": count})
        async with self._lock:
            await self._apply(self._plan(self._clock.now()), None, launch=False)
        return self.active()

    async def set_sizes(
        self, active: int, warm: int, *, over_budget: bool = False
    ) -> tuple[int, int]:
        """The desired ACTIVE and WARM counts (the leader's ``scale/<unit>``), held to
        the pool's slots (ACTIVE first); level-triggered like :meth:`set_active`, and
        like it never launches (``reconcile`` launches COLD slots to WARM).
        ``over_budget``: the leader says the pool spends past its budget, so WARM beyond
        the sizes stops without its WARM dwell (``PoolTarget.over_budget``). Returns
        the counts taken."""
        if active < 0 or warm < 0:
            raise ValueError(f"sizes must be >= 0, got active {active}, warm {warm}")
        slots = len(self._replicas)
        active = min(active, slots)
        warm = min(warm, slots - active)
        self._target = self._target.model_copy(
            update={"active": active, "warm": warm, "scaled": True, "over_budget": over_budget}
        )
        async with self._lock:
            await self._apply(self._plan(self._clock.now()), None, launch=False)
        return active, warm

    @property
    def slots(self) -> int:
        """Replicas the pool holds at most (static URLs, or managed slots)."""
        return len(self._replicas)

    def set_variant(self, variant: str) -> None:
        """Launch ``variant`` from now on and roll the running replicas over to it on the
        next reconciles (the planner's roll). Level-triggered: setting the current one
        again changes nothing."""
        if variant not in self.launcher.variants:
            raise ValueError(
                f"variant {variant!r} is not one of the launcher's "
                f"{list(self.launcher.variants) or '(none)'}"
            )
        self._target = self._target.model_copy(update={"variant": variant})

    async def set_loans(self, loans: Mapping[str, str | None]) -> None:
        """The loans wanted now (loan id -> the replica URL it names, None: any WARM
        one), level-triggered: new ones are lent WARM standby (woken, never routed) or
        refused, replicas of loans gone are put back to sleep. Never launches."""
        async with self._lock:
            was = self._view()
            self._loans = dict(loans)
            self._refused = {k: why for k, why in self._refused.items() if k in loans}
            self._notify(was)
            await self._apply(self._plan(self._clock.now()), None, launch=False)

    def lent(self) -> dict[str, str]:
        """Loan id -> the URL of the replica lent for it (awake, out of rotation)."""
        return self.snapshot().lent()

    def loan_refusals(self) -> dict[str, str]:
        """Loan id -> why it is not served (only loans still wanted)."""
        return dict(self._refused)

    @property
    def variant(self) -> str | None:
        """The variant replicas should run (None: the launcher has one kind only)."""
        return self._target.variant

    def active(self) -> list[str]:
        return self.snapshot().urls(ACTIVE)

    def warm_count(self) -> int:
        """Replicas :meth:`activate` brings in without a launch: WARM and IDLE."""
        return sum(r.state in (WARM, IDLE) and not r.busy for r in self._replicas.values())

    def activation_rate(self) -> float | None:
        """Replicas per second the pool's last batches of wakes achieved (None: no
        batch of two or more measured yet)."""
        return self._rates.rate()

    def snapshot(self) -> PoolSnapshot:
        return PoolSnapshot(
            replicas=tuple(self._replicas.values()),
            target=self._target,
            shortfall=self._last.shortfall,
            notes=(*self._last.deferred, *self._last.notes),
            size=self._size,
            loan_refusals=dict(self._refused),
            activation_rate=self._rates.rate(),
        )

    async def reconcile(self, now: float | None = None) -> PoolSnapshot:
        """One level-triggered tick at ``now`` (default: the pool's clock): probe (dead
        -> COLD), apply the plan (dwell moves, wakes, launches for the targets). Launches
        run outside the lock so that ``activate`` is never stuck behind them."""
        async with self._lock:
            await self._observe(self._at(now))
            launching = await self._apply(self._plan(self._at(now)), now, launch=True)
        if launching:
            tasks = {name: asyncio.ensure_future(self._launch(name, now)) for name in launching}
            self._launches.update(tasks)
            try:
                # a launch a later plan cancels ends cancelled: its plan's doing, not an
                # error (a cancelled reconcile still cancels every launch it awaits)
                done = await asyncio.gather(*tasks.values(), return_exceptions=True)
            finally:
                for name, task in tasks.items():
                    if self._launches.get(name) is task:
                        del self._launches[name]
            for outcome in done:
                if isinstance(outcome, BaseException) and not isinstance(
                    outcome, asyncio.CancelledError
                ):
                    raise outcome
            async with self._lock:  # wake freshly launched replicas for a shortfall
                await self._apply(self._plan(self._at(now)), now, launch=False)
        return self.snapshot()

    async def stop(self) -> None:
        """Stop the managed replicas (static endpoints are left as they are)."""
        self._closing = True
        async with self._lock:
            gone = [r for r in self._replicas.values() if r.managed and r.url is not None]
            await asyncio.gather(*(self._stop_quietly(self._url(r)) for r in gone))
            for r in gone:
                self._put(died(r, self._clock.now()), "pool stopped")
        if self._client is not None:
            await self._client.session.close()

    # -- planning and acting ---------------------------------------------------------
    def _at(self, now: float | None) -> float:
        return self._clock.now() if now is None else now

    @property
    def _http(self) -> ReplicaClient:
        if self._closing:
            raise ReplicaError("the pool is stopped")
        if self._client is None:  # made here: a session needs the running loop
            p, r, z = self._timeouts
            self._client = ReplicaClient(
                aiohttp.ClientSession(), probe_timeout_s=p, request_timeout_s=r, reset_timeout_s=z
            )
        return self._client

    @staticmethod
    def _url(r: Replica) -> str:
        if r.url is None:
            raise ReplicaError(f"{r.name} has no URL")
        return r.url

    def _plan(self, now: float) -> Plan:
        loans = None
        if self._loans is not None:  # a refused loan holds nothing and is not asked again
            loans = {k: url for k, url in self._loans.items() if k not in self._refused}
        replicas = list(self._replicas.values())
        self._last = plan(replicas, self._target, now, self.config.dwell, loans)
        for why in self._last.deferred:
            log.debug("deferred: %s", why)
        return self._last

    async def _apply(self, p: Plan, now: float | None, *, launch: bool) -> list[str]:
        """Do the plan's quick actions (wakes first: capacity before anything else);
        mark launches busy and return their names for the caller to run."""
        for loan, why in p.loan_refusals.items():
            self._refuse(loan, why)
        wakes = p.of("wake")
        # real elapsed time, whatever the pool's clock (as each wake's duration)
        batch = BatchTimer(time.monotonic) if len(wakes) >= MIN_BATCH else None
        await asyncio.gather(
            *(self._wake_one(a, now, batch) for a in wakes),
            *(self._lend_one(a, now) for a in p.of("lend")),
        )
        if batch is not None:
            self._batch_done(batch)
        for a in p.of("resume", "drain"):  # routing only: nothing to tell the replica
            if not self._allowed(a, now):
                continue
            self._move(a, self._at(now))
            if a.kind == "resume":
                self.hooks.activated("resume", True, 0.0)
        for a in p.of("sleep", "stop", "return"):
            r = self._replicas[a.replica]
            if not self._allowed(a, now):  # before the replica is told anything
                continue
            try:
                if a.kind == "sleep":
                    await self._http.sleep(self._url(r))
                elif a.kind == "return":
                    await self._return_one(self._url(r))
                else:
                    await self.launcher.stop(self._url(r))
            except ReplicaError as e:
                log.warning("%s of %s %s failed: %s", a.kind, r.name, r.url, e)
                continue
            self._move(a, self._at(now))
        for a in p.of("cancel"):
            task = self._launches.get(a.replica)
            if task is not None and not task.done():
                log.info("cancelling the launch of %s: %s", a.replica, a.reason)
                del self._launches[a.replica]  # cancelled once, whatever later plans say
                task.cancel()
        names = [a.replica for a in p.of("launch")] if launch and not self._closing else []
        for name in names:
            r = self._replicas[name]
            # A managed slot is launched as the variant wanted now; a static endpoint is
            # whatever it is. ``since``: when the launch began (the newest go first when
            # launches are cancelled).
            variant = self._target.variant if r.managed else r.variant
            update = {"busy": True, "variant": variant, "since": self._at(now)}
            self._replicas[name] = r.model_copy(update=update)
        return names

    def _allowed(self, a: Action, now: float | None) -> bool:
        """Whether the pool's own rules allow the planned move now. The planner plans with
        the same rules, so a refusal is a defect: said and skipped (the next reconcile
        plans again), never an exception that would stop the agent with its pool."""
        r = self._replicas[a.replica]
        dwell = dwell_for(self.config.dwell, self._target)
        why = refusal(r, a.to, self._at(now), dwell, retiring=a.retire)
        if why is not None:
            log.error("planned %s of %s refused, skipped: %s", a.kind, r.name, why)
        return why is None

    def _move(self, a: Action, t: float, url: str | None = None) -> None:
        r = transition(
            self._replicas[a.replica],
            a.to,
            t,
            dwell_for(self.config.dwell, self._target),
            url,
            retiring=a.retire,
            loan=a.loan,
        )
        self._put(r, a.reason)

    def _view(self) -> _View:
        """What ``on_change`` tells: the ACTIVE URLs, what is lent, the loan refusals,
        the activation rate measured."""
        return self.active(), self.lent(), dict(self._refused), self._rates.rate()

    def _notify(self, was: _View) -> None:
        if self._view() != was:
            self.hooks.changed(self.snapshot())

    def _batch_done(self, timer: BatchTimer) -> None:
        """A batch of wakes ended: keep its rate when it measures one (two or more
        reached ACTIVE) and tell the owner the pool's rate moved."""
        batch = timer.done()
        if batch is None:
            return
        was = self._view()
        self._rates.record(batch)
        log.info(
            "woke %d replicas in %.2f s (%.2f replicas/s); activation rate over the last "
            "%d batch(es): %.2f replicas/s",
            batch.woken,
            batch.seconds,
            batch.rate,
            len(self._rates),
            self._rates.rate() or 0.0,
        )
        self._notify(was)

    def _refuse(self, loan: str | None, why: str) -> None:
        """Loan ``loan`` will not be served (or no longer is): say why until it is gone."""
        if loan is None or self._loans is None or loan not in self._loans:
            return
        if loan in self._refused:
            return
        was = self._view()
        self._refused[loan] = why
        log.warning("loan %s refused: %s", loan, why)
        self._notify(was)

    def _put(self, r: Replica, why: str) -> None:
        before, was = self._replicas[r.name], self._view()
        self._replicas[r.name] = r
        if before.state is not r.state:
            kind = f" [{r.variant or before.variant}]" if self._target.variant else ""
            log.info(
                "replica %s %s%s: %s -> %s (%s)",
                r.name,
                r.url or before.url,
                kind,
                before.state,
                r.state,
                why,
            )
            self.hooks.state_changed(before, r)
        if before.state is LENT and r.state is COLD:  # the borrower's replica is gone
            self._refuse(before.loan, f"{before.url} ({r.name}) went COLD while lent: {why}")
        self._notify(was)

    async def _wake_one(self, a: Action, now: float | None, batch: BatchTimer | None) -> None:
        r = self._replicas[a.replica]
        started = time.monotonic()  # real elapsed time, whatever the pool's clock
        try:
            await self._http.wake(self._url(r))
        except ReplicaError as e:
            log.warning("waking %s %s failed: %s", r.name, r.url, e)
            self.hooks.activated("wake", False, time.monotonic() - started)
            with contextlib.suppress(ReplicaError):
                await self._http.sleep(self._url(r))  # back to the state we record
            return
        self._move(a, self._at(now))
        if batch is not None:
            batch.woke()
        self.hooks.activated("wake", True, time.monotonic() - started)

    async def _lend_one(self, a: Action, now: float | None) -> None:
        """WARM -> LENT: woken like an activation (its prefix cache reset), not routed."""
        r = self._replicas[a.replica]
        try:
            await self._http.wake(self._url(r))
        except ReplicaError as e:
            with contextlib.suppress(ReplicaError):
                await self._http.sleep(self._url(r))  # back to the state we record
            self._refuse(a.loan, f"waking {r.url} ({r.name}) to lend it failed: {e}")
            return
        self._move(a, self._at(now))

    async def _return_one(self, url: str) -> None:
        """LENT -> WARM: the borrower's prefixes reset, then asleep. The reset is
        ``wake`` (``/wake_up`` is a no-op on an awake replica; then
        ``/reset_prefix_cache``, retried while requests hold blocks); it may fail while
        a dead borrower's requests still run, and the sleep, which aborts them, is what
        the return needs."""
        try:
            await self._http.wake(url)
        except ReplicaError as e:
            log.warning("resetting the prefix cache of %s before its return failed: %s", url, e)
        await self._http.sleep(url)

    async def _launch(self, name: str, now: float | None) -> None:
        """COLD -> WARM: launch (managed) or find reachable (static), then sleep."""
        r = self._replicas[name]
        url, started = r.url, False
        try:
            if r.managed:
                url = await (
                    self.launcher.launch() if r.variant is None else self.launcher.launch(r.variant)
                )
                started = True
            elif url is None or not await self._http.healthy(url):
                return  # a static endpoint still unreachable: COLD, re-probed next tick
            elif self._adopt_serving(r, url, await self._http.is_sleeping(url), now):
                return
            await self._http.sleep(url)
            if self._closing:
                raise ReplicaError("the pool is stopping")
        except asyncio.CancelledError:
            # the targets no longer want it, or the pool is stopping: a launcher stops
            # what it began when cancelled; a replica it handed over is stopped here
            log.info("launch of %s cancelled", name)
            if started and url is not None:
                await self._stop_quietly(url)
            if r.managed:
                self._replicas[name] = cancelled(self._replicas[name])
            raise
        except Exception as e:  # launcher errors vary (OSError, RuntimeError, ...): logged
            log.warning("bringing up %s failed: %s", name, e)
            if r.managed:
                if url is not None:
                    await self._stop_quietly(url)
                self._replicas[name] = self._replicas[name].model_copy(update={"variant": None})
            return
        finally:
            self._replicas[name] = self._replicas[name].model_copy(update={"busy": False})
        self._move(
            Action(kind="launch", replica=name, to=WARM, reason="up and asleep"), self._at(now), url
        )

    def _adopt_serving(self, r: Replica, url: str, sleeping: bool, now: float | None) -> bool:
        """A static endpoint found awake while the pool is short of ACTIVE ones (an agent
        restart, or replicas that served before the pool managed them) is taken as it
        is: it is loaded and may be serving traffic with a warm cache, so putting it to
        sleep and waking it would cut that traffic and empty the cache for nothing. This
        is an observation, not the COLD -> ACTIVE edge (which would route to a replica
        never woken)."""
        if sleeping or len(self.active()) >= self._target.active:
            return False
        self._put(
            r.model_copy(update={"state": ACTIVE, "since": self._at(now), "url": url}),
            "static endpoint found awake and serving: adopted as it is",
        )
        return True

    async def _observe(self, t: float) -> None:
        """Probe every replica that should be up: dead -> COLD (a managed one is reaped,
        and the plan relaunches its slot when the targets need it); a replica awake or
        asleep against its recorded state is put right."""
        rs = [
            r
            for r in self._replicas.values()
            if not r.busy and r.url is not None and r.state is not ReplicaState.COLD
        ]
        probes = await asyncio.gather(*(self._http.probe(self._url(r)) for r in rs))
        for r, sleeping in zip(rs, probes, strict=True):
            if sleeping is None:
                self._fails[r.name] = self._fails.get(r.name, 0) + 1
                if self._fails[r.name] >= self._dead_after:
                    self._fails[r.name] = 0
                    if r.managed:
                        await self._stop_quietly(self._url(r))  # reap a hung process
                    self._put(died(r, t), f"{self._dead_after} failed probe(s)")
                continue
            self._fails[r.name] = 0
            try:
                if r.state is WARM and not sleeping:
                    log.warning("%s %s is WARM but awake: sleeping it", r.name, r.url)
                    await self._http.sleep(self._url(r))
                elif r.state in (ACTIVE, IDLE, LENT) and sleeping:
                    log.warning("%s %s is %s but asleep: waking it", r.name, r.url, r.state)
                    await self._http.wake(self._url(r))
            except ReplicaError as e:
                log.warning("correcting %s failed: %s", r.name, e)

    async def _stop_quietly(self, url: str) -> None:
        try:
            await self.launcher.stop(url)
        except Exception as e:  # reaping is best effort; the slot is COLD either way
            log.warning("stopping %s failed: %s", url, e)
