"""The region agent's speculative-decoding actuator: ``degradation/<region>`` -> the warm
pool's variant (degradation ladder step 1; the decisions are :mod:`regions.pool.spec_decode`).

It keeps a local copy of the ``degradation/`` prefix
(:class:`controlplane.kernel.watched.WatchedPrefix`: one read, then one watch; fail-static
while etcd is away, so a lost etcd never triggers a roll) and, level-triggered - every
``interval_s`` and whenever a record changes - sets the pool's target variant from the
region's flags. The pool's reconcile loop then rolls the replicas over, one at a time
(:func:`regions.pool.planner.plan`); this actuator logs the story from what runs and
exposes its progress as agent signals:

- ``spec_decode_wanted``: 1 while the region should run speculative decoding, else 0;
- ``spec_decode_active``: ACTIVE replicas launched with ``--speculative-config``;
- ``spec_decode_roll_left``: replicas of the unwanted variant still up (0: settled).

``prime()`` reads the record once before the pool starts, so that an agent restarted
while speculative decoding is off launches replicas without it instead of rolling them
right after.

A pool whose launcher has no ``speculative_config`` gets :class:`SpecDecodeOff` in its
place, which says once that step 1 is not acted on here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.store.port import Store, StoreError
from controlplane.kernel.watched import WatchedPrefix
from regions.pool.manager import WarmPool
from regions.pool.spec_decode import (
    SPEC_DECODE,
    RollProgress,
    active_with_spec_decode,
    progress_line,
    roll_progress,
    switch_line,
    wanted_variant,
)

log = logging.getLogger("tectonic.agent.spec_decode")


class SpecDecodeActuator:
    """Follows one region's ``speculative_decoding`` flag with its pool's variant.
    ``prime`` before the pool starts, ``run`` as a supervised task."""

    def __init__(
        self,
        region: str,
        pool: WarmPool,
        store: Store,
        keys: Keys,
        *,
        interval_s: float,
        on_switch: Callable[[], None] = lambda: None,
        retry_s: float = 0.2,
        max_retry_s: float = 2.0,
        resync_s: float = 30.0,
    ) -> None:
        if not pool.launcher.variants:
            raise ValueError("the pool's launcher has no speculative_config: nothing to switch")
        self.region, self.pool, self.interval_s = region, pool, interval_s
        self._on_switch = on_switch  # wakes the pool's reconcile loop: start rolling now
        self._records = WatchedPrefix(
            store,
            keys,
            keys.degradation_prefix(),
            DegradationRecord,
            self._changed,
            log=log,
            what="degradation",
            retry_s=retry_s,
            max_retry_s=max_retry_s,
            resync_s=resync_s,
        )
        self._wake = asyncio.Event()
        self.progress: RollProgress | None = None  # the last step's, once stepped
        self._switched_at = 0.0  # loop time of the last switch: the roll's elapsed time

    @property
    def record(self) -> DegradationRecord | None:
        return self._records.values.get(self.region)

    async def prime(self, timeout_s: float = 2.0) -> None:
        """Read the region's record once (bounded) and set the variant from it; without
        etcd the pool starts with the configured default, speculative decoding on."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._records.load()
        except (StoreError, TimeoutError) as e:
            log.warning(
                "%s: cannot read degradation/%s at start (%s); launching with "
                "speculative decoding until it can be read",
                self.region,
                self.region,
                str(e) or "timed out",
            )
        self.step()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._records.run(), name=f"degradation-watch:{self.region}")
            tg.create_task(self._loop(), name=f"spec-decode:{self.region}")

    def step(self) -> RollProgress:
        """One level-triggered tick: the wanted variant from the record, then the roll's
        progress from the pool's replicas (logged when it moved)."""
        loop_time = asyncio.get_running_loop().time()
        record, old = self.record, self.pool.variant
        wanted = wanted_variant(record)
        snap = self.pool.snapshot()
        if wanted != old:
            self.pool.set_variant(wanted)
            snap = self.pool.snapshot()
            self._switched_at = loop_time
            line = switch_line(
                self.region, record, old, wanted, roll_progress(snap.replicas, snap.target)
            )
            log.log(logging.INFO if wanted == SPEC_DECODE else logging.WARNING, "%s", line)
            self._on_switch()
        now = roll_progress(snap.replicas, snap.target)
        moved = progress_line(self.region, self.progress, now, loop_time - self._switched_at)
        if moved is not None and self.progress is not None:  # the first tick: switch_line
            waiting = [n for n in snap.notes if n.startswith(("drain:", "retire:"))]
            log.info("%s%s", moved, f"; waiting: {waiting[0]}" if waiting else "")
        self.progress = now
        return now

    def signals(self) -> dict[str, float]:
        snap = self.pool.snapshot()
        progress = self.progress or roll_progress(snap.replicas, snap.target)
        return {
            "spec_decode_wanted": float(self.pool.variant == SPEC_DECODE),
            "spec_decode_active": float(active_with_spec_decode(snap.replicas)),
            "spec_decode_roll_left": float(progress.active_other + progress.retiring),
        }

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            self.step()
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _changed(self, region: str, record: DegradationRecord | None) -> None:
        if region == self.region:
            self._wake.set()  # act on a new record now, not at the next tick


class SpecDecodeOff:
    """Stands in for :class:`SpecDecodeActuator` where the pool's launcher has no
    ``speculative_config``: every replica runs one kind, so degradation step 1 cannot
    be acted on here. Says so once, at start; adds no signals, runs nothing."""

    def __init__(self, region: str) -> None:
        self.region = region

    async def prime(self, timeout_s: float = 2.0) -> None:
        log.info(
            "%s: speculative decoding is not switched by this agent: the pool's launcher "
            "has no speculative_config (degradation step 1 is not acted on here)",
            self.region,
        )

    async def run(self) -> None:
        return  # nothing to follow

    def signals(self) -> dict[str, float]:
        return {}


SpecDecodeSwitch = SpecDecodeActuator | SpecDecodeOff
