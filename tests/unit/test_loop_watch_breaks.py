"""A broken watch never stops the reconcile loop.

The loop watches intents and reports only to wake early (the tick re-reads
everything). Before, only StoreUnavailable was caught there: in CI a watch's first
write failed with gRPC core's INTERNAL "Internal error from Core" while its etcd member
was being killed, the StoreError left the watch task and took the whole control plane
down. Now any StoreError is logged and watched again, and the etcd adapter maps that
transport failure to StoreUnavailable (it carries no etcd answer at all).

A real loop on the in-memory store; the first watch breaks with a permanent-looking
error, a later write must still wake the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import pytest

from controlplane.cluster import Cluster
from controlplane.kernel.clock import FakeClock
from controlplane.kernel.keys import Keys
from controlplane.kernel.store.etcd_errors import translate
from controlplane.kernel.store.memory import MemoryStore
from controlplane.kernel.store.port import StoreError, StoreUnavailable, WatchEvent
from controlplane.loop import ReconcileLoop, _any_change
from controlplane.orchestrator import Orchestrator
from controlplane.prewarm import NoPrefixData
from tests.unit.test_loop_tick_duration import Leadership
from tests.unit.world import topology

TOPO = topology(loop_period_s=0.05)


class BreakingStore(MemoryStore):
    """The first ``breaks`` watches fail at once with ``error``."""

    def __init__(self, error: StoreError, breaks: int) -> None:
        super().__init__()
        self.error, self.breaks, self.watches = error, breaks, 0
        self.watching = asyncio.Event()  # set when a watch is up after the breaks

    async def watch_prefix(
        self, prefix: str, *, start_revision: int = 0
    ) -> AsyncIterator[WatchEvent]:
        self.watches += 1
        if self.watches <= self.breaks:
            raise self.error
        self.watching.set()
        async for ev in super().watch_prefix(prefix, start_revision=start_revision):
            yield ev


def reconcile_loop(store: MemoryStore) -> ReconcileLoop:
    keys, clock = Keys(TOPO.cluster), FakeClock()
    orchestrator = Orchestrator(Cluster(store, keys, TOPO, clock), list, NoPrefixData(), "cp-test")
    return ReconcileLoop(orchestrator, Leadership(True))


@pytest.mark.parametrize(
    "error",
    [StoreError("etcd watch: INTERNAL: something odd"), StoreUnavailable("etcd watch: gone")],
    ids=["permanent", "temporary"],
)
async def test_a_write_after_a_broken_watch_still_wakes_the_loop(
    error: StoreError, caplog: pytest.LogCaptureFixture
) -> None:
    store = BreakingStore(error, breaks=2)
    loop = reconcile_loop(store)
    keys = Keys(TOPO.cluster)
    task = asyncio.create_task(loop._wake_on(keys.intents_prefix(), _any_change))
    try:
        async with asyncio.timeout(5):
            await store.watching.wait()  # broken twice, watching a third time
        assert not task.done()  # the error did not leave the task
        loop.wake.clear()
        await store.put(keys.intent("i-1"), b"{}")
        async with asyncio.timeout(5):
            await loop.wake.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "broke" in r.message]
    # A temporary break is routine (etcd elections); a permanent one is worth a line.
    assert len(warned) == (2 if type(error) is StoreError else 0)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, "")


def test_grpc_cores_own_internal_error_is_temporary() -> None:
    err = translate(rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core"), "watch")
    assert type(err) is StoreUnavailable


def test_an_internal_error_with_etcds_own_words_stays_permanent() -> None:
    err = translate(rpc_error(grpc.StatusCode.INTERNAL, "etcdserver: corrupt cluster"), "put")
    assert type(err) is StoreError
    assert "corrupt cluster" in str(err)
