"""Concurrent unconditional puts as few etcd commits (group commit).

Every agent reports once a second through the control plane's ``ReportHealth``; at
512 regions that was 512 commits a second, each its own gRPC call, Raft round and
WAL sync, the call machinery ~15 % of the control plane's CPU (issue 35). Here a put
joins the batch being gathered while the previous one commits, and returns once its
batch has: an idle store adds no wait (the first put goes alone, at once), a busy one
writes at most ``MAX_TXN_OPS`` puts per transaction.

Only for observations, latest wins (a report): two puts of one key in a batch keep
the later value, as two commits would have; a batch's failure is every caller's.
"""

from __future__ import annotations

import asyncio

from controlplane.kernel.store.port import MAX_TXN_OPS, Put, Store, StoreUnavailable


class GroupCommit:
    def __init__(self, store: Store, *, limit: int = MAX_TXN_OPS) -> None:
        if not 1 <= limit <= MAX_TXN_OPS:
            raise ValueError(f"limit must be within 1..{MAX_TXN_OPS}, got {limit}")
        self._store, self._limit = store, limit
        # key -> (newest value, everyone waiting on it); insertion order is arrival order
        self._pending: dict[str, tuple[bytes, list[asyncio.Future[None]]]] = {}
        self._writer: asyncio.Task[None] | None = None
        self.commits = 0  # transactions written, for tests and benches

    async def put(self, key: str, value: bytes) -> None:
        """Return once ``key = value`` (or a later value of it) is committed; raise what
        the store raised for its batch."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        _, waiting = self._pending.get(key, (b"", []))
        self._pending[key] = (value, [*waiting, done])
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain(), name="group-commit")
        # a caller that gives up (its RPC's deadline) does not cancel the batch
        await asyncio.shield(done)

    async def _drain(self) -> None:
        while self._pending:
            keys = list(self._pending)[: self._limit]
            batch = {k: self._pending.pop(k) for k in keys}
            try:
                await self._store.txn([], [Put(k, v) for k, (v, _) in batch.items()])
            except asyncio.CancelledError:  # shutting down: nobody is left hanging
                _settle({**batch, **self._pending}, StoreUnavailable("shutting down"))
                self._pending.clear()
                raise
            except Exception as e:  # handed to every waiter of the batch
                _settle(batch, e)
            else:
                self.commits += 1
                _settle(batch, None)


def _settle(
    batch: dict[str, tuple[bytes, list[asyncio.Future[None]]]], error: Exception | None
) -> None:
    for _, waiting in batch.values():
        for f in waiting:
            if f.done():
                continue
            if error is None:
                f.set_result(None)
            else:
                f.set_exception(error)
