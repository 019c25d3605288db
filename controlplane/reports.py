"""Health reports: validated at the edge, stored one key per (region, observer)."""

from __future__ import annotations

import math
import re

from controlplane.kernel.capacity.record import MAX_ENGINE_VERSION
from controlplane.kernel.capacity.serving import MAX_FINGERPRINT
from controlplane.kernel.codec import encode
from controlplane.kernel.config import Topology
from controlplane.kernel.keys import Keys
from controlplane.kernel.model import Health, HealthReport, ObserverKind
from controlplane.kernel.store.group_commit import GroupCommit

OBSERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._@-]{0,127}$")
MAX_SIGNALS = 64
MAX_DETAIL = 1024
PROBE_OBSERVER = "probe:controlplane"  # one vantage point, whichever replica leads


class BadReport(ValueError):
    """The report is malformed; nothing was stored."""


def validate_report(
    topology: Topology,
    *,
    region: str,
    observer: str,
    kind: ObserverKind,
    health: Health,
    signals: dict[str, float],
    detail: str,
    now: float,
    engine_version: str = "",
    serving_config: str = "",
) -> HealthReport:
    try:
        topology.region(region)  # a dict lookup: every report of every agent passes here
    except KeyError:
        raise BadReport(
            f"unknown region {region!r}; known regions: {list(topology.names)}"
        ) from None
    if not OBSERVER_NAME.match(observer):
        raise BadReport(
            "observer must be 1-128 characters of letters, digits and ':._@-', "
            f"starting with a letter or digit; got {observer[:40]!r}"
        )
    if health is Health.UNKNOWN:
        raise BadReport("health must be HEALTHY, DEGRADED or UNHEALTHY; omit the report instead")
    if len(signals) > MAX_SIGNALS:
        raise BadReport(f"at most {MAX_SIGNALS} signals per report, got {len(signals)}")
    if any(len(k) > 64 for k in signals):
        raise BadReport("signal names are at most 64 characters")
    if bad := sorted(k for k, v in signals.items() if not math.isfinite(v)):
        # JSON has no NaN: stored, it would read back as null and void the whole report.
        raise BadReport(f"signal values must be finite numbers; not: {bad[:8]}")
    if len(detail) > MAX_DETAIL:
        raise BadReport(f"detail is at most {MAX_DETAIL} characters, got {len(detail)}")
    if len(engine_version) > MAX_ENGINE_VERSION or not engine_version.isprintable():
        raise BadReport(
            f"engine_version is at most {MAX_ENGINE_VERSION} printable characters "
            f"(vLLM's /version), got {engine_version[:40]!r}"
        )
    if len(serving_config) > MAX_FINGERPRINT or not serving_config.isprintable():
        raise BadReport(
            f"serving_config is at most {MAX_FINGERPRINT} printable characters, "
            f"got {serving_config[:40]!r}"
        )
    return HealthReport(
        region=region,
        observer=observer,
        kind=kind,
        health=health,
        signals=dict(signals),
        received_at=now,
        detail=detail,
        engine_version=engine_version,
        serving_config=serving_config,
    )


async def store_report(writes: GroupCommit, keys: Keys, report: HealthReport) -> None:
    """An observation, not a decision: a plain put (latest wins), no fence needed; it
    joins the other agents' reports in one commit (kernel/store/group_commit.py)."""
    await writes.put(keys.report(report.region, report.observer), encode(report))
