"""The leader walks each region's degradation ladder once per reconcile tick.

For every region: the mode from its state (DEGRADED or a failover target short of
headroom: degrading; FAILING_OVER: frozen; otherwise recovering), its signals (the
folded health's, plus ``headroom_fraction``), the current ``degradation/<region>``
record, and the pure :func:`controlplane.core.ladder_executor.next_ladder_action`. A
change is written in one transaction: fenced by leadership, compare-and-set on the
record's revision, with its audit entry. Level-triggered like the rest of the loop,
so a new leader simply carries on from what etcd holds. The gateways and agents
watch ``degradation/`` and carry the flags out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from controlplane.core.ladder_executor import (
    LadderAction,
    LadderMode,
    mode_for,
    next_ladder_action,
)
from controlplane.kernel.audit import AuditLog
from controlplane.kernel.codec import CorruptValue, decode, encode
from controlplane.kernel.config import Topology
from controlplane.kernel.degradation import DegradationRecord
from controlplane.kernel.details import json_list
from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder import Ladder, with_headroom
from controlplane.kernel.model import AuditAction, AuditEntry, RegionState
from controlplane.kernel.snapshot import Snapshot
from controlplane.kernel.store.port import Compare, Put, Store

log = logging.getLogger("tectonic.ladder")
Fence = Callable[[], Sequence[Compare]]  # raises NotLeader when not leading


class LadderRunner:
    def __init__(
        self,
        store: Store,
        keys: Keys,
        topology: Topology,
        ladder: Ladder,
        fence: Fence,
        actor: str,
    ) -> None:
        self.store, self.keys, self.topology, self.ladder = store, keys, topology, ladder
        self.fence, self.actor = fence, actor
        self.audit = AuditLog(keys, actor)
        self._held: dict[str, str] = {}  # last hold reason logged, per region

    async def tick(self, snap: Snapshot) -> list[LadderAction]:
        """One step of every region's ladder; returns the changes written. Nothing
        while operators have paused automation: the steps stay as they are."""
        if snap.control.paused:
            if self._held.get("") != snap.control.reason:
                log.warning("ladder paused with automation: %s", snap.control.reason)
                self._held[""] = snap.control.reason
            return []
        self._held.pop("", None)
        page = await self.store.get_prefix(self.keys.degradation_prefix())
        current: dict[str, tuple[DegradationRecord, int]] = {}
        for kv in page.kvs:
            try:
                rec = decode(DegradationRecord, kv.value, kv.key)
            except CorruptValue as e:
                log.error("%s; the region's ladder waits until it is rewritten", e)
                continue
            current[rec.region] = (rec, kv.mod_revision)
        short = _short_of_headroom(snap)
        written = []
        for region in self.topology.regions:
            view = snap.regions.get(region.name)
            if view is None:
                continue
            mode = mode_for(view.record.state, short_of_headroom=region.name in short)
            if region.name not in current and mode is not LadderMode.DEGRADING:
                continue  # nothing applied and nothing to apply: no record needed
            record, rev = current.get(region.name, (DegradationRecord(region=region.name), 0))
            signals = with_headroom(view.health.signals, region.capacity_rps)
            action = next_ladder_action(self.ladder, record, signals, mode, snap.now)
            if not action.changed:
                self._log_hold(region.name, action)
                continue
            if await self._write(region.name, action, rev, snap.now):
                written.append(action)
        return written

    async def _write(self, region: str, action: LadderAction, rev: int, now: float) -> bool:
        key = self.keys.degradation(region)
        entry = AuditEntry(
            at=now,
            actor=self.actor,
            action=AuditAction.of_ladder(action.kind.value),
            region=region,
            reason=action.reason,
            details={"step": action.step or "", "applied": json_list(action.record.applied)},
        )
        cas = Compare.mod_revision(key, rev) if rev else Compare.absent(key)
        ok = (
            await self.store.txn(
                [*self.fence(), cas], [Put(key, encode(action.record)), self.audit.op(entry)]
            )
        ).succeeded
        if ok:
            log.warning(
                "%s: ladder %s %s (%s)", region, action.kind.value, action.step, action.reason
            )
        else:
            log.info("%s: ladder change not written (leadership or record changed)", region)
        return ok

    def _log_hold(self, region: str, action: LadderAction) -> None:
        if action.kind.value == "hold" and self._held.get(region) != action.reason:
            log.info("%s: ladder holds: %s", region, action.reason)
        self._held[region] = action.reason


def _short_of_headroom(snap: Snapshot) -> set[str]:
    """Targets of running failovers whose plan said they cannot absorb the load."""
    out: set[str] = set()
    for view in snap.regions.values():
        fo = view.record.failover
        if view.record.state is RegionState.FAILING_OVER and fo and fo.plan.headroom_short:
            out.update(fo.plan.targets)
    return out
