"""The leader's one way to write: every transaction carries leadership's compares.

The election's fence (``LeaderElection.fence``: the leader key still holds this replica's
id and was created by its campaign) goes into each transaction, so a replica that lost
the lease, or was paused past it, changes nothing. The tick's writes (the orchestrator),
the catalogs (the prefix aggregator) and the agents' check (its reports) all write
through one ``FencedWriter``; ``tests/unit/test_every_leader_write_fenced.py`` records a
leader's writes and finds none without the fence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from controlplane.kernel.store.port import MAX_TXN_OPS, Compare, Op, Put, Store, TxnResult

Fence = Callable[[], Sequence[Compare]]


class FencedWriter:
    def __init__(self, store: Store, fence: Fence) -> None:
        self.store, self.fence = store, fence

    async def txn(self, ops: Sequence[Op], compares: Sequence[Compare] = ()) -> TxnResult:
        """``ops`` if this replica still leads and ``compares`` hold; raises NotLeader
        when it knows it does not lead (the fence's own check) and StoreError."""
        return await self.store.txn([*self.fence(), *compares], ops)

    async def put_all(self, puts: Sequence[Put]) -> None:
        """Independent puts (latest wins: health, reports), as few fenced transactions
        as etcd's limit on operations per transaction allows, all at once (one round
        trip, not one per 128 puts); the first failure is raised once all have ended."""
        chunks = [puts[i : i + MAX_TXN_OPS] for i in range(0, len(puts), MAX_TXN_OPS)]
        done = await asyncio.gather(*(self.txn(c) for c in chunks), return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome
