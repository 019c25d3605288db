"""Admission control's per-replica bound from the measured capacity: a local copy of
``capacity/<region>`` (one read, then one watch, like routing's) and, whenever a record
changes and every ``recheck_s`` (a record turns stale with no write), each region's
bound handed to its admission gate.

A region's bound is :func:`regions.dataplane.admission_bound.inflight_bound` of its
record, at the lowest hit rate probed (this process does not know the hit rate the
region serves now; cold is what a failover's moved traffic has), unless the record is
stale by the topology's ``capacity`` policy (``capacity_record.resolve``'s rule: too old,
or of another engine or serving configuration than the region runs now), or has no
in-flight figures (probed before they were recorded): then no bound, and a log line
says why. ``--admission-max-inflight`` overrides all of it (then nothing is watched).

The engine a region runs, and its serving configuration, are the leader's
``regions/<r>/health`` (its agents' reports of vLLM's ``/version`` and configuration),
read at each recheck rather than watched: the leader rewrites it every probe interval,
and an engine changes only with a rollout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from controlplane.kernel.capacity.record import CapacityRecord, CapacitySource, resolve
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import RegionHealth
from controlplane.kernel.store.port import Store, StoreError
from controlplane.kernel.watched import WatchedPrefix
from regions.dataplane.admission_bound import BoundAt, InflightBound, inflight_bound
from regions.dataplane.admission_gate import AdmissionGates

log = logging.getLogger("tectonic.gateway.capacity")
RECHECK_S = 60.0


def region_bound(
    region: str,
    record: CapacityRecord | None,
    topology: Topology,
    now: float,
    at: BoundAt = BoundAt.ULTIMATE,
    engine_version: str = "",
    serving_config: str = "",
) -> InflightBound | str:
    """The bound for ``region``'s replicas now, running ``engine_version`` with
    ``serving_config`` (its fingerprint; "" unknown: not judged), or why there is none.
    Pure."""
    if record is None:
        return "no capacity record"
    bearing = resolve(
        region,
        record,
        capacity_rps=topology.region(region).capacity_rps,
        policy=topology.capacity,
        now=now,
        active_replicas=None,
        engine_version=engine_version,
        serving_config=serving_config,
    )
    if bearing.source is not CapacitySource.MEASURED:
        return f"the capacity record is stale: {bearing.reason}"
    return inflight_bound(record, at=at)


class CapacityBounds(WatchedPrefix[CapacityRecord]):
    def __init__(
        self,
        store: Store,
        keys: Keys,
        topology: Topology,
        gates: AdmissionGates,
        *,
        at: BoundAt = BoundAt.ULTIMATE,
        wall: Callable[[], float] = time.time,
        recheck_s: float = RECHECK_S,
    ) -> None:
        super().__init__(
            store,
            keys,
            keys.capacity_prefix(),
            CapacityRecord,
            self._changed,
            log=log,
            what="capacity",
        )
        self._topology, self._gates, self._at, self._wall = topology, gates, at, wall
        self.recheck_s = recheck_s
        self._said: dict[str, InflightBound | str] = {}
        self.engines: dict[str, str] = {}  # region -> the engine it runs, as last read
        self.serving: dict[str, str] = {}  # region -> its serving config's fingerprint

    def _changed(self, region: str, record: CapacityRecord | None) -> None:
        self.apply_bound(region, record)

    def apply_bound(self, region: str, record: CapacityRecord | None) -> None:
        """Hand ``region``'s gate its bound; log when it changes."""
        if region not in self._topology.names:
            return
        engine, serving = self.engines.get(region, ""), self.serving.get(region, "")
        bound = region_bound(
            region, record, self._topology, self._wall(), self._at, engine, serving
        )
        limit = bound.limit if isinstance(bound, InflightBound) else None
        self._gates.set_max_inflight(region, limit)
        if self._said.get(region) != bound:
            self._said[region] = bound
            if isinstance(bound, InflightBound):
                log.info("region %s admission bound: %s", region, bound.describe())
            else:
                log.info("region %s admission limit unbounded: %s", region, bound)

    def recheck(self) -> None:
        for region in self._topology.names:
            self.apply_bound(region, self.values.get(region))

    async def read_engines(self) -> None:
        """Each region's engine from ``regions/<r>/health``; what cannot be read now
        (etcd away, a value not decodable) keeps what was last read."""
        try:
            page = await self._store.get_prefix(self._keys.regions_prefix())
        except StoreError as e:
            log.debug("region engines not read (%s): keeping the last read", e)
            return
        by_key = {kv.key: kv.value for kv in page.kvs}
        for region in self._topology.names:
            raw = by_key.get(self._keys.region_health(region))
            if raw is None:
                continue
            try:
                health = decode(RegionHealth, raw)
            except CorruptValue as e:
                log.warning("region %s engine not read: %s", region, e)
                continue
            self.engines[region] = health.engine_version
            self.serving[region] = health.serving_config

    async def rechecks(self) -> None:
        """After the first read (every region's starting bound, logged), every
        ``recheck_s`` until cancelled: a record ages into staleness unwritten, and a
        region's engine changes under it."""
        await self.loaded.wait()
        while True:
            await self.read_engines()
            self.recheck()
            await asyncio.sleep(self.recheck_s)
