"""The gateway's view of ``degradation/<r>``: what each region's ladder has switched off.

The gateway's actuators (``actuators.py``: context cap, ``parallel_tool_calls`` off,
priority shedding) read the flags of the region a request is served by, on every
request, so the flags are a local copy like routing's
(:class:`controlplane.kernel.watched.WatchedPrefix`: one read, then one watch; fail-static
when etcd is lost). No record means nothing is degraded, so start-up need not wait for
the first read: until it lands, every region runs with all features on.

Records are taken in etcd's revision order; the leader's writes are fenced by its
lease, so a later revision is the newer record.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from controlplane.kernel.keys import Keys
from controlplane.kernel.ladder.record import DegradationRecord, FeatureFlags
from controlplane.kernel.store.port import Store
from controlplane.kernel.watched import WatchedPrefix

log = logging.getLogger("tectonic.gateway.degradation")
NOT_DEGRADED = FeatureFlags()


class DegradationCache(WatchedPrefix[DegradationRecord]):
    """``records`` is replaced, never mutated."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        *,
        retry_s: float = 0.2,
        max_retry_s: float = 2.0,
        resync_s: float = 30.0,
    ) -> None:
        super().__init__(
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

    @property
    def records(self) -> Mapping[str, DegradationRecord]:
        return self.values

    def flags(self, region: str) -> FeatureFlags:
        """The region's effective flags; the defaults (nothing degraded) without a record."""
        record = self.values.get(region)
        return NOT_DEGRADED if record is None else record.flags

    def _changed(self, region: str, record: DegradationRecord | None) -> None:
        if record is None:
            log.info("degradation/%s deleted: %s runs with every feature on", region, region)
            return
        changed = record.flags.model_dump(exclude_defaults=True)
        log.warning(
            "degradation/%s epoch %d: steps [%s], flags %s (%s)",
            region,
            record.epoch,
            ", ".join(record.applied) or "none",
            changed or "all on",
            record.reason or "no reason given",
        )
