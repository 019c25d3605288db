"""The region agent's side of the scaler: ``scale/<unit>`` -> the warm pool's sizes.

The leader's scaler (docs/scaling.md) writes a pool's desired ACTIVE and WARM counts
in ``scale/<unit>``. The agent keeps a local copy of that one key
(:class:`controlplane.kernel.watched.WatchedPrefix` over the exact key: one read, then
one watch) and hands the counts to the pool (:meth:`regions.pool.manager.WarmPool.set_sizes`)
on every change and every ``interval_s``: level-triggered, so a pool restarted, or a
replica that died and came back, converges on what the leader wants. The pool's own
rules still hold: an ACTIVE replica drains only after its dwell, through IDLE; while
the record's budget note says the pool is over its budget (``budget.over``), WARM
beyond the sizes stops without its WARM dwell.

No record (scaling is off, or the leader has not sized this pool yet): the pool file's
sizes stand. Fail-static: while etcd is away the copy keeps its last record.
``advisory``: the record is read and said, never applied (an HPA or KEDA scales the
workload from what the control plane publishes).
"""

from __future__ import annotations

import asyncio
import logging

from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.store.port import Store
from controlplane.kernel.watched import WatchedPrefix
from regions.pool.manager import WarmPool

log = logging.getLogger("tectonic.agent.scale")
_THE_KEY = ""  # WatchedPrefix's name for the exact key it was given as its prefix


class ScaleFollower:
    """Follows ``scale/<unit>`` with the pool's sizes; ``run`` as a supervised task."""

    def __init__(
        self,
        unit: str,
        pool: WarmPool,
        store: Store,
        keys: Keys,
        *,
        interval_s: float,
        advisory: bool = False,
        retry_s: float = 0.2,
        max_retry_s: float = 2.0,
        resync_s: float = 30.0,
    ) -> None:
        self.unit, self.pool, self.interval_s, self.advisory = unit, pool, interval_s, advisory
        self._record = WatchedPrefix(
            store,
            keys,
            keys.scale(unit),
            ScaleRecord,
            self._changed,
            log=log,
            what="scale record",
            retry_s=retry_s,
            max_retry_s=max_retry_s,
            resync_s=resync_s,
        )
        self._wake = asyncio.Event()
        self.applied: tuple[int, int] | None = None  # (ACTIVE, WARM) last handed over

    @property
    def record(self) -> ScaleRecord | None:
        """The leader's record for this pool as read (``scale/<unit>`` exactly: a
        longer key under the same prefix is another unit's)."""
        return self._record.values.get(_THE_KEY)

    def signals(self) -> dict[str, float]:
        """``scale_desired_active``/``_warm``: what the leader wants (absent: no record)."""
        r = self.record
        if r is None:
            return {}
        return {"scale_desired_active": float(r.active), "scale_desired_warm": float(r.warm)}

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._record.run(), name=f"scale-watch:{self.unit}")
            tg.create_task(self._loop(), name=f"scale:{self.unit}")

    async def step(self) -> None:
        """Hand the record as read now to the pool (nothing without one, or advisory)."""
        r = self.record
        if r is None or self.advisory:
            return
        # over its budget (the leader's note): WARM beyond the sizes stops without its dwell
        over = r.budget is not None and r.budget.over
        taken = await self.pool.set_sizes(r.active, r.warm, over_budget=over)
        if taken != self.applied:
            clipped = taken != (r.active, r.warm)
            log.info(
                "%s: sized by the leader to %d ACTIVE + %d WARM%s (%s)",
                self.unit,
                *taken,
                f"; it asked {r.active} + {r.warm}, the pool holds {self.pool.slots}"
                if clipped
                else "",
                r.reasons[0] if r.reasons else "no reason given",
            )
        self.applied = taken

    async def _loop(self) -> None:
        await self._record.loaded.wait()  # until then the record is unknown: nothing moves
        while True:
            self._wake.clear()
            await self.step()
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _changed(self, key: str, record: ScaleRecord | None) -> None:
        if key != _THE_KEY:
            return
        if record is None:
            log.info("%s: scale record gone: the pool keeps its sizes", self.unit)
        elif self.advisory:
            log.info(
                "%s: the leader wants %d ACTIVE + %d WARM; advisory: not applied",
                self.unit,
                record.active,
                record.warm,
            )
        self._wake.set()  # act now, not at the next tick
