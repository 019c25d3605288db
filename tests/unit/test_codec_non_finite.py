"""What the control plane stores reads back, also with non-finite signals: a first-token
p99 that falls in the histogram's +Inf bucket is inf, and it travels in decisions and
health reports into etcd (an audit entry that did not decode was skipped by a drill's
measurements, which then missed a failover)."""

from __future__ import annotations

import json
import math

from controlplane.kernel.codec import decode, encode
from controlplane.kernel.model import AuditEntry, Decision, RegionState


def test_an_audit_entry_with_infinite_and_nan_signals_round_trips() -> None:
    signals = {"ttft_p99_s": math.inf, "error_rate": math.nan, "low": -math.inf, "ok": 0.5}
    decision = Decision(
        region="us-east",
        from_state=RegionState.NORMAL,
        to_state=RegionState.FAILING_OVER,
        trigger="health",
        reason="unhealthy",
        actor="cp-1",
        at=10.0,
        epoch=3,
        signals=signals,
    )
    entry = AuditEntry(
        at=10.0, actor="cp-1", action="transition", region="us-east", reason="r", decision=decision
    )
    raw = encode(entry)
    assert json.loads(raw)["decision"]["signals"]["ttft_p99_s"] == "Infinity"  # valid JSON
    back = decode(AuditEntry, raw, "k")
    assert back.decision is not None
    got = back.decision.signals
    assert got["ttft_p99_s"] == math.inf and got["low"] == -math.inf and got["ok"] == 0.5
    assert math.isnan(got["error_rate"])
