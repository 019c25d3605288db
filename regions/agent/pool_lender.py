"""The region agent's side of pool loans: ``pool-loans/<region>/`` -> the warm pool.

A borrower (the capacity probe) writes a ``PoolLoan`` on its own lease
(:mod:`controlplane.kernel.pool.loans`). The agent keeps a local copy of its region's
loans (:class:`controlplane.kernel.watched.WatchedPrefix`: one read, then one watch) and
hands them to the pool (:meth:`regions.pool.manager.WarmPool.set_loans`) on every
change, and every ``interval_s`` (level-triggered). The pool lends WARM standby (woken,
never routed), refuses what it cannot lend, and returns the replica of a loan whose key
is gone: the borrower is done, or dead and its lease expired. ``AgentPool`` publishes
what is lent and refused in ``pools/<region>``, where the borrower reads its answer.
Loans taken together (``borrow_together``: the capacity probe's pair, on one lease) are
separate keys written in one transaction, so they reach the pool together, each lent or
refused on its own; the lease's end deletes them all, and every replica goes back.

Fail-static: while etcd is away the copy keeps its loans, so a lost etcd never takes a
replica from a borrower that is still measuring; a lease that expired meanwhile is seen
at the next read, and its replica returned then.
"""

from __future__ import annotations

import asyncio
import logging

from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.loans import PoolLoan
from controlplane.kernel.store.port import Store
from controlplane.kernel.watched import WatchedPrefix
from regions.pool.manager import WarmPool

log = logging.getLogger("tectonic.agent.loans")


class PoolLender:
    """Follows ``pool-loans/<region>/`` with the pool's loans; ``run`` as a supervised
    task."""

    def __init__(
        self,
        region: str,
        pool: WarmPool,
        store: Store,
        keys: Keys,
        *,
        interval_s: float,
        retry_s: float = 0.2,
        max_retry_s: float = 2.0,
        resync_s: float = 30.0,
    ) -> None:
        self.region, self.pool, self.interval_s = region, pool, interval_s
        self._loans = WatchedPrefix(
            store,
            keys,
            keys.pool_loans_prefix(region),
            PoolLoan,
            self._changed,  # keyed by loan id: the key's segment after the prefix
            log=log,
            what="pool loans",
            retry_s=retry_s,
            max_retry_s=max_retry_s,
            resync_s=resync_s,
        )
        self._wake = asyncio.Event()

    @property
    def loans(self) -> dict[str, PoolLoan]:
        return dict(self._loans.values)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._loans.run(), name=f"pool-loans-watch:{self.region}")
            tg.create_task(self._loop(), name=f"pool-loans:{self.region}")

    async def step(self) -> None:
        """Hand the loans as read now to the pool (it lends, refuses, returns)."""
        await self.pool.set_loans({k: loan.replica for k, loan in self._loans.values.items()})

    async def _loop(self) -> None:
        await self._loans.loaded.wait()  # until then the loans are unknown: nothing moves
        while True:
            self._wake.clear()
            await self.step()
            try:
                async with asyncio.timeout(self.interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _changed(self, loan_id: str, loan: PoolLoan | None) -> None:
        if loan is None:
            log.info("%s: loan %s ended (its key is gone)", self.region, loan_id)
        else:
            wanted = loan.replica or "any WARM replica"
            log.info(
                "%s: loan %s from %s (%s) asks for %s",
                self.region,
                loan_id,
                loan.borrower,
                loan.purpose or "no purpose given",
                wanted,
            )
        self._wake.set()  # act now, not at the next tick
