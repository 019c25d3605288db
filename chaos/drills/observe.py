"""What a drill sees: the system's own record in etcd and its own metrics.

Every sample reads the region records, health, routing and degradation steps the
control plane keeps in etcd (through the same snapshot reader the leader uses), the
data plane's ``/metrics`` (requests by status, first-byte latency histogram: the
gateways', or the endpoint pickers' behind Envoy, which serve the same names) and the
vLLM servers' ``/metrics`` (prefix-cache hits and queries). Rates and the p99 are
over the window since the previous sample, from counter and bucket deltas merged
across processes, as Prometheus would compute them; a restarted process (its
counters went back) counts from zero. After the drill, :func:`audit_since` reads what
the leader wrote to the audit log: transitions and ladder steps, with their times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from chaos.drills.result import LadderEvent, RegionSample, Sample, Transition
from controlplane.kernel.codec import CorruptValue, decode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import DegradationRecord
from controlplane.kernel.model import AuditAction, AuditEntry, FailoverStep, RegionRecord
from controlplane.kernel.pool.members import PoolMembers
from controlplane.kernel.pool.scale import ScaleRecord
from controlplane.kernel.snapshot_reader import read_snapshot
from controlplane.kernel.store.port import Store
from controlplane.kernel.vllm.metrics import parse_metrics
from controlplane.kernel.vllm.signals import (
    Histogram,
    ReplicaMetrics,
    ReplicaWindow,
    fold_windows,
    replica_window,
)

log = logging.getLogger("chaos.drills.observe")

# A data plane's series: the gateway's, or the same under the endpoint picker's prefix.
DATA_PLANES = ("tectonic_gateway_", "tectonic_picker_")
GW_REQUESTS = {p + "requests" for p in DATA_PLANES}  # the parser drops _total from names
GW_FIRST = {p + "first_token_seconds" for p in DATA_PLANES}
GW_VIOLATIONS = tuple(p + "consistency_violations_total " for p in DATA_PLANES)
GW_CONTINUED = "tectonic_gateway_stream_continuations_total{"  # outcome="continued" only


def gateway_metrics(text: str, at: float) -> ReplicaMetrics:
    """A gateway's cumulative figures in the shape the replica signals fold: requests
    and 5xx answers over every region, and the first-byte histogram merged."""
    requests = errors = 0.0
    buckets: dict[float, float] = defaultdict(float)
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name in GW_REQUESTS:
            for s in family.samples:
                if s.name.endswith("_total"):
                    requests += s.value
                    errors += s.value if s.labels.get("code", "")[:1] == "5" else 0.0
        elif family.name in GW_FIRST:
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    buckets[float(s.labels["le"])] += s.value
                elif s.name.endswith("_sum"):
                    total += s.value
    hist = None
    if math.inf in buckets:
        bounds = tuple(sorted(buckets))
        hist = Histogram(bounds=bounds, counts=tuple(buckets[b] for b in bounds), total=total)
    return ReplicaMetrics(at=at, ttft=hist, requests=requests, server_errors=errors)


class Observer:
    """Samples the system every call; keeps the previous scrape of each process."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        topology: Topology,
        gateways: Mapping[str, str],  # name -> data-plane process with gateway metrics
        replicas: Mapping[str, Sequence[str]],
        *,
        timeout_s: float = 1.0,
    ) -> None:
        self.store, self.keys, self.topology = store, keys, topology
        self.gateways = dict(gateways)
        self.replicas = {r: list(urls) for r, urls in replicas.items()}
        self.timeout_s = timeout_s
        self._prev: dict[str, ReplicaMetrics] = {}
        self._violations: dict[str, tuple[float, float]] = {}  # gateway: (first, last)
        self._continued: dict[str, tuple[float, float]] = {}  # gateway: (first, last)
        self._http: aiohttp.ClientSession | None = None

    @property
    def gateway_violations(self) -> float:
        """Growth of the gateways' own consistency-violation counters while sampled."""
        return _growth(self._violations)

    @property
    def streams_continued(self) -> float:
        """Streams the gateways continued elsewhere after their replica failed mid-way,
        while sampled."""
        return _growth(self._continued)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def sample(self, t: float, now: float, mono: float) -> Sample:
        """One sample at drill time ``t``; ``now`` is Unix time, ``mono`` monotonic."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        state, gw, vllm = await asyncio.gather(
            self._state(now), self._scrape_gateways(mono), self._scrape_replicas(mono)
        )
        leader, regions = state
        gw_signals = fold_windows(gw)
        hits = fold_windows(vllm).prefix_hit_rate
        requests = sum(int(w.requests or 0) for w in gw)
        errors = sum(int(w.server_errors or 0) for w in gw)
        return Sample(
            t=round(t, 3),
            leader=leader,
            regions=regions,
            requests=requests,
            errors=errors,
            error_rate=gw_signals.error_rate,
            first_token_p99_s=gw_signals.ttft_p99_s,
            prefix_hit_rate=hits,
        )

    async def _state(self, now: float) -> tuple[str, dict[str, RegionSample]]:
        try:
            snap = await read_snapshot(self.store, self.keys, self.topology, now)
            page = await self.store.get_prefix(self.keys.degradation_prefix())
            pools = await self._pools()
        except Exception as e:  # etcd down is something a drill must be able to watch
            log.info("cannot read the control plane's state from etcd: %s", e)
            return "", {}
        ladder: dict[str, tuple[str, ...]] = {}
        for kv in page.kvs:
            try:
                rec = decode(DegradationRecord, kv.value, kv.key)
            except CorruptValue:
                continue
            ladder[rec.region] = rec.applied
        regions = {
            name: RegionSample(
                state=view.record.state.value,
                health=view.health.verdict.value,
                routing=dict(view.effective_routing().targets),
                ladder_steps=ladder.get(name, ()),
                **pools.get(name, {}),
            )
            for name, view in snap.regions.items()
        }
        return snap.leader, regions

    async def _pools(self) -> dict[str, dict[str, int]]:
        """Per unit with a warm pool: its ACTIVE replicas (``pools/<r>``) and the
        leader's desired sizes (``scale/<r>``), what the scaler's criteria judge."""
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for kv in (await self.store.get_prefix(self.keys.pools_prefix())).kvs:
            with contextlib.suppress(CorruptValue):
                members = decode(PoolMembers, kv.value, kv.key)
                out[members.region]["active"] = len(members.active)
        for kv in (await self.store.get_prefix(self.keys.scale_prefix())).kvs:
            with contextlib.suppress(CorruptValue):
                rec = decode(ScaleRecord, kv.value, kv.key)
                out[rec.unit].update(desired_active=rec.active, desired_warm=rec.warm)
        return out

    async def _scrape(self, url: str) -> str | None:
        assert self._http is not None
        try:
            async with self._http.get(url + "/metrics") as r:
                return await r.text() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None  # a stopped server is what drills cause; it just counts nothing

    async def _windows(
        self, urls: Sequence[str], mono: float, gateway: bool
    ) -> list[ReplicaWindow]:
        texts = await asyncio.gather(*(self._scrape(u) for u in urls))
        out = []
        for url, text in zip(urls, texts, strict=True):
            if text is None:
                self._prev.pop(url, None)  # a restart counts from zero
                continue
            try:
                cur = gateway_metrics(text, mono) if gateway else parse_metrics(text, mono)[1]
            except (ValueError, KeyError):
                continue
            if gateway:
                self._count_violations(url, text)
            out.append(replica_window(self._prev.get(url), cur))
            self._prev[url] = cur
        return out

    def _count_violations(self, url: str, text: str) -> None:
        violations = continued = 0.0
        for line in text.splitlines():
            if line.startswith(GW_VIOLATIONS):
                violations += float(line.rsplit(" ", 1)[1])
            elif line.startswith(GW_CONTINUED) and 'outcome="continued"' in line:
                continued += float(line.rsplit(" ", 1)[1])
        for seen, value in ((self._violations, violations), (self._continued, continued)):
            first = seen.get(url, (value, value))[0]
            seen[url] = (min(first, value), value)

    async def _scrape_gateways(self, mono: float) -> list[ReplicaWindow]:
        return await self._windows(list(self.gateways.values()), mono, gateway=True)

    async def _scrape_replicas(self, mono: float) -> list[ReplicaWindow]:
        urls = [u for urls in self.replicas.values() for u in urls]
        return await self._windows(urls, mono, gateway=False)

    async def record(self, region: str) -> RegionRecord | None:
        kv = await self.store.get(self.keys.region_state(region))
        return None if kv is None else decode(RegionRecord, kv.value, kv.key)


def step_done(record: RegionRecord | None, step: str | None) -> bool:
    """The record's failover has recorded ``step`` done (any failover when None)."""
    if record is None:
        return False
    if step is None:
        return True
    return (
        record.failover is not None
        and FailoverStep("switch" if step == "routing" else step) in record.failover.done
    )


async def audit_since(
    store: Store, keys: Keys, started_at: float
) -> tuple[list[Transition], list[LadderEvent], list[AuditEntry]]:
    """The leader's audit entries written since ``started_at`` (Unix time): state
    transitions and ladder steps with drill times, and every entry as it was."""
    page = await store.get_prefix(keys.audit_prefix())
    entries = []
    for kv in page.kvs:
        try:
            entry = decode(AuditEntry, kv.value, kv.key)
        except CorruptValue as e:  # said out loud: a drill that misses one misjudges
            log.warning("audit entry %s does not decode, left out of the drill: %s", kv.key, e)
            continue
        if entry.at >= started_at:
            entries.append(entry)
    entries.sort(key=lambda e: e.at)
    transitions = [
        Transition(
            t=round(e.at - started_at, 3),
            region=e.region,
            from_state=e.decision.from_state.value,
            to_state=e.decision.to_state.value,
            reason=e.decision.reason,
        )
        for e in entries
        if e.action is AuditAction.TRANSITION and e.decision is not None
    ]
    ladder = [
        LadderEvent(
            t=round(e.at - started_at, 3),
            region=e.region,
            action=change,
            step=e.details.get("step", ""),
        )
        for e in entries
        if (change := e.action.ladder_change) is not None
    ]
    return transitions, ladder, entries


def _growth(seen: Mapping[str, tuple[float, float]]) -> float:
    return sum(max(0.0, last - first) for first, last in seen.values())
