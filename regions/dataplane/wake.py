"""Scale to zero, the data plane's part (docs/scaling.md, "Scale to zero"): a request
for a pool at zero wakes it and waits, bounded, for it to serve.

A pool is at zero when its agent publishes ``pools/<unit>`` with no ACTIVE replica and
``asleep`` (the leader asks it 0 ACTIVE). One with none and not asleep is down: its
requests spill to another region as before. A unit without a pool entry routes to the
topology's replicas and is never at zero.
The first request that finds it so writes ``wake/<unit>`` (``WakeRequest``): a plain put,
at most once per ``WAKE_REWRITE_S`` by this process, however many requests wait; the
leader's scaler reads it as demand and asks one ACTIVE replica, the agent wakes it and
publishes it, and the routing table (the pools watch) has it. Meanwhile the request is
held: up to the pool's measured wake p95 plus ``PATH_S`` (the leader's tick, the
agent's follow and the publication), else ``wake_hold_s``, at most
``wake_hold_max_s``. Served within the hold, it goes on as any request; not, it is
refused 503 with ``Retry-After`` the measured wake time (rounded up), never spilled to
another region: the pool is waking, not down. The gateway and the endpoint picker
answer the refusal each in its own terms. Whoever waits on the picker's answer (Envoy,
whose ext_proc ``message_timeout`` is far shorter than a wake) is told the hold's length
before it starts (``hold``'s ``on_hold``), so that it waits that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from controlplane.kernel.codec import encode
from controlplane.kernel.keys import Keys
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.pool.scale import WAKE_REWRITE_S, WakeRequest
from controlplane.kernel.store.port import Store, StoreError
from regions.dataplane.metrics import DataPlaneMetrics
from regions.dataplane.replicas import ReplicaBalancer

log = logging.getLogger("tectonic.gateway.wake")
PATH_S = 5.0  # beyond the wake itself: the leader's tick, the agent's follow, publishing
WRITE_TIMEOUT_S = 1.0  # a wake request that cannot be written within this is left


@dataclass(frozen=True, slots=True)
class Held:
    """A request held for its pool to wake: how long, and whether a replica serves now
    (False: refuse it 503 with ``retry_after_s``)."""

    waited_s: float
    served: bool
    retry_after_s: int


def hold_s(members: PoolMembers | None, default_s: float, most_s: float) -> float:
    """How long to hold a request for this pool: its measured wake p95 and the path to
    it, else the default; never more than ``most_s``."""
    p95 = members.activation_p95_s if members is not None else None
    return min(most_s, default_s if p95 is None else p95 + PATH_S)


def retry_after(members: PoolMembers | None, default_s: float) -> int:
    """Retry-After for a request refused while its pool wakes: the measured wake p95,
    else the default, in whole seconds (at least 1)."""
    p95 = members.activation_p95_s if members is not None else None
    return max(1, math.ceil(default_s if p95 is None else p95))


class Waker:
    """``hold(region)`` before routing a request: None when the region has a replica to
    route to (or is not pooled); else the wake, held (``Held``)."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        balancers: Mapping[str, ReplicaBalancer],
        pools: Callable[[], Mapping[str, PoolMembers]],
        metrics: DataPlaneMetrics,
        *,
        default_s: float,
        most_s: float,
        writer: Callable[[], str],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.keys, self.balancers, self.pools = store, keys, balancers, pools
        self.metrics = metrics
        self.default_s, self.most_s = default_s, most_s
        self.writer, self.wall_clock = writer, wall_clock
        self._written: dict[str, float] = {}  # unit -> monotonic time of our last write
        self._writing: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()  # replaced at each change: held requests look again

    def at_zero(self, region: str) -> PoolMembers | None:
        """The pool's members when it is at zero on purpose (its agent publishes it
        asleep) with no replica to route to; a pool with none and not asleep is down:
        its requests spill as before."""
        balancer = self.balancers.get(region)
        members = self.pools().get(region)
        if balancer is None or members is None or not members.asleep or balancer.replicas:
            return None
        return members

    async def hold(
        self, region: str, *, on_hold: Callable[[float], None] | None = None
    ) -> Held | None:
        """``on_hold``: called with the hold's length (seconds, at most ``most_s``) once
        the request is held, before it waits (the picker asks Envoy for the time)."""
        members = self.at_zero(region)
        if members is None:
            return None
        started = time.monotonic()
        self.metrics.wakes.labels(region).inc()
        self._ask(region)
        length = hold_s(members, self.default_s, self.most_s)
        if on_hold is not None:
            on_hold(length)
        deadline = started + length
        while not self._routable(region) and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()
        waited = time.monotonic() - started
        served = self._routable(region)
        self.metrics.wake_wait.labels(region, "served" if served else "refused").observe(waited)
        return Held(waited, served, retry_after(self.pools().get(region), self.default_s))

    def _routable(self, region: str) -> bool:
        balancer = self.balancers.get(region)
        return balancer is not None and bool(balancer.replicas)

    def changed(self) -> None:
        """A region's replicas changed (the pools watch): wake the held requests."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _ask(self, region: str) -> None:
        """Write ``wake/<region>`` unless this process did within ``WAKE_REWRITE_S`` or a
        write is under way: one write for a burst of requests, in the background (the
        request waits for a replica, not for etcd)."""
        now = time.monotonic()
        last = self._written.get(region)
        if (last is not None and now - last < WAKE_REWRITE_S) or region in self._writing:
            return
        self._written[region] = now
        task = asyncio.create_task(self._write(region), name=f"wake:{region}")
        self._writing[region] = task
        task.add_done_callback(lambda _: self._writing.pop(region, None))

    async def _write(self, region: str) -> None:
        request = WakeRequest(unit=region, at=self.wall_clock(), by=self.writer())
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await self.store.put(self.keys.wake(region), encode(request))
        except (StoreError, TimeoutError) as e:
            self._written.pop(region, None)  # the next request tries again
            log.warning("cannot ask the leader to wake %s: %s", region, e)
        else:
            log.info("%s is at zero: asked the leader to wake it (wake/%s)", region, region)
