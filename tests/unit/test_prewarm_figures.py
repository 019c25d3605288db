"""The typed pre-warm figures: stored with the keys the untyped dict had, so records
written before read back, and combined over targets as before."""

from __future__ import annotations

import json

from chaos.drills.measure import Observed, judge, last_prewarm
from chaos.drills.scenario import Measurements
from controlplane.agent_prewarm import _combine
from controlplane.kernel.codec import decode, encode
from controlplane.kernel.model import (
    AuditAction,
    AuditEntry,
    FailoverPlan,
    FailoverProgress,
    PrewarmFigures,
    RecoveryProgress,
)
from controlplane.metrics import prewarm_fraction

# A failover's figures as the untyped pre-warmer stored them.
OLD = {
    "budget_s": 30.0,
    "catalog_age_s": 4.5,
    "catalog_entries": 40.0,
    "elapsed_s": 2.25,
    "prefixes_total": 8.0,
    "prefixes_warmed": 6.0,
    "skipped_budget": 3.0,
    "skipped_kv": 0.0,
    "target.us-west.attained_fraction": 0.75,
    "targets": 1.0,
    "targets_unreachable": 1.0,
}
PLAN = FailoverPlan(source="us-east", targets={"us-west": 1.0}, reason="r", actor="cp")


def test_a_record_written_before_reads_back_with_the_same_keys() -> None:
    raw = json.dumps(
        {"plan": PLAN.model_dump(mode="json"), "started_at": 1.0, "prewarm_result": OLD}
    ).encode()
    fo = decode(FailoverProgress, raw)
    figs = fo.prewarm_result
    assert figs.prefixes_warmed == 6.0 and figs.targets_unreachable == 1.0
    assert figs.skipped == {"budget": 3.0, "kv": 0.0}
    assert figs.target_attained == {"us-west": 0.75}
    assert figs.verified is None and not figs.failed  # absent, not zero
    assert json.loads(encode(fo))["prewarm_result"] == OLD


def test_flags_are_stored_as_one_and_left_out_when_unset() -> None:
    figs = PrewarmFigures(failed=True, budget_s=30.0)
    assert figs.flat() == {"budget_s": 30.0, "failed": 1.0}
    assert decode(PrewarmFigures, encode(figs)) == figs
    assert PrewarmFigures().flat() == {}
    assert json.loads(encode(RecoveryProgress()))["prewarm_result"] == {}


def test_a_key_this_version_does_not_know_is_kept() -> None:
    figs = PrewarmFigures.model_validate({"prefixes_total": 2.0, "from_the_future": 7.0})
    assert figs.other == {"from_the_future": 7.0}
    assert figs.flat() == {"prefixes_total": 2.0, "from_the_future": 7.0}


def test_audit_details_read_back() -> None:
    figs = PrewarmFigures.model_validate(OLD)
    details = figs.details()
    assert list(details) == sorted(OLD) and details["prefixes_warmed"] == "6"
    assert PrewarmFigures.from_details({**details, "note": "not a number"}) == figs


def test_targets_combine_sums_slowest_and_weighted_rates() -> None:
    a = PrewarmFigures(
        targets=1.0,
        prefixes_total=10.0,
        prefixes_warmed=10.0,
        elapsed_s=2.0,
        verified=4.0,
        verified_hit_rate=1.0,
        skipped={"kv": 1.0},
        target_attained={"a": 1.0},
    )
    b = PrewarmFigures(
        targets=1.0,
        prefixes_total=10.0,
        prefixes_warmed=5.0,
        elapsed_s=3.0,
        verified=12.0,
        verified_hit_rate=0.5,
        skipped={"kv": 2.0, "budget": 1.0},
        target_attained={"b": 0.5},
    )
    down = PrewarmFigures(targets=1.0, targets_unreachable=1.0, prefixes_total=4.0)
    out = _combine([a, b, down])
    assert out.targets == 3.0 and out.targets_unreachable == 1.0
    assert out.prefixes_total == 24.0 and out.prefixes_warmed == 15.0
    assert out.attained_fraction == 15.0 / 24.0
    assert out.elapsed_s == 3.0 and out.verified == 16.0
    assert out.verified_hit_rate == (4.0 * 1.0 + 12.0 * 0.5) / 16.0
    assert out.skipped == {"kv": 3.0, "budget": 1.0}
    assert out.target_attained == {"a": 1.0, "b": 0.5}
    assert out.prefixes_failed is None  # no target reported it: absent, as before


def test_attainment_for_the_metric() -> None:
    assert prewarm_fraction(PrewarmFigures(prefixes_total=0, prefixes_warmed=0)) is None
    assert prewarm_fraction(PrewarmFigures(attained_fraction=1.2)) == 1.0
    assert prewarm_fraction(PrewarmFigures(prefixes_total=4.0, prefixes_warmed=1.0)) == 0.25


def test_the_drills_read_the_last_prewarm_entry_typed() -> None:
    def entry(region: str, **figs: float) -> AuditEntry:
        details = PrewarmFigures.model_validate(figs).details()
        return AuditEntry(
            at=1.0, actor="cp", action=AuditAction.PREWARM, region=region, details=details
        )

    entries = [
        entry("a", prefixes_total=4.0, prefixes_warmed=1.0),
        entry("b", prefixes_total=9.0),
        entry("a", prefixes_total=4.0, prefixes_warmed=4.0, attained_fraction=1.0, elapsed_s=2.0),
    ]
    pre = last_prewarm(entries, "a")
    assert pre is not None and pre.prefixes_warmed == 4.0 and pre.attained_fraction == 1.0
    assert last_prewarm(entries, "c") is None
    [ok] = [
        c
        for c in judge(Measurements(prewarm_attainment=0.9), _observed(pre))
        if c.name == "prewarm_attainment"
    ]
    assert ok.passed and ok.measured == "100% in 2.00s (4 of 4 prefixes)"
    [none] = [
        c
        for c in judge(Measurements(prewarm_attainment=0.9), _observed(None))
        if c.name == "prewarm_attainment"
    ]
    assert not none.passed and none.measured == "no pre-warm recorded"


def _observed(pre: PrewarmFigures | None) -> Observed:
    return Observed(
        region="a", fault_t=None, samples=(), transitions=(), ladder=(), sessions=(), prewarm=pre
    )
